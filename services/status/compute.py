"""``compute_pod_status``: desired pod + PLEG record + previous status -> PodStatus. Pure.

Follows the kubelet's ``generateAPIPodStatus`` / ``getPhase`` and the condition generators
(``pkg/kubelet/status/generate.go``): see docs/ARCHITECTURE.md "Status" for where podvisor
differs. A terminal phase (Succeeded, Failed) never goes back; ``lastTransitionTime`` is kept
while a condition's status is unchanged; the value's ``version`` bumps only when something
changed. Reads the typed pod (``services.pod.Pod``) and returns the typed status
(``PodStatusValue``: ``ipc/podstatus.py``'s ``PodStatus``, its version and its pod).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from podvisor.common.timefmt import rfc3339
from podvisor.ipc.maps import (
    NODE_SHUTDOWN_REASON,
    DesiredPod,
    PlegContainer,
    PlegPod,
    PlegSandbox,
    PodRef,
    PodResize,
    PodStatusValue,
)
from podvisor.ipc.podstatus import ContainerState, ContainerStatus, PodStatus, Terminated
from podvisor.services.pod import Container, Pod, PodSpec
from podvisor.services.status.conditions import (
    DISRUPTION_TARGET,
    EVICTED,
    TERMINATION_BY_KUBELET,
    condition,
    external_conditions,
    kubelet_conditions,
    resize_conditions,
    stamp,
)
from podvisor.services.status.containers import EXITED, by_name, container_status
from podvisor.services.status.containers import RUNNING as RUNNING_STATE

PENDING, RUNNING, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"
TERMINAL = (SUCCEEDED, FAILED)
# the kubelet's status manager TerminatePod: a finished pod's container it could not find
STATUS_UNKNOWN = "ContainerStatusUnknown"
NOT_LOCATED = "The container could not be located when the pod was terminated"
CONDITION_TYPES = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                   "PodScheduled")
# The fields of a ``DesiredPod`` that ``compute_pod_status`` reads: a change of any other
# (the sync loop's ``sandbox_id``, ``updated_at``, ``worker``, ...) cannot change the status.
# (``pod`` is read through the typed ``Pod`` rebuilt from it.)
DESIRED_KEYS = ("pod", "admitted", "reason", "message", "waiting", "qos_class", "failed",
                "resize")


def desired_inputs(entry: Any) -> Any:
    """What of a ``desired`` entry a status depends on (equal inputs: equal statuses)."""
    if not isinstance(entry, DesiredPod):
        return entry
    return tuple(getattr(entry, key) for key in DESIRED_KEYS)


def _init_done(init_specs: Sequence[Container],
               records: Mapping[str, list[PlegContainer]],
               statuses: Sequence[ContainerStatus] = ()) -> list[str]:
    """Names of init containers not done: a regular one that has not yet exited 0 (newest
    run), a sidecar that has not started (running, its startup probe passed)."""
    started = {cs.name for cs in statuses if cs.started}
    pending = []
    for spec in init_specs:
        if spec.sidecar:
            if spec.name not in started:
                pending.append(spec.name)
            continue
        runs = sorted(records.get(spec.name, []), key=lambda c: (c.created_at, c.id))
        if not runs or runs[-1].state != EXITED or runs[-1].exit_code:
            pending.append(spec.name)
    return pending


def get_phase(policy: str, init: Sequence[ContainerStatus],
              regular: Sequence[ContainerStatus], sidecars: Collection[str] = ()) -> str:
    """The kubelet's ``getPhase`` over API container statuses (``policy``: the pod's
    restartPolicy; static pods: never terminal by deletion). ``sidecars``: the names of the
    restartable init containers: a running one counts as running (not yet started: pending
    until a regular container ran), a stopped one not at all."""
    pending_init = failed_init = pending_sidecars = sidecars_running = sidecars_waiting = 0
    for cs in init:
        st, last = cs.state, cs.last_state
        if cs.name in sidecars:
            if st.running is not None:
                sidecars_running += 1
                pending_sidecars += int(not cs.started)
            elif st.terminated is None and last.terminated is None:
                pending_sidecars += 1
                sidecars_waiting += 1
            continue
        if st.running is not None:
            pending_init += 1
        elif st.terminated is not None:
            failed_init += int(st.terminated.exit_code != 0)
        elif last.terminated is not None:
            failed_init += int(last.terminated.exit_code != 0)
        else:
            pending_init += 1
    running = waiting = stopped = succeeded = 0
    for cs in regular:
        st = cs.state
        if st.running is not None:
            running += 1
        elif st.terminated is not None:
            stopped += 1
            succeeded += int(st.terminated.exit_code == 0)
        elif cs.last_state.terminated is not None:
            stopped += 1
        else:
            waiting += 1
    any_started = any(cs.container_id for cs in regular)
    if failed_init and policy == "Never":
        return FAILED
    if (pending_init and not any_started) or (pending_sidecars and not any_started) or \
            waiting or sidecars_waiting:
        return PENDING
    if running or sidecars_running:
        return RUNNING
    if stopped:
        if policy == "Always":
            return RUNNING
        if stopped == succeeded:
            return SUCCEEDED
        return FAILED if policy == "Never" else RUNNING
    return PENDING


def pod_ips(host_network: bool, sandboxes: Sequence[PlegSandbox],
            host_ips: Sequence[str]) -> list[str]:
    """The kubelet's pod IPs: a hostNetwork pod has the host's (one per family); another pod
    those its newest sandbox reports (PodSandboxStatus ``network.ip`` then ``additional_ips``;
    none yet while it has no sandbox or no network)."""
    if host_network:
        return list(host_ips)
    first = sandboxes[-1].ip if sandboxes else ""
    if not first:
        return []
    return [first, *(ip for ip in sandboxes[-1].additional_ips if ip != first)]


def compute_pod_status(
    desired: DesiredPod,
    pod: Pod,
    pleg: PlegPod | None,
    previous: PodStatusValue | None,
    now: float,
    runtime: str = "embedded",
    host_ips: Sequence[str] = ("127.0.0.1",),
    readiness: Mapping[str, bool] | None = None,
    started: Mapping[str, bool] | None = None,
) -> PodStatusValue:
    """The status of one pod. ``desired`` is the ``desired`` map entry and ``pod`` its typed
    pod (``pod_from_wire(desired.pod)``), ``pleg`` the pod's ``pleg`` map record (None: no
    runtime objects), ``previous`` the last status computed (or None), ``now`` wall-clock
    seconds, ``host_ips`` the node's addresses (``hostIP`` is the first), ``readiness`` /
    ``started`` the prober's verdicts by container name."""
    host_ip, hosts = host_ips[0], tuple(host_ips)
    before = previous.status if previous is not None else None
    prev_phase = before.phase if before is not None else None
    start = (before.start_time if before is not None else None) or rfc3339(now)
    ref = PodRef(pod.name, pod.namespace, pod.uid)
    if not desired.admitted:
        rejected = PodStatus(
            phase=FAILED, host_ip=host_ip, host_ips=hosts, start_time=start,
            qos_class=desired.qos_class, reason=desired.reason or "Rejected",
            message=f"Pod was rejected: {desired.message}",  # the kubelet's rejectPod
            conditions=stamp([condition("PodScheduled", True)], before, now))
        return with_version(rejected, ref, previous)
    spec = pod.spec
    records = by_name(pleg.containers if pleg is not None else ())
    sandboxes = pleg.sandboxes if pleg is not None else ()
    ready_sb = [s for s in sandboxes if s.state == "SANDBOX_READY"]
    waiting = desired.waiting
    ready, started = readiness or {}, started or {}
    init = [with_resources(_init_status(c, records, waiting, runtime, ready, started),
                           desired.resize) for c in spec.init_containers]
    init_pending = _init_done(spec.init_containers, records, init)
    if any(records.get(c.name) for c in spec.containers):
        init_pending = []  # the kubelet: regular containers ran, so the pod was initialized
    default = "PodInitializing" if init_pending else "ContainerCreating"
    regular = [with_resources(container_status(
        c, records.get(c.name, []), waiting.get(c.name), default, runtime, ready.get(c.name),
        started.get(c.name)), desired.resize) for c in spec.containers]
    ephemeral = [container_status(e.container, records.get(e.name, []), waiting.get(e.name),
                                  "ContainerCreating", runtime, False)
                 for e in spec.ephemeral_containers]
    phase = get_phase(str(spec.restart_policy), init, regular,
                      {c.name for c in spec.sidecars})
    if desired.failed:  # failed for good (SyncLoop.fail_pod: activeDeadlineSeconds, FailPod)
        phase = FAILED
    if prev_phase in TERMINAL:
        phase = str(prev_phase)
    ips = pod_ips(spec.host_network, ready_sb or sandboxes, hosts)
    if prev_phase in TERMINAL and before is not None:
        # a terminal pod's containers and sandbox may be removed (the eviction manager's
        # reclaim: container GC of terminated pods): it keeps what it last reported
        init = _kept(init, before.init_container_statuses, records)
        regular = _kept(regular, before.container_statuses, records)
        if not sandboxes and before.pod_ips:
            ips = list(before.pod_ips)
    if phase in TERMINAL and not any(c.state == RUNNING_STATE for cs in records.values()
                                     for c in cs):
        init, regular = terminate_statuses(spec, init, regular, before)
    external = external_conditions(pod.status)
    sidecars = [cs for c, cs in zip(spec.init_containers, init, strict=True) if c.sidecar]
    own = kubelet_conditions(phase, bool(ready_sb), init_pending, [*sidecars, *regular],
                             spec.readiness_gates, external)
    own.extend(resize_conditions(desired.resize))
    if desired.failed and desired.reason in (EVICTED, NODE_SHUTDOWN_REASON):
        # the kubelet's eviction manager and node shutdown manager: DisruptionTarget, reason
        # TerminationByKubelet
        external = [c for c in external if c.type != DISRUPTION_TARGET]
        own.append(condition(DISRUPTION_TARGET, True, TERMINATION_BY_KUBELET, desired.message))
    status = PodStatus(
        phase=phase, host_ip=host_ip, host_ips=hosts, start_time=start,
        qos_class=desired.qos_class,  # the sync loop's QoS class of the pod (pod/qos.py)
        reason=desired.reason if desired.reason else None,
        message=desired.message if desired.reason else None,
        pod_ip=ips[0] if ips else "", pod_ips=tuple(ips), container_statuses=tuple(regular),
        init_container_statuses=tuple(init), ephemeral_container_statuses=tuple(ephemeral),
        conditions=(*external, *stamp(own, before, now)))
    return with_version(status, ref, previous)


def with_resources(cs: ContainerStatus, resize: PodResize) -> ContainerStatus:
    """The kubelet's (1.33) ``allocatedResources`` (the allocated requests) and ``resources``
    (a running container's actual requests and limits, else its allocation) of a container a
    resize may change (regular, sidecar), from ``DesiredPod.resize``."""
    allocated = resize.allocated.get(cs.name)
    if allocated is None:
        return cs
    actual = resize.actual.get(cs.name)
    now = actual if actual is not None and cs.state.running is not None else allocated
    return replace(cs, allocated_resources=dict(allocated.get("requests", {})),
                   resources={k: dict(v) for k, v in now.items() if v})


def _kept(now: list[ContainerStatus], before: Sequence[ContainerStatus],
          records: Mapping[str, list[PlegContainer]]) -> list[ContainerStatus]:
    """Each status of a container the runtime no longer holds: its previous one."""
    prev = {cs.name: cs for cs in before}
    return [prev.get(cs.name, cs) if not records.get(cs.name) else cs for cs in now]


def terminate_statuses(spec: PodSpec, init: list[ContainerStatus],
                       regular: list[ContainerStatus], before: PodStatus | None = None
                       ) -> tuple[list[ContainerStatus], list[ContainerStatus]]:
    """The kubelet's status manager ``TerminatePod``, once a terminal pod runs nothing: a
    container status that is not terminated (its container never started, or was removed
    before its exit was seen) is reported terminated, ``ContainerStatusUnknown``, exit code
    137, so no container of a finished pod reads as waiting or running. Regular containers
    only once the pod initialized (``hasPodInitialized``, by these statuses or the ones
    ``before``); init containers up to the last one that left waiting
    (``initializedContainers``), the first at least."""
    if _initialized(spec, init, regular) or (before is not None and _initialized(
            spec, before.init_container_statuses, before.container_statuses)):
        regular = [_unknown(cs) for cs in regular]
    tried = next((i + 1 for i in range(len(init) - 1, -1, -1)
                  if init[i].state.waiting is None or init[i].last_state.terminated is not None),
                 min(len(init), 1))
    return [_unknown(cs) if i < tried else cs for i, cs in enumerate(init)], regular


def _initialized(spec: PodSpec, init: Sequence[ContainerStatus],
                 regular: Sequence[ContainerStatus]) -> bool:
    """The kubelet's ``hasPodInitialized``: no init containers, a regular container that left
    waiting, or the last init container done (a sidecar: running and started)."""
    if not spec.init_containers:
        return True
    if any(cs.state.waiting is None or cs.last_state.terminated is not None for cs in regular):
        return True
    if not init:
        return False
    last = init[-1]
    if spec.init_containers[-1].sidecar:
        return last.state.running is not None and last.started
    return any(t is not None and t.exit_code == 0
               for t in (last.last_state.terminated, last.state.terminated))


def _unknown(cs: ContainerStatus) -> ContainerStatus:
    if cs.state.terminated is not None:
        return cs
    return replace(cs, ready=False, started=False, state=ContainerState(terminated=Terminated(
        exit_code=137, reason=STATUS_UNKNOWN, message=NOT_LOCATED)))


def _init_status(c: Container, records: Mapping[str, list[PlegContainer]],
                 waiting: Mapping[str, Any], runtime: str, ready: Mapping[str, bool],
                 started: Mapping[str, bool]) -> ContainerStatus:
    """An init container's status: a sidecar is ready and started as a regular container (its
    probes); a regular one is ready once it exited 0 (the prober's ``UpdatePodStatus``)."""
    if c.sidecar:
        return container_status(c, records.get(c.name, []), waiting.get(c.name),
                                "PodInitializing", runtime, ready.get(c.name),
                                started.get(c.name))
    cs = container_status(c, records.get(c.name, []), waiting.get(c.name), "PodInitializing",
                          runtime, False)
    done = cs.state.terminated is not None and cs.state.terminated.exit_code == 0
    return replace(cs, ready=done) if done else cs


def with_version(status: PodStatus, pod: PodRef,
                 previous: PodStatusValue | None) -> PodStatusValue:
    """The value of ``status``: the previous version when nothing changed, else one more."""
    if previous is None:
        return PodStatusValue(status, 1, pod)
    if previous.status == status and previous.pod == pod:
        return previous
    return PodStatusValue(status, previous.version + 1, pod)
