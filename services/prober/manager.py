"""The prober's brain: which workers exist, which probes are due, what the ``probes`` map says.
Pure (no I/O, no clock of its own): the process feeds it the ``desired`` and ``pleg`` maps,
runs the probes it hands out and reports their outcomes.

``probes`` map value (key = pod UID), one item per container that runs and has a probe:
``{name: {"container_id", "ready": bool|None, "started": bool|None,
"liveness": "success"|"failure"|None, "failed_probe": "liveness"|"startup"|None, "ts"}}``:
``ready`` None = no readiness probe, else the readiness verdict (False until the startup probe
succeeded); ``started`` None = no startup probe; ``liveness`` is "failure" when the liveness
probe, or the startup probe, failed past its threshold: the sync loop kills the container;
``failed_probe`` says which; ``ts`` (monotonic) is when the verdict last changed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from podvisor.ipc.maps import DesiredPod, PlegContainer, PlegPod
from podvisor.services.pod import Container, Pod, PodValidationError, Probe, pod_from_wire
from podvisor.services.prober.worker import (
    ContainerObs,
    Kind,
    ProbeWorker,
    Rand,
    Result,
    Seed,
    Timing,
)

RUNNING = "CONTAINER_RUNNING"
LOCALHOST = "127.0.0.1"
SEED_GRACE = 60.0  # persisted results wait this long for their pod to reappear in ``desired``

WorkerKey = tuple[str, str, Kind]  # (pod uid, container name, kind)


@dataclass(frozen=True)
class Target:
    """Where a probe goes: the pod's IP (127.0.0.1 for host-network pods) and named ports."""

    host: str
    ports: Mapping[str, int]
    container_id: str


@dataclass(frozen=True)
class ProbeTask:
    key: WorkerKey
    probe: Probe
    target: Target


def timing_of(probe: Probe) -> Timing:
    return Timing(float(probe.initial_delay_seconds), float(probe.period_seconds),
                  float(probe.timeout_seconds), probe.success_threshold, probe.failure_threshold)


def probed(pod: Pod) -> tuple[Container, ...]:
    """The containers the kubelet probes: sidecars (restartable init containers) and regular
    containers (an init container that runs to completion has no probes)."""
    return pod.spec.sidecars + pod.spec.containers


def probes_of(pod: Pod, name: str) -> dict[Kind, Probe]:
    for c in probed(pod):
        if c.name == name:
            found = {Kind.LIVENESS: c.liveness_probe, Kind.READINESS: c.readiness_probe,
                     Kind.STARTUP: c.startup_probe}
            return {k: p for k, p in found.items() if p is not None}
    return {}


def newest(record: PlegPod | None, name: str) -> PlegContainer | None:
    mine = [c for c in record.containers if c.name == name] if record is not None else []
    if not mine:
        return None
    return max(mine, key=lambda c: (c.created_at, c.id))


def observe(record: PlegContainer | None, now: float, wall: float) -> ContainerObs | None:
    if record is None or not record.id:
        return None
    started_ns = record.started_at
    started = now - max(0.0, wall - started_ns / 1e9) if started_ns else 0.0
    return ContainerObs(record.id, record.state == RUNNING, started)


def pod_ip(pod: Pod, pleg: PlegPod | None) -> str:
    if pod.spec.host_network:
        return LOCALHOST
    sandboxes = list(pleg.sandboxes) if pleg is not None else []
    ready = [s for s in sandboxes if s.state == "SANDBOX_READY"]
    last = (ready or sandboxes)[-1:]
    return (last[0].ip if last else "") or LOCALHOST


def seeds_from(entry: Mapping[str, Any]) -> dict[Kind, Seed]:
    """The worker results a persisted ``probes`` item stands for."""
    cid = str(entry.get("container_id", ""))
    failed = entry.get("failed_probe")
    out: dict[Kind, Seed] = {}
    if entry.get("ready") is not None:
        out[Kind.READINESS] = Seed(cid, Result.SUCCESS if entry["ready"] else Result.FAILURE)
    if failed == "startup":
        out[Kind.STARTUP] = Seed(cid, Result.FAILURE, on_hold=True)
    elif entry.get("started"):
        out[Kind.STARTUP] = Seed(cid, Result.SUCCESS)
    if failed == "liveness":
        out[Kind.LIVENESS] = Seed(cid, Result.FAILURE, on_hold=True)
    return out


def _ignore_invalid(uid: str, err: PodValidationError) -> None:
    pass


_PROBE_KEYS = ("livenessProbe", "readinessProbe", "startupProbe")


def declares_probes(raw_pod: Any) -> bool:
    """Whether a ``desired`` pod dict may declare a probe: False only when every container is
    a mapping without any probe key (such a pod has no workers, whatever else it says, so it
    is not even parsed); anything malformed is True (parsed, as before)."""
    spec = raw_pod.get("spec") if isinstance(raw_pod, Mapping) else None
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if not isinstance(containers, list):
        return True
    return any(not isinstance(c, Mapping) or any(c.get(k) is not None for k in _PROBE_KEYS)
               for c in containers)


def _active(entry: Any) -> TypeGuard[DesiredPod]:
    return isinstance(entry, DesiredPod) and entry.active


class ProbeManager:
    def __init__(self, rand: Rand, prober_started: float,
                 seeds: Mapping[str, Mapping[str, Any]] | None = None,
                 on_invalid: Callable[[str, PodValidationError], None] = _ignore_invalid
                 ) -> None:
        """``on_invalid(uid, error)``: a ``desired`` pod that is not a validated wire form (a
        bug upstream: the sync loop publishes validated pods only); it gets no workers."""
        self._rand = rand
        self._started = prober_started
        self.workers: dict[WorkerKey, ProbeWorker] = {}
        self._obs: dict[WorkerKey, ContainerObs | None] = {}
        self._targets: dict[tuple[str, str], Target] = {}
        self._probe: dict[WorkerKey, Probe] = {}
        self._keys: dict[str, set[WorkerKey]] = {}  # each pod's workers
        self._on_invalid = on_invalid
        # (pod uid, container name) -> a saved verdict, until its container is seen (or the grace
        # ends), and the verdicts last handed out (what ``entries`` keeps ``ts`` against)
        self._seeds: dict[tuple[str, str], Mapping[str, Any]] = {
            (uid, str(name)): item for uid, v in (seeds or {}).items() if isinstance(v, Mapping)
            for name, item in v.items()}
        self._seed_until: float | None = None
        self._verdicts: dict[tuple[str, str], Mapping[str, Any]] = dict(self._seeds)

    # --- inputs ---
    def update(self, desired: Mapping[str, Any], pleg: Mapping[str, Any], now: float,
               wall: float, only: Collection[str] | None = None) -> None:
        """Reconcile workers with the pods and containers; call on any change of either map.
        ``only``: the pod UIDs whose ``desired`` or ``pleg`` entry changed (None: every pod;
        a pod's workers depend on its own entries only)."""
        if self._seed_until is None:
            self._seed_until = now + SEED_GRACE
        elif now > self._seed_until:
            self._seeds.clear()
        if only is None:
            uids = {u for u, e in desired.items() if _active(e)}
            scope: Collection[str] = uids | self._keys.keys()
        else:
            scope = only
        for uid in scope:
            self._update_uid(uid, desired.get(uid), pleg.get(uid), now, wall)

    def _update_uid(self, uid: str, entry: Any, record: PlegPod | None, now: float,
                    wall: float) -> None:
        pod = None
        if _active(entry) and declares_probes(entry.pod):
            try:  # validated by its source: a trusted rebuild, no second validation
                pod = pod_from_wire(entry.pod, where=f"desired[{uid}]")
            except PodValidationError as err:
                self._on_invalid(uid, err)
        old = self._keys.pop(uid, set())
        for key_uid, name, _kind in old:  # a target exists only beside a worker
            self._targets.pop((key_uid, name), None)
        wanted = set() if pod is None else self._update_pod(uid, pod, record, now, wall)
        for key in old - wanted:
            self.workers.pop(key, None)
            self._obs.pop(key, None)
            self._probe.pop(key, None)
        if wanted:
            self._keys[uid] = wanted

    def _update_pod(self, uid: str, pod: Pod, record: PlegPod | None, now: float,
                    wall: float) -> set[WorkerKey]:
        keys: set[WorkerKey] = set()
        ip: str | None = None  # only pods with a probe need it
        for c in probed(pod):
            probes = probes_of(pod, c.name)
            if not probes:
                continue
            if ip is None:
                ip = pod_ip(pod, record)
            obs = observe(newest(record, c.name), now, wall)
            if obs is not None:
                ports = {p.name: p.container_port for p in c.ports if p.name}
                self._targets[(uid, c.name)] = Target(ip, ports, obs.container_id)
            seeds = seeds_from(self._seeds.get((uid, c.name)) or {})
            for kind, probe in probes.items():
                key = (uid, c.name, kind)
                keys.add(key)
                w = self.workers.get(key)
                if w is None or self._probe.get(key) != probe:
                    w = ProbeWorker(kind, timing_of(probe), now, self._started, self._rand,
                                    seeds.get(kind))
                    self.workers[key] = w
                    self._probe[key] = probe
                w.observe(obs, now)
                self._obs[key] = obs
            if obs is not None:
                self._seeds.pop((uid, c.name), None)
        return keys

    def concerns(self, uid: str, entry: Any = None) -> bool:
        """Whether a change of pod ``uid``'s entries may change its workers: it has some, or
        its new ``desired`` ``entry`` declares a probe. A pod without workers whose new entry
        declares none keeps none (its ``pleg`` changes, its ``sandbox_id`` or ``worker``
        state, its deletion: nothing to do)."""
        return uid in self._keys or (isinstance(entry, DesiredPod)
                                     and declares_probes(entry.pod))

    def started(self, uid: str, name: str) -> bool:
        w = self.workers.get((uid, name, Kind.STARTUP))
        return w is None or w.result is Result.SUCCESS

    # --- probing ---
    def due(self, now: float) -> list[ProbeTask]:
        """The probes to run now (each worker has at most one in flight)."""
        tasks = []
        for key in sorted(self.workers, key=lambda k: k[2] != Kind.STARTUP):
            w = self.workers[key]
            if w.next_due > now:
                continue
            uid, name, _ = key
            if w.tick(self._obs.get(key), now, self.started(uid, name)):
                target = self._targets.get((uid, name))
                if target is None or target.container_id != w.container_id:
                    w.in_flight = False
                    continue
                tasks.append(ProbeTask(key, self._probe[key], target))
        return tasks

    def complete(self, task: ProbeTask, outcome: Result, now: float) -> bool:
        """Record an outcome; True when the container's verdict may have changed. A startup
        probe that succeeds makes the container's other probes due at once."""
        w = self.workers.get(task.key)
        if w is None or not w.complete(task.target.container_id, outcome):
            return False
        uid, name, kind = task.key
        if kind is Kind.STARTUP and w.result is Result.SUCCESS:
            for other in (Kind.LIVENESS, Kind.READINESS):
                if (o := self.workers.get((uid, name, other))) is not None:
                    o.next_due = min(o.next_due, max(now, o.first_due))
        return True

    def next_deadline(self) -> float | None:
        return min((w.next_due for w in self.workers.values()), default=None)

    # --- output ---
    def entries(self, now: float) -> dict[str, dict[str, Any]]:
        """The ``probes`` map as it should be now (``ts`` kept while a verdict holds)."""
        out: dict[str, dict[str, Any]] = {}
        verdicts: dict[tuple[str, str], Mapping[str, Any]] = {}
        for (uid, name), target in self._targets.items():
            value = self._verdict(uid, name, target.container_id)
            if value is None:
                continue
            old = self._verdicts.get((uid, name))
            same = old is not None and {k: v for k, v in old.items() if k != "ts"} == value
            value["ts"] = old["ts"] if same and old is not None else now
            out.setdefault(uid, {})[name] = verdicts[(uid, name)] = value
        self._verdicts = verdicts
        return out

    def _verdict(self, uid: str, name: str, cid: str) -> dict[str, Any] | None:
        obs = self._obs.get((uid, name, Kind.LIVENESS)) or self._obs.get(
            (uid, name, Kind.READINESS)) or self._obs.get((uid, name, Kind.STARTUP))
        if obs is None or not obs.running or obs.container_id != cid:
            return None
        ws = {k: self.workers.get((uid, name, k)) for k in Kind}
        started = self.started(uid, name)
        ready = ws[Kind.READINESS]
        startup, live = ws[Kind.STARTUP], ws[Kind.LIVENESS]
        failed = None
        if startup is not None and startup.result is Result.FAILURE:
            failed = "startup"
        elif live is not None and live.result is Result.FAILURE:
            failed = "liveness"
        liveness = None
        if failed is not None:
            liveness = "failure"
        elif live is not None:
            liveness = "success"
        return {"container_id": cid,
                "ready": None if ready is None else (started and ready.result is Result.SUCCESS),
                "started": None if startup is None else startup.result is Result.SUCCESS,
                "liveness": liveness, "failed_probe": failed}

