"""Every replicated map, declared once: its name and the type of its values (``MapSpec``).

A map's values cross the bus (``clone.<map>.update`` and snapshots) in their wire form; a typed
value is a versioned frozen dataclass with ``to_wire()`` and ``from_wire()``. A ``MapSpec[T]``
names a map and carries its value type's codec: ``MapOwner`` encodes with it and
``MapReplica`` decodes with it, so every reader's ``get()``/``items()`` returns ``T``; there is
no owner or replica without a spec (``UndeclaredMap``: a bare name is refused). A value of an
unknown version (or a malformed one) is dropped by the replica and counted in
``MapReplica.value_drops`` by reason, like a message the codec rejects.

The maps: ``DESIRED``, ``PLEG``, ``PROBES``, ``STATUSES``, ``API_MIRRORS``, ``PRESSURE``,
``VOLUMES`` (``ipc/volumemaps.py``) and one pod set per source (``pods_map("file" | "http" |
"api")``); ``MAPS`` holds them by name.
Nested fields stay dict-shaped only where they are the Kubernetes API object itself (a pod's
``Pod.to_dict()``, rebuilt into the typed ``Pod`` by its readers); the PodStatus is typed
(``ipc/podstatus.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Generic, TypeVar

from podvisor.ipc.podstatus import PodStatus
from podvisor.ipc.volumemaps import VolumesValue, decode_volumes
from podvisor.ipc.wire import MapValueError, read_float, read_map, read_str

__all__ = [
    "API_MIRRORS",
    "DESIRED",
    "HEALTH_KEY",
    "MAPS",
    "MIRRORS_KEY",
    "NODE_SHUTDOWN",
    "NODE_SHUTDOWN_KEY",
    "NODE_SHUTDOWN_MESSAGE",
    "NODE_SHUTDOWN_REASON",
    "PLEG",
    "POD_SET_KEY",
    "POD_SOURCES",
    "PRESSURE",
    "PRESSURE_CONDITIONS",
    "PRESSURE_KEY",
    "PROBES",
    "RUNTIME_KEY",
    "STATUSES",
    "VOLUMES",
    "ContainerVerdict",
    "ContainerWaiting",
    "DesiredPod",
    "DesiredValue",
    "MapSpec",
    "MapValueError",
    "MirrorPod",
    "MirrorSet",
    "NodePressure",
    "NodeShutdownState",
    "PlegContainer",
    "PlegHealth",
    "PlegPod",
    "PlegSandbox",
    "PlegValue",
    "PodProbes",
    "PodRef",
    "PodSetValue",
    "PodStatus",
    "PodStatusValue",
    "RuntimeNetwork",
    "UndeclaredMap",
    "declared",
    "decode_desired",
    "decode_pleg",
    "pods_map",
]

T = TypeVar("T")

HEALTH_KEY = "_health"  # the pleg map's entry for its relist health
POD_SET_KEY = "set"  # the one key of a pods-<source> map
RUNTIME_KEY = "_runtime"  # the desired map's entry for the runtime's network readiness
MIRRORS_KEY = "mirrors"  # the one key of the api-mirrors map
PRESSURE_KEY = "node"  # the one key of the pressure map
NODE_SHUTDOWN_KEY = "state"  # the one key of the node-shutdown map
# a pod failed by graceful node shutdown (the kubelet's nodeshutdown manager's words)
NODE_SHUTDOWN_REASON = "Terminated"
NODE_SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
POD_SOURCES = ("file", "http", "api")  # the sources that own a pods-<source> map


class UndeclaredMap(TypeError):
    """A map owner or replica asked for without a ``MapSpec`` (or a name ``MAPS`` lacks)."""


@dataclass(frozen=True, eq=False)
class MapSpec(Generic[T]):
    """A replicated map, declared: its ``name`` (topic ``clone.<name>.``, snapshot socket
    ``snap-<name>.sock``), ``encode`` (a ``T`` to its wire form) and ``decode`` (a wire form to
    a ``T``; raises ``MapValueError`` for anything else). ``owner``: the process that owns it
    (documentation). Specs compare by identity: one object per map."""

    name: str
    encode: Callable[[T], Any]
    decode: Callable[[Any], T]
    owner: str = ""

    def __repr__(self) -> str:
        return f"MapSpec({self.name!r})"


@dataclass(frozen=True)
class PodSetValue:
    """The FULL set of pods one source wants, set on every change and every relist (the sources
    are stateless: a restarted source just sets it again).

    ``source``: "file" | "http" | "api". ``pods``: ``Pod.to_dict()`` of each valid, defaulted
    pod, in file-name order (rebuild with ``podvisor.services.pod.pod_from_wire``). ``errors``: one
    ``{"file" or "url": where, "field": path, "reason": text}`` per rejected input. ``ts``:
    the monotonic time the set was read."""

    VERSION: ClassVar[int] = 1
    source: str
    pods: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    ts: float = 0.0

    def __eq__(self, other: object) -> bool:  # a re-read with nothing new is no change
        return (isinstance(other, PodSetValue) and self.source == other.source
                and self.pods == other.pods and self.errors == other.errors)

    def __hash__(self) -> int:
        return hash(self.source)

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION, "source": self.source, "pods": self.pods,
                "errors": self.errors, "ts": self.ts}

    @classmethod
    def from_wire(cls, raw: Any) -> PodSetValue:
        if not isinstance(raw, dict):
            raise MapValueError("fields", "pod set: not a map")
        if raw.get("v") != cls.VERSION:
            raise MapValueError("version", f"pod set v{raw.get('v')!r}")
        source, pods, errors, ts = (raw.get(k) for k in ("source", "pods", "errors", "ts"))
        if (not isinstance(source, str) or not isinstance(pods, list)
                or not all(isinstance(p, dict) for p in pods) or not isinstance(errors, list)
                or isinstance(ts, bool) or not isinstance(ts, int | float)):
            raise MapValueError("fields", "pod set: wrong field types")
        return cls(source, pods, errors, float(ts))


_OPT_BOOL = (bool, type(None))
_OPT_STR = (str, type(None))


@dataclass(frozen=True)
class ContainerVerdict:
    """What the prober says about one container (by its current runtime ID): ``ready`` and
    ``started`` (None: no such probe), ``liveness`` ("success" | "failure" | None),
    ``failed_probe`` ("startup" | "liveness" | None), ``ts``: since when (monotonic)."""

    container_id: str
    ready: bool | None = None
    started: bool | None = None
    liveness: str | None = None
    failed_probe: str | None = None
    ts: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return {"container_id": self.container_id, "ready": self.ready,
                "started": self.started, "liveness": self.liveness,
                "failed_probe": self.failed_probe, "ts": self.ts}

    @classmethod
    def from_wire(cls, raw: Any) -> ContainerVerdict:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("container_id"), str):
            raise MapValueError("fields", "probe verdict: no container_id")
        ts = raw.get("ts", 0.0)
        if (not isinstance(raw.get("ready"), _OPT_BOOL)
                or not isinstance(raw.get("started"), _OPT_BOOL)
                or not isinstance(raw.get("liveness"), _OPT_STR)
                or not isinstance(raw.get("failed_probe"), _OPT_STR)
                or isinstance(ts, bool) or not isinstance(ts, int | float)):
            raise MapValueError("fields", "probe verdict: wrong field types")
        return cls(raw["container_id"], raw.get("ready"), raw.get("started"),
                   raw.get("liveness"), raw.get("failed_probe"), float(ts))


@dataclass(frozen=True)
class PodProbes:
    """A ``probes`` value: the verdicts of one pod's probed containers, by container name."""

    VERSION: ClassVar[int] = 1
    containers: Mapping[str, ContainerVerdict]

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION,
                "containers": {n: v.to_wire() for n, v in self.containers.items()}}

    @classmethod
    def from_wire(cls, raw: Any) -> PodProbes:
        if not isinstance(raw, Mapping):
            raise MapValueError("fields", "probes: not a map")
        if raw.get("v") != cls.VERSION:
            raise MapValueError("version", f"probes v{raw.get('v')!r}")
        containers = raw.get("containers")
        if not isinstance(containers, Mapping):
            raise MapValueError("fields", "probes: no containers")
        return cls({str(n): ContainerVerdict.from_wire(v) for n, v in containers.items()})

    @classmethod
    def from_entry(cls, entry: Mapping[str, Mapping[str, Any]]) -> PodProbes:
        """From the prober's own form (``{container name: verdict fields}``, also its file)."""
        return cls({str(n): ContainerVerdict.from_wire(v) for n, v in entry.items()})


def _float(raw: Mapping[str, Any], key: str) -> float:
    return read_float(raw, key)


def _str(raw: Mapping[str, Any], key: str, what: str, default: str = "") -> str:
    return read_str(raw, key, what, default)


def _version(raw: Any,
             cls: type[DesiredPod | RuntimeNetwork | PodStatusValue | PlegPod | PlegHealth
                       | MirrorSet | NodePressure
                       | NodeShutdownState],
             what: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise MapValueError("fields", f"{what}: not a map")
    if raw.get("v") != cls.VERSION:
        raise MapValueError("version", f"{what} v{raw.get('v')!r}")
    return raw


@dataclass(frozen=True)
class ContainerWaiting:
    """Why the sync loop has not (re)started a container yet: ``reason`` as the kubelet's
    waiting reasons (``ContainerCreating``, ``CrashLoopBackOff``, ``ErrImagePull``...)."""

    reason: str
    message: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"reason": self.reason, "message": self.message}

    @classmethod
    def from_wire(cls, raw: Any) -> ContainerWaiting:
        if not isinstance(raw, Mapping):
            raise MapValueError("fields", "waiting: not a map")
        return cls(_str(raw, "reason", "waiting"), _str(raw, "message", "waiting"))


# a container's CPU/memory in API quantities: {"requests": {"cpu": "500m"}, "limits": {...}}
ResourceQuantities = Mapping[str, Mapping[str, str]]


def _quantities(raw: Any) -> dict[str, dict[str, str]]:
    if not isinstance(raw, Mapping):
        return {}
    return {str(part): {str(k): str(v) for k, v in got.items()}
            for part, got in raw.items() if isinstance(got, Mapping) and got}


@dataclass(frozen=True)
class PodResize:
    """A pod's in-place resize as the sync loop holds it (``syncloop/resizes.py``): what the
    node allocated and what each running container runs with (container name ->
    ``ResourceQuantities``), a refused resize (``pending_reason`` Infeasible or Deferred, with
    the kubelet's message), an accepted one not applied yet (``in_progress``; ``error``: the
    runtime's refusal of the update)."""

    allocated: Mapping[str, ResourceQuantities] = field(default_factory=dict)
    actual: Mapping[str, ResourceQuantities] = field(default_factory=dict)
    pending_reason: str = ""
    pending_message: str = ""
    in_progress: bool = False
    error: str = ""

    __hash__ = None  # type: ignore[assignment]  # holds dicts

    def to_wire(self) -> dict[str, Any]:
        return {"allocated": {n: {p: dict(q) for p, q in a.items()}
                              for n, a in self.allocated.items()},
                "actual": {n: {p: dict(q) for p, q in a.items()}
                           for n, a in self.actual.items()},
                "pendingReason": self.pending_reason, "pendingMessage": self.pending_message,
                "inProgress": self.in_progress, "error": self.error}

    @classmethod
    def from_wire(cls, raw: Any) -> PodResize:
        if not isinstance(raw, Mapping):
            return cls()
        def per(key: str) -> dict[str, dict[str, dict[str, str]]]:
            got = raw.get(key)
            if not isinstance(got, Mapping):
                return {}
            return {str(n): _quantities(a) for n, a in got.items()}
        return cls(per("allocated"), per("actual"), _str(raw, "pendingReason", "resize"),
                   _str(raw, "pendingMessage", "resize"), raw.get("inProgress") is True,
                   _str(raw, "error", "resize"))


@dataclass(frozen=True)
class DesiredPod:
    """A ``desired`` value under a pod UID: the pod the sync loop runs and its worker's state.

    ``pod``: ``Pod.to_dict()`` of the validated, defaulted pod (the Kubernetes API object as
    JSON; rebuild it with ``podvisor.services.pod.pod_from_dict``). ``source``: the source
    that wants it; ``worker``: the pod worker's state (``syncing``, ``terminating``,
    ``terminated``); ``admitted`` False with ``reason``/``message`` for a pod admission
    rejected; otherwise ``reason``/``message`` is the last sync error. ``waiting``: per
    container name, why it is not running yet. ``sandbox_id``: its sandbox ("" before one).
    ``updated_at``: wall time of the change. ``qos_class``: the pod's QoS class. ``failed``:
    the pod was failed for good (``SyncLoop.fail_pod``: past its ``activeDeadlineSeconds``, or
    a ``FailPod``), with ``reason``/``message`` saying why (an older sync loop's value reads as
    False). ``resize``: the pod's in-place resize (``PodResize``; empty: an older sync loop's
    value)."""

    VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "pod"
    pod: dict[str, Any]
    source: str = ""
    worker: str = "syncing"
    admitted: bool = True
    reason: str = ""
    message: str = ""
    waiting: Mapping[str, ContainerWaiting] = field(default_factory=dict)
    sandbox_id: str = ""
    updated_at: float = 0.0
    qos_class: str = ""
    failed: bool = False
    resize: PodResize = field(default_factory=PodResize)

    __hash__ = None  # type: ignore[assignment]  # holds dicts

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION, "kind": self.KIND, "pod": self.pod, "source": self.source,
                "worker": self.worker, "admitted": self.admitted, "reason": self.reason,
                "message": self.message,
                "waiting": {n: w.to_wire() for n, w in self.waiting.items()},
                "sandbox_id": self.sandbox_id, "updated_at": self.updated_at,
                "qos_class": self.qos_class, "failed": self.failed,
                "resize": self.resize.to_wire()}

    @classmethod
    def from_wire(cls, raw: Any) -> DesiredPod:
        raw = _version(raw, cls, "desired pod")
        pod, waiting, admitted = raw.get("pod"), raw.get("waiting", {}), raw.get("admitted")
        if not isinstance(pod, dict) or not isinstance(waiting, Mapping) \
                or not isinstance(admitted, bool):
            raise MapValueError("fields", "desired pod: wrong field types")
        return cls(pod, _str(raw, "source", "desired pod"),
                   _str(raw, "worker", "desired pod", "syncing"), admitted,
                   _str(raw, "reason", "desired pod"),
                   _str(raw, "message", "desired pod"),
                   {str(n): ContainerWaiting.from_wire(w) for n, w in waiting.items()},
                   _str(raw, "sandbox_id", "desired pod"), _float(raw, "updated_at"),
                   _str(raw, "qos_class", "desired pod"), raw.get("failed") is True,
                   PodResize.from_wire(raw.get("resize")))

    @property
    def active(self) -> bool:
        """Admitted and not yet terminated: its containers are wanted (or still stopping)."""
        return self.admitted and self.worker != "terminated"

    @property
    def ref(self) -> PodRef:
        """Which pod it is: its API object's ``metadata`` name, namespace and UID (the rest
        of the pod is read through the typed ``Pod``, ``services.pod.pod_from_wire``)."""
        meta = self._meta()
        return PodRef(str(meta.get("name", "")), str(meta.get("namespace", "")),
                      str(meta.get("uid", "")))

    @property
    def annotations(self) -> Mapping[str, str]:
        """The pod's annotations (its API object's ``metadata.annotations``)."""
        notes = self._meta().get("annotations")
        if not isinstance(notes, Mapping):
            return {}
        return {str(k): str(v) for k, v in notes.items()}

    def _meta(self) -> Mapping[str, Any]:
        meta = self.pod.get("metadata")
        return meta if isinstance(meta, Mapping) else {}


# The reason of a true NetworkReady when pods share the node's network (the embedded runtime's
# ``networkPlugin: host``): /healthz and the Node's Ready condition say so.
HOST_NETWORK_REASON = "HostNetwork"


@dataclass(frozen=True)
class RuntimeNetwork:
    """The ``desired`` map's ``_runtime`` value: the runtime's NetworkReady condition as the
    sync loop last read it (``condition``: the kubelet's text of it)."""

    VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "runtime"
    ready: bool
    reason: str = ""
    message: str = ""
    condition: str = ""

    @property
    def host_network(self) -> bool:
        """Ready, with every pod in the node's network (no pod network)."""
        return self.ready and self.reason == HOST_NETWORK_REASON

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION, "kind": self.KIND, "networkReady": self.ready,
                "reason": self.reason, "message": self.message, "condition": self.condition}

    @classmethod
    def from_wire(cls, raw: Any) -> RuntimeNetwork:
        raw = _version(raw, cls, "runtime")
        if not isinstance(raw.get("networkReady"), bool):
            raise MapValueError("fields", "runtime: networkReady not a bool")
        return cls(raw["networkReady"], _str(raw, "reason", "runtime"),
                   _str(raw, "message", "runtime"), _str(raw, "condition", "runtime"))


DesiredValue = DesiredPod | RuntimeNetwork
_DESIRED_KINDS: dict[str, Callable[[Any], DesiredValue]] = {
    DesiredPod.KIND: DesiredPod.from_wire, RuntimeNetwork.KIND: RuntimeNetwork.from_wire}


def _by_kind(what: str, kinds: Mapping[str, Callable[[Any], T]], raw: Any) -> T:
    """A value of a map holding several kinds, from its wire form (by its ``kind``)."""
    if not isinstance(raw, Mapping):
        raise MapValueError("fields", f"{what}: not a map")
    if raw.get("v") != 1:
        raise MapValueError("version", f"{what} v{raw.get('v')!r}")
    decode = kinds.get(str(raw.get("kind")))
    if decode is None:
        raise MapValueError("fields", f"{what}: unknown kind {raw.get('kind')!r}")
    return decode(raw)


def decode_desired(raw: Any) -> DesiredValue:
    """A ``desired`` value from its wire form (by its ``kind``)."""
    return _by_kind("desired", _DESIRED_KINDS, raw)


@dataclass(frozen=True)
class PodRef:
    """Which pod a value is about (its metadata as the status process saw it)."""

    name: str = ""
    namespace: str = ""
    uid: str = ""


@dataclass(frozen=True)
class PodStatusValue:
    """A ``statuses`` value: one pod's status as the status process computed it.

    ``status``: the typed PodStatus (``ipc/podstatus.py``; on the wire its API JSON,
    ``status.to_dict()``: what ``GET /pods`` shows and the API writer patches). ``version``:
    bumps whenever ``status`` (or ``pod``) changes (the API writer patches each version once).
    ``pod``: the pod it belongs to."""

    VERSION: ClassVar[int] = 1
    status: PodStatus
    version: int = 0
    pod: PodRef = PodRef()

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION, "status": self.status.to_dict(), "version": self.version,
                "pod": {"name": self.pod.name, "namespace": self.pod.namespace,
                        "uid": self.pod.uid}}

    @classmethod
    def from_wire(cls, raw: Any) -> PodStatusValue:
        raw = _version(raw, cls, "status")
        status, version, pod = raw.get("status"), raw.get("version", 0), raw.get("pod", {})
        if not isinstance(status, dict) or isinstance(version, bool) \
                or not isinstance(version, int) or not isinstance(pod, Mapping):
            raise MapValueError("fields", "status: wrong field types")
        return cls(PodStatus.from_dict(status), version,
                   PodRef(_str(pod, "name", "status pod"), _str(pod, "namespace", "status pod"),
                          _str(pod, "uid", "status pod")))


@dataclass(frozen=True)
class MirrorPod:
    """A mirror pod the API server holds for one of this node's static pods: its name,
    namespace and UID, and ``hash``, the static pod's config hash it mirrors (annotation
    ``kubernetes.io/config.mirror``)."""

    name: str
    namespace: str
    uid: str
    hash: str

    def to_wire(self) -> dict[str, str]:
        return {"name": self.name, "namespace": self.namespace, "uid": self.uid,
                "hash": self.hash}

    @classmethod
    def from_wire(cls, raw: Any) -> MirrorPod:
        raw = read_map(raw, "mirror")
        return cls(*(read_str(raw, k, "mirror") for k in ("name", "namespace", "uid", "hash")))


@dataclass(frozen=True)
class MirrorSet:
    """The ``api-mirrors`` map's one value (key ``mirrors``): every mirror pod of this node the
    API source last listed (set with each of its pod sets)."""

    VERSION: ClassVar[int] = 1
    mirrors: tuple[MirrorPod, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION, "mirrors": [m.to_wire() for m in self.mirrors]}

    @classmethod
    def from_wire(cls, raw: Any) -> MirrorSet:
        raw = _version(raw, cls, "mirrors")
        mirrors = raw.get("mirrors", [])
        if not isinstance(mirrors, list | tuple):
            raise MapValueError("fields", "mirrors: not a list")
        return cls(tuple(MirrorPod.from_wire(m) for m in mirrors))


PRESSURE_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure")


@dataclass(frozen=True)
class NodePressure:
    """The ``pressure`` map's one value (key ``node``), set by the eviction manager after every
    pass: the node conditions it holds True (``MemoryPressure``, ``DiskPressure``,
    ``PIDPressure``: the thresholds met, held for ``evictionPressureTransitionPeriod`` after
    the last time one was met), in that order, and ``ts`` (wall time of the pass). The node
    process reports them in the Node's conditions and taints; the sync loop's admission
    refuses pods by them, as the kubelet's eviction admit handler."""

    VERSION: ClassVar[int] = 1
    conditions: tuple[str, ...] = ()
    ts: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION, "conditions": list(self.conditions), "ts": self.ts}

    @classmethod
    def from_wire(cls, raw: Any) -> NodePressure:
        raw = _version(raw, cls, "pressure")
        conds, ts = raw.get("conditions", []), raw.get("ts", 0.0)
        if not isinstance(conds, list | tuple) or not all(c in PRESSURE_CONDITIONS
                                                          for c in conds) \
                or isinstance(ts, bool) or not isinstance(ts, int | float):
            raise MapValueError("fields", "pressure: wrong field types")
        return cls(tuple(conds), float(ts))


_SCALARS: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float)}


def _scalars(cls: type, raw: Mapping[str, Any], what: str) -> dict[str, Any]:
    """The scalar fields of dataclass ``cls`` (``str``/``int``/``float``) from ``raw``, absent
    ones left to their defaults; a field of the wrong type is malformed."""
    out: dict[str, Any] = {}
    for f in fields(cls):
        kinds = _SCALARS.get(str(f.type))
        if kinds is None or f.name not in raw:
            continue
        value = raw[f.name]
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise MapValueError("fields", f"{what}: {f.name} not {f.type}")
        out[f.name] = float(raw[f.name]) if f.type == "float" else value
    return out


@dataclass(frozen=True)
class PlegSandbox:
    """A pod sandbox as PLEG last saw it: ``state`` is the CRI's name (``SANDBOX_READY``...),
    ``created_at`` in ns, ``ip``/``additional_ips`` its network ("" when not inspected)."""

    id: str
    state: str
    created_at: int = 0
    attempt: int = 0
    ip: str = ""
    additional_ips: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state, "created_at": self.created_at,
                "attempt": self.attempt, "ip": self.ip,
                "additional_ips": list(self.additional_ips)}

    @classmethod
    def from_wire(cls, raw: Any) -> PlegSandbox:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("id"), str) \
                or not isinstance(raw.get("state"), str):
            raise MapValueError("fields", "pleg sandbox: no id or state")
        ips = raw.get("additional_ips", [])
        if not isinstance(ips, list | tuple) or not all(isinstance(i, str) for i in ips):
            raise MapValueError("fields", "pleg sandbox: additional_ips not strings")
        return cls(**_scalars(cls, raw, "pleg sandbox"), additional_ips=tuple(ips))


@dataclass(frozen=True)
class PlegContainer:
    """A container as PLEG last saw it (from its CRI status; from the listing alone when the
    inspection failed): ``state`` is the CRI's name (``CONTAINER_RUNNING``...), times in ns,
    ``hash``/``restart_count`` from podvisor's annotations."""

    id: str
    name: str
    state: str
    sandbox_id: str = ""
    attempt: int = 0
    created_at: int = 0
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    image: str = ""
    image_ref: str = ""
    hash: str = ""
    restart_count: int = 0
    log_path: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_wire(cls, raw: Any) -> PlegContainer:
        if not isinstance(raw, Mapping) or not all(
                isinstance(raw.get(k), str) for k in ("id", "name", "state")):
            raise MapValueError("fields", "pleg container: no id, name or state")
        return cls(**_scalars(cls, raw, "pleg container"))


@dataclass(frozen=True)
class PlegPod:
    """A ``pleg`` value under a pod UID: its sandboxes and containers as of ``ts`` (PLEG's
    monotonic time of the relist or stream event), sorted by creation time."""

    VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "pod"
    ts: float = 0.0
    name: str = ""
    namespace: str = ""
    sandboxes: tuple[PlegSandbox, ...] = ()
    containers: tuple[PlegContainer, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION, "kind": self.KIND, "ts": self.ts, "name": self.name,
                "namespace": self.namespace,
                "sandboxes": [s.to_wire() for s in self.sandboxes],
                "containers": [c.to_wire() for c in self.containers]}

    @classmethod
    def from_wire(cls, raw: Any) -> PlegPod:
        raw = _version(raw, cls, "pleg pod")
        sandboxes, containers = raw.get("sandboxes", []), raw.get("containers", [])
        if not isinstance(sandboxes, list | tuple) or not isinstance(containers, list | tuple):
            raise MapValueError("fields", "pleg pod: sandboxes/containers not lists")
        return cls(**_scalars(cls, raw, "pleg pod"),
                   sandboxes=tuple(PlegSandbox.from_wire(s) for s in sandboxes),
                   containers=tuple(PlegContainer.from_wire(c) for c in containers))

    def container(self, container_id: str) -> PlegContainer | None:
        return next((c for c in self.containers if c.id == container_id), None)


@dataclass(frozen=True)
class PlegHealth:
    """The ``pleg`` map's ``_health`` value, written after every good relist: ``ts`` (the
    relist's start, monotonic: every pod record is at least that fresh), ``last_relist_ok``
    (wall time), its duration, ``events_mode`` ("stream" | "relist") and PLEG's counters
    since it started."""

    VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = "health"
    ts: float = 0.0
    last_relist_ok: float = 0.0
    last_relist_ms: float = 0.0
    events_mode: str = ""
    relists: int = 0
    relist_errors: int = 0
    stream_events: int = 0
    event_drops: int = 0
    stream_drops: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION, "kind": self.KIND,
                **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_wire(cls, raw: Any) -> PlegHealth:
        return cls(**_scalars(cls, _version(raw, cls, "pleg health"), "pleg health"))


PlegValue = PlegPod | PlegHealth
_PLEG_KINDS: dict[str, Callable[[Any], PlegValue]] = {
    PlegPod.KIND: PlegPod.from_wire, PlegHealth.KIND: PlegHealth.from_wire}


def decode_pleg(raw: Any) -> PlegValue:
    """A ``pleg`` value from its wire form (by its ``kind``)."""
    return _by_kind("pleg", _PLEG_KINDS, raw)


@dataclass(frozen=True)
class NodeShutdownState:
    """The ``node-shutdown`` map's one value (owner: ``nodeshutdown``): ``active`` once a
    graceful node shutdown began (the node process reports the Node NotReady, "node is
    shutting down"), ``trigger`` ("request" | "logind") and ``since`` (wall time)."""

    VERSION: ClassVar[int] = 1
    active: bool = False
    trigger: str = ""
    since: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.VERSION, **{f.name: getattr(self, f.name) for f in fields(self)}}

    @classmethod
    def from_wire(cls, raw: Any) -> NodeShutdownState:
        raw = _version(raw, cls, "node shutdown")
        active = raw.get("active", False)
        if not isinstance(active, bool):
            raise MapValueError("fields", "node shutdown: active not bool")
        return cls(active, _str(raw, "trigger", "node shutdown"), _float(raw, "since"))


def _encode(value: DesiredValue | PlegValue | PodStatusValue | PodProbes | PodSetValue
            | MirrorSet | NodePressure | VolumesValue
            | NodeShutdownState) -> Any:
    return value.to_wire()


# --- the maps -------------------------------------------------------------------------------
DESIRED: MapSpec[DesiredValue] = MapSpec(
    "desired", _encode, decode_desired, "syncloop")  # pod UID -> DesiredPod; _runtime
PLEG: MapSpec[PlegValue] = MapSpec(
    "pleg", _encode, decode_pleg, "pleg")  # pod UID -> PlegPod; _health -> PlegHealth
PROBES: MapSpec[PodProbes] = MapSpec(
    "probes", _encode, PodProbes.from_wire, "prober")  # pod UID -> PodProbes
STATUSES: MapSpec[PodStatusValue] = MapSpec(
    "statuses", _encode, PodStatusValue.from_wire, "status")  # pod UID -> PodStatusValue
API_MIRRORS: MapSpec[MirrorSet] = MapSpec(
    "api-mirrors", _encode, MirrorSet.from_wire, "source-api")  # mirrors -> MirrorSet
PRESSURE: MapSpec[NodePressure] = MapSpec(
    "pressure", _encode, NodePressure.from_wire, "eviction")  # node -> NodePressure
VOLUMES: MapSpec[VolumesValue] = MapSpec(
    "volumes", _encode, decode_volumes, "volumes")  # pod UID -> PodVolumes; _node
NODE_SHUTDOWN: MapSpec[NodeShutdownState] = MapSpec(
    "node-shutdown", _encode, NodeShutdownState.from_wire, "nodeshutdown")  # state -> value
_POD_SETS: dict[str, MapSpec[PodSetValue]] = {
    source: MapSpec(f"pods-{source}", _encode, PodSetValue.from_wire, f"source-{source}")
    for source in POD_SOURCES}  # set -> PodSetValue

_ALL: tuple[MapSpec[Any], ...] = (DESIRED, PLEG, PROBES, STATUSES, API_MIRRORS, PRESSURE,
                                  VOLUMES, NODE_SHUTDOWN, *_POD_SETS.values())
MAPS: Mapping[str, MapSpec[Any]] = {spec.name: spec for spec in _ALL}  # every map, by name


def pods_map(source: str) -> MapSpec[PodSetValue]:
    """The map of one source's pod set: ``pods-file``, ``pods-http``, ``pods-api`` (owner:
    that source; key ``set``)."""
    spec = _POD_SETS.get(source)
    if spec is None:
        raise UndeclaredMap(f"no pod source {source!r} (declared: {', '.join(POD_SOURCES)})")
    return spec


def declared(name: str) -> MapSpec[Any]:
    """The spec of the map called ``name``; ``UndeclaredMap`` when there is none."""
    spec = MAPS.get(name)
    if spec is None:
        raise UndeclaredMap(f"map {name!r} is not declared in ipc/maps.py "
                            f"(declared: {', '.join(sorted(MAPS))})")
    return spec
