"""Every message that travels on the bus, declared once.

Each message is a frozen dataclass with ``TYPE`` (unique), ``VERSION`` (bumped on any incompatible
change) and ``TOPIC`` (``<subsystem>.<entity>.<event>``; subscribers filter on topic prefixes).
Fields hold msgpack-able values only. Encoding happens only in ``podvisor.ipc.codec``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Message:
    TYPE: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    TOPIC: ClassVar[str] = ""


# --- supervisor ---


@dataclass(frozen=True)
class ProcessStateChanged(Message):
    """A supervised process moved from one state to another (every transition is published)."""

    TYPE: ClassVar[str] = "supervisor.process.state"
    TOPIC: ClassVar[str] = "supervisor.process.state"
    name: str
    from_state: str
    to_state: str
    pid: int | None
    restarts: int
    exit_code: int | None = None
    exit_signal: int | None = None
    reason: str = ""
    ts: float = 0.0


@dataclass(frozen=True)
class ProcessHeartbeat(Message):
    """A RUNNING process's heartbeat went late (``late``: no beat for ``age`` seconds, three
    ``heartbeatInterval``s; said only when that is before ``heartbeatTimeout`` kills it), or
    came back.
    Published on a sub-topic of the state changes, so whoever follows the states (the ops
    dashboard) hears it too; sent on the two edges only, never per beat."""

    TYPE: ClassVar[str] = "supervisor.process.heartbeat"
    TOPIC: ClassVar[str] = "supervisor.process.state.heartbeat"
    name: str
    pid: int | None
    late: bool
    age: float
    ts: float = 0.0


# --- clone-pattern replicated maps (ipc/clone.py) ---


@dataclass(frozen=True)
class MapUpdate(Message):
    """One sequenced change to a replicated map. Published on topic ``clone.<map>.update``."""

    TYPE: ClassVar[str] = "clone.map.update"
    TOPIC: ClassVar[str] = "clone"
    map: str
    epoch: str
    seq: int
    key: str
    value: Any = None
    deleted: bool = False


@dataclass(frozen=True)
class MapHeartbeat(Message):
    """The owner's current sequence, sent when idle so replicas notice a lost tail update."""

    TYPE: ClassVar[str] = "clone.map.heartbeat"
    TOPIC: ClassVar[str] = "clone"
    map: str
    epoch: str
    seq: int


# --- pleg ---


@dataclass(frozen=True)
class PodLifecycleEvent(Message):
    """A container of a pod changed state in the runtime (kubelet PodLifecycleEvent).

    ``type``: ContainerStarted | ContainerDied | ContainerRemoved | PodSync | ContainerChanged.
    ``container_id`` names the container or sandbox; ``ts`` is time.monotonic of the relist."""

    TYPE: ClassVar[str] = "pleg.pod.event"
    TOPIC: ClassVar[str] = "pleg.pod.event"
    pod_uid: str
    type: str
    container_id: str
    ts: float


# --- pod sources ---


# --- syncloop ---


@dataclass(frozen=True)
class StopAllPods(Message):
    """Ask the sync loop to terminate every pod (each within its grace) and admit no new one
    until it restarts (``podvisorctl shutdown --pods``; also what SIGTERM does with
    ``stopPodsOnExit``). The sync loop answers with ``AllPodsStopped`` once none is left."""

    TYPE: ClassVar[str] = "syncloop.pods.stopall"
    TOPIC: ClassVar[str] = "syncloop.pods.stopall"
    reason: str = ""
    ts: float = 0.0


@dataclass(frozen=True)
class FailPod(Message):
    """Ask the sync loop to fail one pod for good, as the kubelet's eviction manager and
    activeDeadlineHandler do: every container is stopped (within ``grace`` seconds; None: the
    pod's ``terminationGracePeriodSeconds``), none is started again, and the pod's status says
    phase Failed with ``reason`` and ``message``; an Event of ``event_type`` ("Normal" or
    "Warning") says the same. The pod stays (a source deletes it); a second FailPod of a pod
    already failed changes nothing. The sync loop's own deadline (reason DeadlineExceeded) goes
    the same way (``SyncLoop.fail_pod``). The bus may drop a message: the requester reads the
    ``desired`` map and publishes again until the pod's entry says ``failed``."""

    TYPE: ClassVar[str] = "syncloop.pod.fail"
    TOPIC: ClassVar[str] = "syncloop.pod.fail"
    uid: str
    reason: str
    message: str
    grace: int | None = None
    event_type: str = "Warning"
    ts: float = 0.0


@dataclass(frozen=True)
class ReclaimNodeResources(Message):
    """The eviction manager asks for node-level reclaim before it evicts a pod for a disk
    signal (the kubelet's ``reclaimNodeLevelResources`` over its ``nodeReclaimFuncs``): the
    ``imagegc`` process removes every unused dead container (``containers``: the kubelet's
    ``DeleteAllUnusedContainers``: all of those of terminated and removed pods) and then every
    unused image (``images``: ``DeleteUnusedImages``), and answers ``NodeResourcesReclaimed``
    with the same ``id``. Published again (same ``id``) until answered: a repeated ``id`` is
    answered again, not reclaimed twice. ``signal``: the threshold's signal (logs)."""

    TYPE: ClassVar[str] = "eviction.node.reclaim"
    TOPIC: ClassVar[str] = "eviction.node.reclaim"
    id: str
    signal: str
    containers: bool = True
    images: bool = True
    ts: float = 0.0


@dataclass(frozen=True)
class NodeResourcesReclaimed(Message):
    """``imagegc``'s answer to ``ReclaimNodeResources`` ``id``, once done: how many dead
    containers, sandboxes and images it removed, the images' bytes, and ``errors`` (a CRI
    call that failed; what could be removed was)."""

    TYPE: ClassVar[str] = "imagegc.node.reclaimed"
    TOPIC: ClassVar[str] = "imagegc.node.reclaimed"
    id: str
    containers: int = 0
    sandboxes: int = 0
    images: int = 0
    image_bytes: int = 0
    errors: str = ""
    ts: float = 0.0


@dataclass(frozen=True)
class NodeShutdown(Message):
    """Ask the ``nodeshutdown`` process for a graceful node shutdown (``podvisorctl shutdown
    --node``; SIGTERM with ``shutdownOnSignal``): the Node goes NotReady, pods are failed
    (reason ``Terminated``) group by group in priority order, then it answers
    ``NodeShutdownDone`` and the agent exits. The supervisor publishes it again until the
    answer comes (a second request of a shutdown under way changes nothing)."""

    TYPE: ClassVar[str] = "supervisor.node.shutdown"
    TOPIC: ClassVar[str] = "supervisor.node.shutdown"
    reason: str = ""
    ts: float = 0.0


@dataclass(frozen=True)
class NodeShutdownDone(Message):
    """Every priority group of a graceful node shutdown is terminated (or its period ran
    out): the agent stops now. ``pods``: how many pods were failed; ``trigger``: "request"
    (``NodeShutdown``) or "logind" (PrepareForShutdown). Published again every second until
    the process is stopped."""

    TYPE: ClassVar[str] = "nodeshutdown.node.done"
    TOPIC: ClassVar[str] = "nodeshutdown.node.done"
    pods: int
    trigger: str = ""
    ts: float = 0.0


@dataclass(frozen=True)
class AllPodsStopped(Message):
    """Every pod the sync loop knew is terminated (``pods``: how many it stopped)."""

    TYPE: ClassVar[str] = "syncloop.pods.stopped"
    TOPIC: ClassVar[str] = "syncloop.pods.stopped"
    pods: int
    ts: float = 0.0


@dataclass(frozen=True)
class RelistHint(Message):
    """The sync loop has just changed containers in the runtime (created, started, stopped,
    removed): PLEG may relist now rather than at its next period. Published at most once per
    turn of the sync loop's main loop, and only while the runtime has no event stream; PLEG
    coalesces and bounds the relists it triggers (services/pleg/main.py)."""

    TYPE: ClassVar[str] = "syncloop.relist.hint"
    TOPIC: ClassVar[str] = "syncloop.relist.hint"
    ts: float = 0.0


# --- events ---


@dataclass(frozen=True)
class Event(Message):
    """A Kubernetes-style event (``kubectl get events``): something an operator should see.

    ``type``: "Normal" | "Warning". ``reason``: a short CamelCase code (``FailedValidation``,
    ``FileTooLarge``, ``DuplicatePodName``, ``Started``, ``Killing``, ``BackOff``, ...).
    ``object``: ``{kind, name, namespace, uid, file, fieldPath}`` (absent keys = unknown; a
    manifest that failed to parse has only ``kind: "Manifest"`` and ``file``). ``source``: the
    publishing process. ``count``/``first_ts``/``last_ts`` (wall clock): the publisher may
    pre-aggregate; the keeper (the supervisor) aggregates identical events again.
    Published with ``Publisher.publish`` (never blocks; a dropped event is counted, not retried).
    """

    TYPE: ClassVar[str] = "events.event.recorded"
    TOPIC: ClassVar[str] = "events.event.recorded"
    type: str
    reason: str
    message: str
    object: dict[str, Any]
    source: str
    count: int = 1
    first_ts: float = 0.0
    last_ts: float = 0.0


# --- test and benchmark traffic ---


@dataclass(frozen=True)
class Probe(Message):
    """Free-form payload for bus tests and benchmarks; no subsystem consumes it."""

    TYPE: ClassVar[str] = "bus.probe.sent"
    TOPIC: ClassVar[str] = "bus.probe.sent"
    n: int
    payload: dict[str, Any] = field(default_factory=dict)
