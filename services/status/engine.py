"""The status engine: which statuses to (re)compute, retire and publish. No I/O.

``StatusEngine.reconcile(desired, pleg, now, mono, probes, only)`` recomputes the status of every
pod (or of the pods in ``only``: those whose inputs changed) from the replicated maps (``desired``
from syncloop, ``pleg`` from pleg) and returns the changes to apply to the ``statuses`` map.
It refuses to run (returns None) while the PLEG cache is not usable:

- no ``_health`` yet: an empty map from a PLEG that has not relisted must not turn Running pods
  into Pending;
- ``_health.ts`` older than the cache the current statuses were computed from (``pleg_ts``,
  persisted with them): a restarted status process never recomputes loaded statuses from an
  older view of the runtime. A persisted ``pleg_ts`` ahead of the monotonic clock (the machine
  rebooted: CLOCK_MONOTONIC restarted) is dropped.

Statuses of pods that left ``desired`` are retired (kept for ``RETIRE_AFTER`` seconds) so a pod
that comes back resumes its versions and transition times.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from podvisor.ipc.maps import (
    HEALTH_KEY,
    DesiredPod,
    DesiredValue,
    PlegHealth,
    PlegPod,
    PlegValue,
    PodProbes,
    PodStatusValue,
)
from podvisor.ipc.podstatus import PodCondition, PodStatus
from podvisor.services.pod import PodValidationError, WirePods
from podvisor.services.prober import probe_verdicts
from podvisor.services.status.compute import compute_pod_status
from podvisor.services.status.store import Retired, Saved

RETIRE_AFTER = 600.0


@dataclass(frozen=True)
class Transition:
    """A pod condition that changed status (for the log)."""

    uid: str
    type: str
    old: str | None
    new: str
    at: str


@dataclass(frozen=True)
class Changes:
    set: dict[str, PodStatusValue] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    invalid: dict[str, str] = field(default_factory=dict)  # pod UID -> why it has no status

    def __bool__(self) -> bool:
        return bool(self.set or self.deleted)


def _conditions(status: PodStatus | None) -> dict[str, PodCondition]:
    return {c.type: c for c in status.conditions} if status is not None else {}


def transitions(uid: str, old: PodStatus | None, new: PodStatus) -> list[Transition]:
    before = _conditions(old)
    out = []
    for ctype, cond in _conditions(new).items():
        prev = before.get(ctype)
        if prev is None or prev.status != cond.status or \
                prev.last_transition_time != cond.last_transition_time:
            out.append(Transition(uid, ctype, prev.status if prev else None, cond.status,
                                  str(cond.last_transition_time)))
    return out


def pleg_ts(pleg: Mapping[str, PlegValue]) -> float | None:
    """The cache's freshness (``_health.ts``), None when PLEG has not relisted."""
    health = pleg.get(HEALTH_KEY)
    return health.ts if isinstance(health, PlegHealth) else None


class StatusEngine:
    def __init__(self, saved: Saved, runtime: str = "embedded",
                 host_ips: tuple[str, ...] = ("127.0.0.1",),
                 log_transitions: bool = True) -> None:
        self.statuses: dict[str, PodStatusValue] = dict(saved.statuses)
        self.retired: dict[str, Retired] = dict(saved.retired)
        self.pleg_ts = saved.pleg_ts
        self.pods = WirePods()  # the typed pod of each ``desired`` entry
        self._runtime = runtime
        self._host_ips = host_ips  # the node's addresses: hostIP(s), a hostNetwork pod's IPs
        self.log_transitions = log_transitions  # fill ``Changes.transitions`` (for a debug log)

    def saved(self) -> Saved:
        return Saved(dict(self.statuses), dict(self.retired), self.pleg_ts)

    def usable(self, pleg: Mapping[str, PlegValue], mono: float) -> bool:
        """Whether ``pleg`` may be computed from (see the module docstring)."""
        if self.pleg_ts > mono:
            self.pleg_ts = 0.0  # persisted before a reboot: meaningless now
        ts = pleg_ts(pleg)
        return ts is not None and ts >= self.pleg_ts

    def reconcile(
        self, desired: Mapping[str, DesiredValue], pleg: Mapping[str, PlegValue], now: float,
        mono: float, probes: Mapping[str, PodProbes] | None = None,
        only: Collection[str] | None = None,
    ) -> Changes | None:
        """``now``: wall seconds (written into statuses); ``mono``: CLOCK_MONOTONIC seconds;
        ``probes``: the prober's ``probes`` map (readiness and startup verdicts); ``only``: the
        pods whose inputs changed (None: every pod; a pod's status depends only on its own
        ``desired``, ``pleg`` and ``probes`` entries, so the others cannot change). A
        ``desired`` pod that is not a validated wire form (a bug upstream) gets no status and
        is named in ``Changes.invalid``."""
        if not self.usable(pleg, mono):
            return None
        changes = Changes()
        uids = desired.keys() if only is None else sorted(set(only) & desired.keys())
        for uid in uids:
            entry = desired[uid]
            if not isinstance(entry, DesiredPod):
                continue
            try:
                pod = self.pods.get(uid, entry.pod)
            except PodValidationError as err:
                changes.invalid[uid] = err.summary()
                continue
            previous = self.statuses.get(uid)
            if previous is None and uid in self.retired:
                previous = self.retired.pop(uid).value
            record = pleg.get(uid)
            record = record if isinstance(record, PlegPod) else None
            ready, started = probe_verdicts((probes or {}).get(uid), record)
            value = compute_pod_status(entry, pod, record, previous, now, self._runtime,
                                       self._host_ips, ready, started)
            if value != previous or uid not in self.statuses:
                self.statuses[uid] = value
                changes.set[uid] = value
                if self.log_transitions:
                    changes.transitions.extend(transitions(
                        uid, previous.status if previous is not None else None, value.status))
        for uid in sorted(self.statuses.keys() - desired.keys()):
            self.retired[uid] = Retired(self.statuses.pop(uid), now)
            changes.deleted.append(uid)
        if only is None:
            self.expire(now)
            self.pods.retain(desired.keys())
        if changes:
            self.pleg_ts = max(self.pleg_ts, pleg_ts(pleg) or 0.0)
        return changes

    def expire(self, now: float) -> bool:
        """Forget retired statuses older than ``RETIRE_AFTER`` (``now``: wall seconds).
        Returns whether any was forgotten."""
        expired = False
        for uid, retired in list(self.retired.items()):
            if now - retired.at > RETIRE_AFTER:
                del self.retired[uid]
                expired = True
        return expired
