"""``compute_pod_status``: desired pod + PLEG record + previous status -> PodStatus. Pure.

Follows the kubelet's ``generateAPIPodStatus`` / ``getPhase`` and the condition generators
(``pkg/kubelet/status/generate.go``): see docs/ARCHITECTURE.md "Status" for where podvisor
differs. A terminal phase (Succeeded, Failed) never goes back; ``lastTransitionTime`` is kept
while a condition's status is unchanged; ``_version`` bumps only when something changed.
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
from podvisor.services.status.containers import EXITED, by_name, container_status

PENDING, RUNNING, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"
TERMINAL = (SUCCEEDED, FAILED)
CONDITION_TYPES = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                   "PodScheduled")
# The fields of a ``DesiredPod`` that ``compute_pod_status`` reads: a change of any other
# (the sync loop's ``sandbox_id``, ``updated_at``, ``worker``, ...) cannot change the status.
DESIRED_KEYS = ("pod", "admitted", "reason", "message", "waiting", "qos_class")


def desired_inputs(entry: Any) -> Any:
    """What of a ``desired`` entry a status depends on (equal inputs: equal statuses)."""
    if not isinstance(entry, DesiredPod):
        return entry
    return tuple(getattr(entry, key) for key in DESIRED_KEYS)


def _init_done(init_specs: Sequence[Mapping[str, Any]],
               records: Mapping[str, list[PlegContainer]]) -> list[str]:
    """Names of init containers that have not yet exited 0 (newest run)."""
    pending = []
    for spec in init_specs:
        runs = sorted(records.get(spec.get("name", ""), []), key=lambda c: (c.created_at, c.id))
        if not runs or runs[-1].state != EXITED or runs[-1].exit_code:
            pending.append(str(spec.get("name", "")))
    return pending


def get_phase(spec: Mapping[str, Any], init: Sequence[Mapping[str, Any]],
              regular: Sequence[Mapping[str, Any]]) -> str:
    """The kubelet's ``getPhase`` over API container statuses (static pods: never terminal by
    deletion)."""
    pending_init = failed_init = 0
    for cs in init:
        st, last = cs["state"], cs.get("lastState") or {}
        if "running" in st:
            pending_init += 1
        elif "terminated" in st:
            failed_init += int(st["terminated"]["exitCode"] != 0)
        elif "terminated" in last:
            failed_init += int(last["terminated"]["exitCode"] != 0)
        else:
            pending_init += 1
    running = waiting = stopped = succeeded = 0
    for cs in regular:
        st = cs["state"]
        if "running" in st:
            running += 1
        elif "terminated" in st:
            stopped += 1
            succeeded += int(st["terminated"]["exitCode"] == 0)
        elif "terminated" in (cs.get("lastState") or {}):
            stopped += 1
        else:
            waiting += 1
    policy = spec.get("restartPolicy", "Always")
    any_started = any(cs.get("containerID") for cs in regular)
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


def _condition(ctype: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    # lastProbeTime: null, as the kubelet's conditions (it probes nothing for them)
    cond: dict[str, Any] = {"type": ctype, "status": "True" if ok else "False",
                            "lastProbeTime": None}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def _stamp(conds: list[dict[str, Any]], previous: Mapping[str, Any] | None,
           now: float) -> list[dict[str, Any]]:
    prev = {c.get("type"): c for c in (previous or {}).get("conditions", [])}
    for cond in conds:
        old = prev.get(cond["type"])
        if old is not None and old.get("status") == cond["status"] and old.get(
                "lastTransitionTime"):
            cond["lastTransitionTime"] = old["lastTransitionTime"]
        else:
            cond["lastTransitionTime"] = rfc3339(now)
    return conds


def _not_ready(statuses: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(cs["name"]) for cs in statuses if not cs.get("ready")]


def _conditions(phase: str, sandbox_ready: bool, init_pending: list[str],
                regular: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    conds = [_condition("PodReadyToStartContainers", sandbox_ready)]
    if init_pending:
        conds.append(_condition("Initialized", False, "ContainersNotInitialized",
                                f"containers with incomplete status: [{' '.join(init_pending)}]"))
    else:
        conds.append(_condition("Initialized", True))
    unready = _not_ready(regular)
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


def _meta(pod: Mapping[str, Any]) -> dict[str, Any]:
    meta = pod.get("metadata", {})
    return {"name": meta.get("name", ""), "namespace": meta.get("namespace", ""),
            "uid": meta.get("uid", "")}


def pod_ips(spec: Mapping[str, Any], sandboxes: Sequence[PlegSandbox],
             host_ip: str) -> list[str]:
    """The kubelet's pod IPs: a hostNetwork pod has the host's; another pod those its newest
    sandbox reports (PodSandboxStatus ``network.ip`` then ``additional_ips``; none yet while
    it has no sandbox or no network)."""
    if spec.get("hostNetwork"):
        return [host_ip]
    first = sandboxes[-1].ip if sandboxes else ""
    if not first:
        return []
    return [first, *(ip for ip in sandboxes[-1].additional_ips if ip != first)]


def compute_pod_status(
    desired: DesiredPod,
    pleg: PlegPod | None,
    previous: Mapping[str, Any] | None,
    now: float,
    runtime: str = "embedded",
    host_ip: str = "127.0.0.1",
    readiness: Mapping[str, bool] | None = None,
    started: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    """The PodStatus of one pod. ``desired`` is the ``desired`` map entry, ``pleg`` the pod's
    ``pleg`` map record (None: no runtime objects), ``previous`` the last status computed (or
    None), ``now`` wall-clock seconds, ``readiness`` / ``started`` the prober's verdicts by
    container name."""
    pod = desired.pod
    spec = pod.get("spec") or {}
    prev_phase = (previous or {}).get("phase")
    start = (previous or {}).get("startTime") or rfc3339(now)
    status: dict[str, Any] = {"hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
                              "startTime": start, "_pod": _meta(pod)}
    if desired.qos_class:  # the sync loop's QoS class of the pod (services/pod/qos.py)
        status["qosClass"] = desired.qos_class
    if not desired.admitted:
        status.update(phase=FAILED, reason=desired.reason or "Rejected",
                      message=desired.message, containerStatuses=[],
                      initContainerStatuses=[])
        status["conditions"] = _stamp([_condition("PodScheduled", True)], previous, now)
        return with_version(status, previous)
    records = by_name(pleg.containers if pleg is not None else ())
    sandboxes = pleg.sandboxes if pleg is not None else ()
    ready_sb = [s for s in sandboxes if s.state == "SANDBOX_READY"]
    waiting = desired.waiting
    init_specs = spec.get("initContainers") or []
    init_pending = _init_done(init_specs, records)
    any_regular = any(records.get(c.get("name", "")) for c in spec.get("containers") or [])
    if any_regular:
        init_pending = []  # the kubelet: regular containers ran, so the pod was initialized
    init = [container_status(c, records.get(c.get("name", ""), []), waiting.get(c.get("name")),
                             "PodInitializing", runtime) for c in init_specs]
    default = "PodInitializing" if init_pending else "ContainerCreating"
    regular = [container_status(c, records.get(c.get("name", ""), []), waiting.get(c.get("name")),
                                default, runtime, (readiness or {}).get(c.get("name", "")),
                                (started or {}).get(c.get("name", "")))
               for c in spec.get("containers") or []]
    phase = get_phase(spec, init, regular)
    if prev_phase in TERMINAL:
        phase = prev_phase
    ips = pod_ips(spec, ready_sb or sandboxes, host_ip)
    status.update(phase=phase, podIP=ips[0] if ips else "", containerStatuses=regular,
                  initContainerStatuses=init)
    if ips:
        status["podIPs"] = [{"ip": ip} for ip in ips]
    if desired.reason:
        status.update(reason=desired.reason, message=desired.message)
    status["conditions"] = _stamp(_conditions(phase, bool(ready_sb), init_pending, regular),
                                  previous, now)
    return with_version(status, previous)


def status_value(status: Mapping[str, Any]) -> PodStatusValue:
    """The ``statuses`` map's value of a computed status: the API's PodStatus (no internal
    ``_`` keys), its ``_version`` and its ``_pod``."""
    meta = status.get("_pod") or {}
    return PodStatusValue({k: v for k, v in status.items() if not k.startswith("_")},
                          int(status.get("_version", 0)),
                          PodRef(str(meta.get("name", "")), str(meta.get("namespace", "")),
                                 str(meta.get("uid", ""))))


def with_version(status: dict[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """Set ``_version``: the previous one when nothing changed, else one more."""
    prev_version = int((previous or {}).get("_version", 0))
    if previous is not None and {k: v for k, v in previous.items() if k != "_version"} == status:
        status["_version"] = prev_version
    else:
        status["_version"] = prev_version + 1
    return status
