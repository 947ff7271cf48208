"""The PodStatus, typed: what the status process computes and every reader of ``statuses`` sees.

Frozen dataclasses for the parts of the Kubernetes ``PodStatus`` podvisor writes (the kubelet's
``generateAPIPodStatus``: phase, conditions, container statuses, IPs, QoS class). ``to_dict()``
is the API object's JSON exactly as ``GET /pods``, the API server's ``pods/status`` PATCH and
``podvisorctl pods --json`` show it (camelCase keys; the optional ones left out when unset);
``from_dict()`` reads it back (``from_dict(s.to_dict()) == s``) and raises ``MapValueError``
(reason ``fields``) on anything malformed. Absent fields take their defaults, so a status from
an older agent (persisted, or in a peer's snapshot) reads as well.

The status process's own bookkeeping (version, pod reference, retirement) is not part of it:
see ``PodStatusValue`` in ``ipc/maps.py`` and the status store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from podvisor.ipc.wire import (
    opt_str,
    read_bool,
    read_int,
    read_list,
    read_map,
    read_str,
)

__all__ = ["ContainerState", "ContainerStatus", "PodCondition", "PodStatus", "Running",
           "Terminated", "Waiting"]

PENDING = "Pending"


@dataclass(frozen=True)
class Waiting:
    """``state.waiting``: ``reason`` as the kubelet's (``ContainerCreating``,
    ``CrashLoopBackOff``...); both left out of the JSON when empty."""

    reason: str = ""
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("reason", self.reason), ("message", self.message)) if v}

    @classmethod
    def from_dict(cls, raw: Any) -> Waiting:
        raw = read_map(raw, "waiting")
        return cls(read_str(raw, "reason", "waiting"), read_str(raw, "message", "waiting"))


@dataclass(frozen=True)
class Running:
    """``state.running``: ``started_at`` RFC 3339 (None: JSON null, the runtime did not say)."""

    started_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"startedAt": self.started_at}

    @classmethod
    def from_dict(cls, raw: Any) -> Running:
        return cls(opt_str(read_map(raw, "running"), "startedAt", "running"))


@dataclass(frozen=True)
class Terminated:
    """``state.terminated`` of a runtime container (``container_id`` as ``<runtime>://<id>``);
    ``message`` left out of the JSON when empty."""

    exit_code: int = 0
    reason: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    container_id: str = ""
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"exitCode": self.exit_code, "reason": self.reason,
                               "startedAt": self.started_at, "finishedAt": self.finished_at,
                               "containerID": self.container_id}
        if self.message:
            out["message"] = self.message
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> Terminated:
        raw, what = read_map(raw, "terminated"), "terminated"
        return cls(read_int(raw, "exitCode", what), read_str(raw, "reason", what),
                   opt_str(raw, "startedAt", what), opt_str(raw, "finishedAt", what),
                   read_str(raw, "containerID", what), read_str(raw, "message", what))


@dataclass(frozen=True)
class ContainerState:
    """One of ``waiting``, ``running``, ``terminated`` (none: ``{}``, e.g. an empty
    ``lastState``), as the API's ``ContainerState``."""

    waiting: Waiting | None = None
    running: Running | None = None
    terminated: Terminated | None = None

    @property
    def kind(self) -> str:
        """``running``, ``terminated``, ``waiting``, or "" for none."""
        if self.running is not None:
            return "running"
        if self.terminated is not None:
            return "terminated"
        return "waiting" if self.waiting is not None else ""

    @property
    def reason(self) -> str:
        """The waiting or terminated reason ("" when running or none)."""
        if self.terminated is not None:
            return self.terminated.reason
        return self.waiting.reason if self.waiting is not None else ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.running is not None:
            out["running"] = self.running.to_dict()
        if self.terminated is not None:
            out["terminated"] = self.terminated.to_dict()
        if self.waiting is not None:
            out["waiting"] = self.waiting.to_dict()
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> ContainerState:
        raw = read_map(raw or {}, "container state")
        waiting, running, terminated = (raw.get(k) for k in ("waiting", "running", "terminated"))
        return cls(None if waiting is None else Waiting.from_dict(waiting),
                   None if running is None else Running.from_dict(running),
                   None if terminated is None else Terminated.from_dict(terminated))


@dataclass(frozen=True)
class ContainerStatus:
    """The API's ``ContainerStatus`` of one container of the spec (``container_id`` "" and left
    out of the JSON before the runtime created one)."""

    name: str
    image: str = ""
    image_id: str = ""
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    container_id: str = ""
    state: ContainerState = ContainerState()
    last_state: ContainerState = ContainerState()
    # in-place resize: what the node allocated (requests) and what the container runs with
    # (requests and limits), API quantities; left out when empty
    allocated_resources: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    __hash__ = None  # type: ignore[assignment]  # holds dicts

    @property
    def runtime_id(self) -> str:
        """The runtime's ID of ``container_id`` (``<runtime>://<id>`` -> ``<id>``)."""
        return self.container_id.rpartition("://")[2]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "image": self.image, "imageID": self.image_id,
                               "restartCount": self.restart_count, "ready": self.ready,
                               "started": self.started}
        if self.container_id:
            out["containerID"] = self.container_id
        out["state"] = self.state.to_dict()
        out["lastState"] = self.last_state.to_dict()
        if self.allocated_resources:
            out["allocatedResources"] = dict(self.allocated_resources)
        if self.resources:
            out["resources"] = {k: dict(v) for k, v in self.resources.items()}
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> ContainerStatus:
        raw, what = read_map(raw, "container status"), "container status"
        return cls(read_str(raw, "name", what), read_str(raw, "image", what),
                   read_str(raw, "imageID", what), read_int(raw, "restartCount", what),
                   read_bool(raw, "ready", what), read_bool(raw, "started", what),
                   read_str(raw, "containerID", what), ContainerState.from_dict(raw.get("state")),
                   ContainerState.from_dict(raw.get("lastState")),
                   _quantities(raw.get("allocatedResources")),
                   {part: _quantities(v) for part, v in (raw.get("resources") or {}).items()
                    if part in ("requests", "limits") and _quantities(v)}
                   if isinstance(raw.get("resources"), Mapping) else {})


def _quantities(raw: Any) -> dict[str, str]:
    """A ResourceList of quantities (malformed entries dropped)."""
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items() if isinstance(v, (str, int))}


@dataclass(frozen=True)
class PodCondition:
    """A pod condition (``status`` "True"/"False"; ``lastProbeTime`` is always null, as the
    kubelet's: it probes nothing for them)."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None

    @property
    def true(self) -> bool:
        return self.status == "True"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "status": self.status, "lastProbeTime": None}
        if self.reason:
            out["reason"] = self.reason
        if self.message:
            out["message"] = self.message
        if self.last_transition_time is not None:
            out["lastTransitionTime"] = self.last_transition_time
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> PodCondition:
        raw, what = read_map(raw, "condition"), "condition"
        return cls(read_str(raw, "type", what), read_str(raw, "status", what),
                   read_str(raw, "reason", what), read_str(raw, "message", what),
                   opt_str(raw, "lastTransitionTime", what))


def _ips(raw: Mapping[str, Any], key: str) -> tuple[str, ...]:
    out = []
    for item in read_list(raw, key, "pod status"):
        out.append(read_str(read_map(item, key), "ip", key))
    return tuple(out)


@dataclass(frozen=True)
class PodStatus:
    """The API's ``PodStatus`` as podvisor computes it. ``reason``/``message``/``pod_ip``: None
    leaves them out of the JSON (a rejected pod has no ``podIP``; a pod without a sync error
    no ``reason``); ``qos_class`` and ``pod_ips`` are left out when empty."""

    phase: str = PENDING
    host_ip: str = ""
    host_ips: tuple[str, ...] = ()
    start_time: str | None = None
    qos_class: str = ""
    reason: str | None = None
    message: str | None = None
    pod_ip: str | None = None
    pod_ips: tuple[str, ...] = ()
    container_statuses: tuple[ContainerStatus, ...] = ()
    init_container_statuses: tuple[ContainerStatus, ...] = ()
    conditions: tuple[PodCondition, ...] = ()
    ephemeral_container_statuses: tuple[ContainerStatus, ...] = ()  # left out when empty

    def condition(self, ctype: str) -> PodCondition | None:
        return next((c for c in self.conditions if c.type == ctype), None)

    def container(self, name: str) -> ContainerStatus | None:
        """The status of the (init or regular) container ``name``."""
        return next((c for c in (*self.init_container_statuses, *self.container_statuses,
                                 *self.ephemeral_container_statuses)
                     if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hostIP": self.host_ip,
                               "hostIPs": [{"ip": ip} for ip in self.host_ips]}
        if self.start_time is not None:
            out["startTime"] = self.start_time
        if self.qos_class:
            out["qosClass"] = self.qos_class
        out["phase"] = self.phase
        if self.reason is not None:
            out["reason"] = self.reason
        if self.message is not None:
            out["message"] = self.message
        if self.pod_ip is not None:
            out["podIP"] = self.pod_ip
        out["containerStatuses"] = [c.to_dict() for c in self.container_statuses]
        out["initContainerStatuses"] = [c.to_dict() for c in self.init_container_statuses]
        if self.ephemeral_container_statuses:
            out["ephemeralContainerStatuses"] = [
                c.to_dict() for c in self.ephemeral_container_statuses]
        if self.pod_ips:
            out["podIPs"] = [{"ip": ip} for ip in self.pod_ips]
        out["conditions"] = [c.to_dict() for c in self.conditions]
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> PodStatus:
        raw, what = read_map(raw, "pod status"), "pod status"
        return cls(
            phase=read_str(raw, "phase", what, PENDING), host_ip=read_str(raw, "hostIP", what),
            host_ips=_ips(raw, "hostIPs"), start_time=opt_str(raw, "startTime", what),
            qos_class=read_str(raw, "qosClass", what), reason=opt_str(raw, "reason", what),
            message=opt_str(raw, "message", what), pod_ip=opt_str(raw, "podIP", what),
            pod_ips=_ips(raw, "podIPs"),
            container_statuses=tuple(ContainerStatus.from_dict(c) for c in read_list(
                raw, "containerStatuses", what)),
            init_container_statuses=tuple(ContainerStatus.from_dict(c) for c in read_list(
                raw, "initContainerStatuses", what)),
            conditions=tuple(PodCondition.from_dict(c) for c in read_list(
                raw, "conditions", what)),
            ephemeral_container_statuses=tuple(ContainerStatus.from_dict(c) for c in read_list(
                raw, "ephemeralContainerStatuses", what)))
