"""``compute_pod_status``: desired pod + PLEG record + previous status -> PodStatus. Pure.

Follows the kubelet's ``generateAPIPodStatus`` / ``getPhase`` and the condition generators
(``pkg/kubelet/status/generate.go``): see docs/ARCHITECTURE.md "Status" for where podvisor
differs. A terminal phase (Succeeded, Failed) never goes back; ``lastTransitionTime`` is kept
while a condition's status is unchanged; the value's ``version`` bumps only when something
changed. Reads the typed pod (``services.pod.Pod``) and returns the typed status
(``PodStatusValue``: ``ipc/podstatus.py``'s ``PodStatus``, its version and its pod).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from podvisor.common.timefmt import rfc3339
from podvisor.ipc.maps import (
    DesiredPod,
    PlegContainer,
    PlegPod,
    PlegSandbox,
    PodRef,
    PodStatusValue,
)
from podvisor.ipc.podstatus import ContainerStatus, PodCondition, PodStatus
from podvisor.services.pod import Container, Pod
from podvisor.services.status.containers import EXITED, by_name, container_status

PENDING, RUNNING, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"
TERMINAL = (SUCCEEDED, FAILED)
CONDITION_TYPES = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                   "PodScheduled")
# The fields of a ``DesiredPod`` that ``compute_pod_status`` reads: a change of any other
# (the sync loop's ``sandbox_id``, ``updated_at``, ``worker``, ...) cannot change the status.
# (``pod`` is read through the typed ``Pod`` rebuilt from it.)
DESIRED_KEYS = ("pod", "admitted", "reason", "message", "waiting", "qos_class")


def desired_inputs(entry: Any) -> Any:
    """What of a ``desired`` entry a status depends on (equal inputs: equal statuses)."""
    if not isinstance(entry, DesiredPod):
        return entry
    return tuple(getattr(entry, key) for key in DESIRED_KEYS)


def _init_done(init_specs: Sequence[Container],
               records: Mapping[str, list[PlegContainer]]) -> list[str]:
    """Names of init containers that have not yet exited 0 (newest run)."""
    pending = []
    for spec in init_specs:
        runs = sorted(records.get(spec.name, []), key=lambda c: (c.created_at, c.id))
        if not runs or runs[-1].state != EXITED or runs[-1].exit_code:
            pending.append(spec.name)
    return pending


def get_phase(policy: str, init: Sequence[ContainerStatus],
              regular: Sequence[ContainerStatus]) -> str:
    """The kubelet's ``getPhase`` over API container statuses (``policy``: the pod's
    restartPolicy; static pods: never terminal by deletion)."""
    pending_init = failed_init = 0
    for cs in init:
        st, last = cs.state, cs.last_state
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
    if (pending_init and not any_started) or waiting:
        return PENDING
    if running:
        return RUNNING
    if stopped:
        if policy == "Always":
            return RUNNING
        if stopped == succeeded:
            return SUCCEEDED
        return FAILED if policy == "Never" else RUNNING
    return PENDING


def _stamp(conds: list[PodCondition], previous: PodStatus | None,
           now: float) -> tuple[PodCondition, ...]:
    """Each condition with its ``lastTransitionTime``: the previous one's while its status is
    unchanged, else ``now``."""
    prev = {c.type: c for c in previous.conditions} if previous is not None else {}
    out = []
    for cond in conds:
        old = prev.get(cond.type)
        if old is not None and old.status == cond.status and old.last_transition_time:
            at = old.last_transition_time
        else:
            at = rfc3339(now)
        out.append(PodCondition(cond.type, cond.status, cond.reason, cond.message, at))
    return tuple(out)


def _condition(ctype: str, ok: bool, reason: str = "", message: str = "") -> PodCondition:
    return PodCondition(ctype, "True" if ok else "False", reason, message)


def _conditions(phase: str, sandbox_ready: bool, init_pending: list[str],
                regular: Sequence[ContainerStatus]) -> list[PodCondition]:
    conds = [_condition("PodReadyToStartContainers", sandbox_ready)]
    if init_pending:
        conds.append(_condition("Initialized", False, "ContainersNotInitialized",
                                f"containers with incomplete status: [{' '.join(init_pending)}]"))
    else:
        conds.append(_condition("Initialized", True))
    unready = [cs.name for cs in regular if not cs.ready]
    if phase == SUCCEEDED:
        ready = [_condition("ContainersReady", False, "PodCompleted"),
                 _condition("Ready", False, "PodCompleted")]
    elif unready:
        msg = f"containers with unready status: [{' '.join(unready)}]"
        ready = [_condition("ContainersReady", False, "ContainersNotReady", msg),
                 _condition("Ready", False, "ContainersNotReady", msg)]
    else:
        ready = [_condition("ContainersReady", True), _condition("Ready", True)]
    return [*conds, *ready, _condition("PodScheduled", True)]


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
            message=desired.message,
            conditions=_stamp([_condition("PodScheduled", True)], before, now))
        return with_version(rejected, ref, previous)
    spec = pod.spec
    records = by_name(pleg.containers if pleg is not None else ())
    sandboxes = pleg.sandboxes if pleg is not None else ()
    ready_sb = [s for s in sandboxes if s.state == "SANDBOX_READY"]
    waiting = desired.waiting
    init_pending = _init_done(spec.init_containers, records)
    if any(records.get(c.name) for c in spec.containers):
        init_pending = []  # the kubelet: regular containers ran, so the pod was initialized
    init = [container_status(c, records.get(c.name, []), waiting.get(c.name), "PodInitializing",
                             runtime) for c in spec.init_containers]
    default = "PodInitializing" if init_pending else "ContainerCreating"
    regular = [container_status(c, records.get(c.name, []), waiting.get(c.name), default,
                                runtime, (readiness or {}).get(c.name), (started or {}).get(c.name))
               for c in spec.containers]
    phase = get_phase(str(spec.restart_policy), init, regular)
    if prev_phase in TERMINAL:
        phase = str(prev_phase)
    ips = pod_ips(spec.host_network, ready_sb or sandboxes, hosts)
    status = PodStatus(
        phase=phase, host_ip=host_ip, host_ips=hosts, start_time=start,
        qos_class=desired.qos_class,  # the sync loop's QoS class of the pod (pod/qos.py)
        reason=desired.reason if desired.reason else None,
        message=desired.message if desired.reason else None,
        pod_ip=ips[0] if ips else "", pod_ips=tuple(ips), container_statuses=tuple(regular),
        init_container_statuses=tuple(init),
        conditions=_stamp(_conditions(phase, bool(ready_sb), init_pending, regular), before,
                          now))
    return with_version(status, ref, previous)


def with_version(status: PodStatus, pod: PodRef,
                 previous: PodStatusValue | None) -> PodStatusValue:
    """The value of ``status``: the previous version when nothing changed, else one more."""
    if previous is None:
        return PodStatusValue(status, 1, pod)
    if previous.status == status and previous.pod == pod:
        return previous
    return PodStatusValue(status, previous.version + 1, pod)
