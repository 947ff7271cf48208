"""Stop every pod the runtime has, without a sync loop: what ``podvisorctl shutdown --pods``
does when no agent answers.

Each pod is terminated as the sync loop terminates an orphan (``terminate.terminate_pod``): the
grace is the largest ``terminationGracePeriodSeconds`` recorded on its containers (default 30),
each container's preStop hook as recorded on it (``labels.PRE_STOP`` and its ports, within the
grace), SIGTERM, then SIGKILL once the grace is over (never less than 2 s between them); then
its sandboxes and containers are stopped and removed, its ``pods/<uid>`` directory and (when
pod cgroups are on) its cgroup folders removed. Pods are stopped in parallel, so the whole run
takes about the longest grace. A failed teardown is tried again (``ATTEMPTS``, reading the
pod afresh: a pod another client removed meanwhile counts as stopped); one pod's failure never
stops the others; it is reported in its result.

A runtime such as containerd may run other clients' pods (another agent, another rootDir):
``owned_pod_uids`` names the pods this rootDir's agent made (each got its log directory
``pod-logs/<namespace>_<name>_<uid>`` before its sandbox was created, and keeps it), and only
those are stopped when the caller passes them as ``only``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.cgroupfs import new_cgroup_fs
from podvisor.services.syncloop.podcgroups import PodCgroups, new_pod_cgroups
from podvisor.services.syncloop.runtime_state import read_pod_runtime
from podvisor.services.syncloop.terminate import Log, orphan_grace, terminate_pod

__all__ = ["StoppedPod", "owned_pod_uids", "pod_cgroups", "runtime_pods", "stop_all_pods"]

MAX_PARALLEL = 32
ATTEMPTS = 3       # per pod: a failed teardown is tried again (it reads the pod afresh)
RETRY_DELAY = 1.0  # seconds before the 2nd attempt, 2x before the 3rd


@dataclass(frozen=True)
class StoppedPod:
    uid: str
    name: str          # "namespace/name" from the runtime's labels ("" when unlabelled)
    containers: int    # containers that were running
    grace: float       # seconds between SIGTERM and SIGKILL it was given
    error: str = ""    # "" when nothing of the pod is left in the runtime

    @property
    def ok(self) -> bool:
        return not self.error


def pod_cgroups(cgroup_root: str, log: Log) -> PodCgroups | None:
    """The pod cgroup cleanup the sync loop does for config ``cgroupRoot`` (None when off)."""
    return new_pod_cgroups(cgroup_root, new_cgroup_fs(), log) if cgroup_root else None


def owned_pod_uids(pod_logs_dir: Path) -> set[str]:
    """UIDs of the pods the agent of this rootDir created (from ``pod-logs/<ns>_<name>_<uid>``;
    names, namespaces and static pod UIDs hold no ``_``)."""
    try:
        entries = list(pod_logs_dir.iterdir())
    except OSError:
        return set()
    return {e.name.rsplit("_", 1)[1] for e in entries if e.is_dir() and "_" in e.name}


def runtime_pods(cri: RuntimeClient) -> dict[str, str]:
    """Every pod UID the runtime has sandboxes or containers for -> "namespace/name"."""
    out: dict[str, str] = {}
    objects: list[pb.PodSandbox | pb.Container] = [*cri.list_pod_sandbox(),
                                                   *cri.list_containers()]
    for obj in objects:
        uid = obj.labels.get(L.POD_UID, "")
        if not uid:
            continue
        name, ns = obj.labels.get(L.POD_NAME, ""), obj.labels.get(L.POD_NAMESPACE, "")
        if not out.get(uid) and name:
            out[uid] = f"{ns or 'default'}/{name}"
        out.setdefault(uid, "")
    return out


def stop_all_pods(cri: RuntimeClient, log: Log, pods_dir: Path, cgroups: PodCgroups | None,
                  sleep: Callable[[float], None], mono: Callable[[], float],
                  wall: Callable[[], float], only: Collection[str] | None = None
                  ) -> list[StoppedPod]:
    """Terminate every pod of the runtime (``only``: just the pods with these UIDs), in
    parallel; one result per pod, sorted by name. Raises CriError only when the runtime cannot
    even be listed."""
    pods = runtime_pods(cri)
    if only is not None:
        pods = {uid: name for uid, name in pods.items() if uid in only}

    def one(uid: str) -> StoppedPod:
        name, running, error = pods[uid], 0, ""
        grace: float | None = None
        try:  # what runs before anything is stopped (an attempt may fail half-way)
            first = read_pod_runtime(cri, uid, mono, wall)
            running, grace = len(first.running()), orphan_grace(first)
        except CriError as err:
            error = str(err)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                before, used, left = terminate_pod(cri, log, uid, None, grace, sleep, mono,
                                                   wall, pods_dir)
            except CriError as err:  # e.g. another client removing the same pod right now
                error = str(err)
            else:
                running, grace = max(running, len(before.running())), used
                if left.empty:
                    if cgroups is not None:
                        cgroups.remove(uid)  # a busy folder is logged; the pod itself is gone
                    log.info("syncloop.pod.stopped", pod=name, pod_uid=uid, grace=grace)
                    return StoppedPod(uid, name, running, grace)
                error = "containers or sandboxes remain after teardown"
            log.warning("syncloop.pod.stop_failed", pod=name, pod_uid=uid, error=error,
                        attempt=attempt)
            if attempt < ATTEMPTS:
                sleep(RETRY_DELAY * attempt)
        return StoppedPod(uid, name, running, grace or 0.0, error)

    if not pods:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(pods)),
                            thread_name_prefix="stopall") as pool:
        results = list(pool.map(one, sorted(pods)))
    return sorted(results, key=lambda r: (r.name, r.uid))
