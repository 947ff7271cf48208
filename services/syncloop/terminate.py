"""Stopping containers and tearing a pod down, as the kubelet's killContainer / killPod.

Grace: the caller gives it (deletion grace, else the kill override, else the pod's
``terminationGracePeriodSeconds``). Per container, in parallel: run the preStop hook (exec
through ``exec_sync`` or a sleep) within the grace, then ``StopContainer`` with what is left of
it, never less than 2 s between TERM and KILL. Tearing down then stops and removes the
sandboxes and containers, and the pod's folder (emptyDir volumes, ...; never across a
mount point: ``remove_pod_dir``).

Sidecars stop last (the kubelet's ``terminationOrdering``): when a whole pod with restartable
init containers is killed, each sidecar runs its preStop hook at once like the others, then
waits (within the grace) until every regular container and every later sidecar has stopped
before it is sent its signal; so sidecars stop in reverse order, after the app.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from podvisor.common.crashpoints import NEVER, CrashPoints
from podvisor.common.logs import Log
from podvisor.common.mountinfo import host_mounts, mounts_under
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.pod import Pod, recorded_handler, recorded_ports
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.hooks import HookTarget, run_hook
from podvisor.services.syncloop.initactions import LIVENESS_FAILED, STARTUP_FAILED
from podvisor.services.syncloop.runtime_state import ContainerInfo, PodRuntime, read_pod_runtime

MIN_KILL_GRACE = 2
# the volume manager's folders (issue 24: the volume plugins' too; a FlexVolume driver's is its
# ``vendor~driver`` name, any folder not named ``kubernetes.io~...``)
MANAGED = ("kubernetes.io~csi", "kubernetes.io~local-volume", "kubernetes.io~nfs",
           "kubernetes.io~iscsi", "kubernetes.io~fc")
DEFAULT_GRACE = 30


def _sandbox_ips(cri: RuntimeClient, sandbox_id: str) -> list[str]:
    """The pod's IPs from its sandbox's status (none: a hostNetwork pod, or the runtime's
    sandboxes share the host's network; the hook then reaches 127.0.0.1)."""
    try:
        net = cri.pod_sandbox_status(sandbox_id).network
    except CriError:
        return []
    return [ip for ip in (net.ip, *(a.ip for a in net.additional_ips)) if ip]


def _pre_stop(cri: RuntimeClient, log: Log, pod: Pod | None, c: ContainerInfo, grace: float,
              sleep: Callable[[float], None]) -> None:
    """The kubelet's ``executePreStopHook``, within ``grace``. Without the spec (an orphan,
    or no agent), the handler and ports recorded on the container, as the kubelet restores
    them from its annotations."""
    spec = next((s for s in pod.all_containers() if s.name == c.name), None) if pod else None
    if pod is not None and spec is not None:
        hook = spec.lifecycle.pre_stop
        target = HookTarget.of(pod, spec)
    else:
        ports = recorded_ports(c.ports)
        hook = recorded_handler(c.pre_stop, ports)
        target = HookTarget(c.pod_ref, c.name, ports)
    if hook is None:
        return
    message = run_hook(cri, c.id, target, hook, lambda: _sandbox_ips(cri, c.sandbox_id),
                       sleep, limit=grace)
    if message is not None:  # FailedPreStopHook; the stop goes on
        log.warning("syncloop.prestop.failed", pod=pod.full_name if pod else "",
                    pod_uid=pod.uid if pod else "", container=c.name, message=message)


class TerminationOrdering:
    """The kubelet's ``terminationOrdering``: a sidecar begins to stop only once every regular
    container and every sidecar after it have stopped (or the grace ran out). Containers not
    running count as stopped. Thread-safe (one thread per container waits on it)."""

    def __init__(self, pod: Pod, running: Collection[str]) -> None:
        self._done: dict[str, threading.Event] = {}
        self._prereqs: dict[str, list[threading.Event]] = {}
        mains = [self._event(c.name, running) for c in pod.spec.containers]
        later: threading.Event | None = None
        for c in reversed(pod.spec.init_containers):
            done = self._event(c.name, running)
            if c.sidecar:
                self._prereqs[c.name] = mains + ([later] if later is not None else [])
                later = done

    def _event(self, name: str, running: Collection[str]) -> threading.Event:
        done = self._done.setdefault(name, threading.Event())
        if name not in running:
            done.set()
        return done

    def wait_turn(self, name: str, grace: float, mono: Callable[[], float]) -> float:
        """Wait until ``name`` may stop, at most ``grace`` seconds; returns the time waited."""
        start = mono()
        for done in self._prereqs.get(name, ()):
            left = grace - (mono() - start)
            if left <= 0 or not done.wait(left):
                break
        return mono() - start

    def stopped(self, name: str) -> None:
        if (done := self._done.get(name)) is not None:
            done.set()


def stop_container(cri: RuntimeClient, log: Log, pod: Pod | None, c: ContainerInfo,
                   grace: float, sleep: Callable[[float], None],
                   mono: Callable[[], float], ordering: TerminationOrdering | None = None,
                   ) -> None:
    """preStop, then (a sidecar) its turn, then TERM, then KILL after what is left of
    ``grace`` (at least 2 s)."""
    start = mono()
    try:
        _pre_stop(cri, log, pod, c, grace, sleep)
        if ordering is not None:
            ordering.wait_turn(c.name, grace - (mono() - start), mono)
        left = max(MIN_KILL_GRACE, round(grace - (mono() - start)))
        log.info("syncloop.container.killing", pod_uid=pod.uid if pod else "",
                 container=c.name, container_id=c.id, grace=left)
        try:
            cri.stop_container(c.id, left)
        except CriError as err:
            if not err.not_found:
                raise
    finally:
        if ordering is not None:
            ordering.stopped(c.name)


def kill_containers(cri: RuntimeClient, log: Log, pod: Pod | None,
                    containers: Sequence[ContainerInfo], grace: float,
                    sleep: Callable[[float], None], mono: Callable[[], float],
                    ordered: bool = False) -> None:
    """Stop ``containers`` in parallel; raises the first CriError after all were tried.
    ``ordered``: the whole pod is stopping, so its sidecars stop last (``TerminationOrdering``;
    not for single kills, as the kubelet's ``ContainersToKill``)."""
    errors: list[CriError] = []
    ordering = (TerminationOrdering(pod, {c.name for c in containers})
                if ordered and pod is not None and pod.spec.sidecars else None)

    def one(c: ContainerInfo) -> None:
        try:
            stop_container(cri, log, pod, c, grace, sleep, mono, ordering)
        except CriError as err:
            errors.append(err)

    if len(containers) == 1:
        one(containers[0])
    else:
        threads = [threading.Thread(target=one, args=(c,), daemon=True) for c in containers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]


def kill_grace(pod: Pod, name: str, reason: str) -> int:
    """The kubelet's ``setTerminationGracePeriod`` for a container the sync loop kills:
    the liveness (startup) probe's ``terminationGracePeriodSeconds`` when the kill is for that
    probe's failure and it sets one, else the pod's."""
    spec = next((c for c in pod.all_containers() if c.name == name), None)
    probe = None
    if spec is not None and reason == LIVENESS_FAILED:
        probe = spec.liveness_probe
    elif spec is not None and reason == STARTUP_FAILED:
        probe = spec.startup_probe
    if probe is not None and probe.termination_grace_period_seconds is not None:
        return probe.termination_grace_period_seconds
    return pod.spec.termination_grace_period_seconds


def orphan_grace(rt: PodRuntime) -> int:
    """The grace of a pod no source knows: the largest one recorded on its containers."""
    values = [c.grace for c in rt.containers if c.grace >= 0]
    return max(values) if values else DEFAULT_GRACE


def teardown(cri: RuntimeClient, log: Log, pod: Pod | None, rt: PodRuntime, grace: float,
             sleep: Callable[[float], None], mono: Callable[[], float],
             pod_dir: Path | None, crash: CrashPoints = NEVER) -> None:
    """Kill the running containers, then stop and remove every sandbox and container. A
    sandbox that cannot be stopped does not keep the others: each is tried, then the first
    error is raised (the worker retries the termination). ``crash``: the step
    ``terminate.after_stop`` (fault-injection tests)."""
    kill_containers(cri, log, pod, rt.running(), grace, sleep, mono, ordered=True)
    crash.hit("terminate.after_stop")
    errors: list[CriError] = []
    stopped = [s for s in rt.sandboxes if _ignore_missing(cri.stop_pod_sandbox, s.id, errors)]
    for c in rt.containers:
        _ignore_missing(cri.remove_container, c.id, errors)
    for s in stopped:
        _ignore_missing(cri.remove_pod_sandbox, s.id, errors)
    if errors:
        raise errors[0]
    if pod_dir is not None:
        remove_pod_dir(pod_dir)


def _flex_folders(volumes: Path) -> set[str]:
    try:
        return {str(p) for p in volumes.iterdir()
                if p.is_dir() and not p.name.startswith("kubernetes.io~")}
    except OSError:
        return set()


def remove_pod_dir(pod_dir: Path) -> None:
    """Remove ``pods/<uid>`` without crossing a mount point under it, and without the volume
    manager's folders (``volumes/kubernetes.io~csi``, ``.../kubernetes.io~local-volume``, the
    nfs/iscsi/fc ones and FlexVolume drivers' ``vendor~driver``: it
    unmounts them once the pod is gone, then removes them with their ``vol_data.json``, which
    its reconstruction needs after a crash). A pod with neither: ``rmtree``."""
    volumes = pod_dir / "volumes"
    keep = mounts_under(pod_dir, host_mounts()) | {
        str(p) for p in (volumes / m for m in MANAGED) if p.exists()} | _flex_folders(volumes)
    if not keep:
        shutil.rmtree(pod_dir, ignore_errors=True)
        return
    keep = {str(Path(k).resolve()) for k in keep}

    def remove(path: Path) -> None:
        if str(path) in keep:
            return
        if path.is_dir() and not path.is_symlink():
            for child in list(path.iterdir()):
                remove(child)
            with contextlib.suppress(OSError):
                path.rmdir()  # not empty: what is kept is under it
        else:
            with contextlib.suppress(OSError):
                path.unlink()

    with contextlib.suppress(OSError):
        remove(pod_dir.resolve())


def terminate_pod(cri: RuntimeClient, log: Log, uid: str, pod: Pod | None,
                  grace: float | None, sleep: Callable[[float], None],
                  mono: Callable[[], float], wall: Callable[[], float],
                  pods_dir: Path, crash: CrashPoints = NEVER
                  ) -> tuple[PodRuntime, float, PodRuntime]:
    """Terminate pod ``uid`` as the sync loop does: read it fresh, pick the grace (``grace``,
    else the pod's ``terminationGracePeriodSeconds``, else for an orphan the largest grace
    recorded on its containers), tear it down, read it again. Returns (what there was, the
    grace used, what is left: empty on success). Used by the sync loop's workers and by
    ``stop_all_pods`` (``podvisorctl shutdown --pods`` with no agent)."""
    rt = read_pod_runtime(cri, uid, mono, wall)
    if grace is None:
        grace = (pod.spec.termination_grace_period_seconds if pod is not None
                 else orphan_grace(rt))
    if not rt.empty:
        log.info("syncloop.pod.terminating", pod_uid=uid, grace=grace,
                 containers=len(rt.running()))
    teardown(cri, log, pod, rt, grace, sleep, mono, pods_dir / uid, crash)
    return rt, grace, read_pod_runtime(cri, uid, mono, wall)


def _ignore_missing(fn: Callable[[str], None], ident: str,
                    errors: list[CriError] | None = None) -> bool:
    """Call ``fn(ident)``; NOT_FOUND counts as done. Another error is raised, or appended
    to ``errors`` (then False is returned)."""
    try:
        fn(ident)
    except CriError as err:
        if not err.not_found:
            if errors is None:
                raise
            errors.append(err)
            return False
    return True


__all__ = ["L", "Log", "TerminationOrdering", "kill_containers", "kill_grace", "orphan_grace",
           "stop_container", "teardown", "terminate_pod"]
