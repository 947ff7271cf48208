"""RunOnce, the kubelet's ``--runonce``: run the sources' first sets once, report, exit.

``plan`` turns the sources' first sets into the pods to run: each source's pods (in source
order, through the same merge as the sync loop, so a duplicate name is left out as there) then
admission one pod at a time against the pods admitted before it, as the kubelet's
``canAdmitPod``; a bad manifest and a rejected pod are results, never a reason to stop.

``run_pod`` is the kubelet's ``runPod``: read the pod's runtime state; done when every regular
container runs (or has completed: exited 0 under a restart policy that does not restart it);
otherwise SyncPod (the sync loop's own ``sync_pod``), wait, double the wait, and try again, at
most ``tries`` SyncPods (KUBELET.md: 10 tries, 1 s doubling). A runtime that is down (a killed
embedded runtime restarting) only costs tries. ``run_pods`` runs every pod in parallel. Pods are
left running; nothing here stops them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from podvisor.services.cri import CriError
from podvisor.services.pod import Pod, PodValidationError, RestartPolicy, pod_from_wire
from podvisor.services.syncloop.admission import admit
from podvisor.services.syncloop.podconfig import PodOp, new_pod_config
from podvisor.services.syncloop.runtime_state import ContainerState, PodRuntime, read_pod_runtime
from podvisor.services.syncloop.syncpod import SyncDeps, sync_pod

__all__ = ["PodResult", "RetryPolicy", "plan", "pod_started", "run_pod", "run_pods"]

RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
REJECTED = "rejected"
INVALID = "invalid"


@dataclass(frozen=True)
class PodResult:
    """One line of the RunOnce report."""

    pod: str       # namespace/name (for an invalid input: its file or URL)
    ok: bool
    state: str     # running | succeeded | failed | rejected | invalid
    message: str = ""
    tries: int = 0  # SyncPods it took
    uid: str = ""

    def line(self) -> str:
        tries = f" after {self.tries} {'try' if self.tries == 1 else 'tries'}" \
            if self.state in (RUNNING, SUCCEEDED, FAILED) else ""
        why = f": {self.message}" if self.message else ""
        return f"pod {self.pod}: {self.state}{tries}{why}"

    def to_dict(self) -> dict[str, Any]:
        return {"pod": self.pod, "uid": self.uid, "ok": self.ok, "state": self.state,
                "message": self.message, "tries": self.tries}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PodResult:
        return cls(pod=str(raw["pod"]), ok=bool(raw["ok"]), state=str(raw["state"]),
                   message=str(raw.get("message", "")), tries=int(raw.get("tries", 0)),
                   uid=str(raw.get("uid", "")))


@dataclass(frozen=True)
class RetryPolicy:
    tries: int = 10      # SyncPods at most (the kubelet's runOnceMaxRetries)
    delay: float = 1.0   # first wait after a SyncPod (runOnceRetryDelay)
    factor: float = 2.0  # the wait grows by this (runOnceRetryDelayBackoff)


def _name(pod: Pod) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def plan(sets: Mapping[str, Mapping[str, Any]]) -> tuple[list[Pod], list[PodResult]]:
    """The pods to run and the results already known (invalid inputs, duplicates, rejected
    pods), from each source's first set (``{"pods": [wire pods], "errors": [...]}``)."""
    config = new_pod_config(set(sets))
    known: list[PodResult] = []
    candidates: list[Pod] = []
    for source in sorted(sets):
        parsed: list[Pod] = []
        for err in sets[source].get("errors", []):
            where = str(err.get("file") or err.get("url") or source)
            what = f"{err['field']}: {err['reason']}" if err.get("field") else err.get("reason")
            known.append(PodResult(where, False, INVALID, str(what)))
        for raw in sets[source].get("pods", []):
            try:
                parsed.append(pod_from_wire(raw, where=f"{source} set"))
            except PodValidationError as exc:
                known.append(PodResult(f"{source} set", False, INVALID, str(exc)))
        for update in config.apply(source, parsed):
            if update.op is PodOp.ADD:
                candidates.extend(update.pods)
        for dup in config.duplicates(source):
            known.append(PodResult(dup.full_name, False, REJECTED,
                                   f"{dup.reason} ({dup.location}; kept {dup.kept_location})",
                                   uid=dup.uid))
    admitted: list[Pod] = []
    for pod in candidates:
        rejection = admit(pod, admitted)
        if rejection is None:
            admitted.append(pod)
        else:
            known.append(PodResult(_name(pod), False, REJECTED,
                                   f"{rejection.reason}: {rejection.message}", uid=pod.uid))
    return admitted, known


def pod_started(pod: Pod, rt: PodRuntime) -> str | None:
    """``running`` or ``succeeded`` once every regular container runs or has completed (exited
    0 and its restart policy will not restart it); None while one has not."""
    completed = 0
    for spec in pod.spec.containers:
        latest = rt.latest(spec.name)
        if latest is None:
            return None
        if latest.state is ContainerState.RUNNING:
            continue
        if latest.state is ContainerState.EXITED and latest.exit_code == 0 \
                and pod.spec.restart_policy is not RestartPolicy.ALWAYS:
            completed += 1
            continue
        return None
    return SUCCEEDED if completed == len(pod.spec.containers) else RUNNING


def run_pod(deps: SyncDeps, pod: Pod, policy: RetryPolicy,
            wait: Callable[[float], bool]) -> PodResult:
    """Sync ``pod`` until its containers run, at most ``policy.tries`` times. ``wait(s)``
    sleeps and returns True when the run is being stopped (then the pod fails as
    interrupted)."""
    delay, problem = policy.delay, ""
    for tries in range(policy.tries + 1):
        try:
            state = pod_started(pod, read_pod_runtime(deps.cri, pod.uid, deps.mono, deps.wall))
        except CriError as err:
            state, problem = None, str(err)
        if state is not None:
            deps.log.info("syncloop.runonce.pod_started", pod=pod.full_name, pod_uid=pod.uid,
                          state=state, tries=tries)
            return PodResult(_name(pod), True, state, tries=tries, uid=pod.uid)
        if tries == policy.tries:
            break
        try:
            result = sync_pod(deps, pod)
            if result.errors:
                problem = "; ".join(result.errors)
            elif result.waiting and not problem:
                problem = "; ".join(f"{name}: {w.reason}: {w.message}".rstrip(": ")
                                    for name, w in sorted(result.waiting.items()))
        except CriError as err:  # the runtime down or a pod-level call failed: try again
            problem = str(err)
            deps.log.warning("syncloop.runonce.sync_failed", pod=pod.full_name,
                             pod_uid=pod.uid, error=problem, tries=tries + 1)
        if wait(delay):
            return PodResult(_name(pod), False, FAILED, "interrupted", tries + 1, pod.uid)
        delay *= policy.factor
    message = f"containers not running after {policy.tries} tries"
    if problem:
        message += f" ({problem})"
    deps.log.warning("syncloop.runonce.pod_failed", pod=pod.full_name, pod_uid=pod.uid,
                     message=message)
    return PodResult(_name(pod), False, FAILED, message, policy.tries, pod.uid)


def run_pods(deps: SyncDeps, pods: Sequence[Pod], policy: RetryPolicy,
             wait: Callable[[float], bool]) -> list[PodResult]:
    """``run_pod`` for every pod at once (one thread each); results in ``pods`` order. A bug
    in one pod's run is that pod's failure."""
    results: list[PodResult | None] = [None] * len(pods)

    def one(i: int, pod: Pod) -> None:
        try:
            results[i] = run_pod(deps, pod, policy, wait)
        except Exception as exc:  # one pod never takes the run down
            deps.log.exception("syncloop.runonce.crashed", pod=pod.full_name, pod_uid=pod.uid)
            results[i] = PodResult(_name(pod), False, FAILED, f"internal error: {exc}",
                                   uid=pod.uid)

    threads = [threading.Thread(target=one, args=(i, p), name=f"runonce-{i}", daemon=True)
               for i, p in enumerate(pods)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]
