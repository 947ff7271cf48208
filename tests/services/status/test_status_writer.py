"""status-api against the stand-in API server: the writer corrects a status another client
changed (the kubelet's ``needsReconcile``), only from a copy newer than its own last write, and
never tries to take a pod out of a terminal phase the API holds; the service (its own watch of
the node's pods, a real bus) converges after the API server comes back without waiting out a
back-off an old error started; the reflector's ``retry`` ends a back-off at once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podvisor.common import FakeChildContext
from podvisor.common.config import Config
from podvisor.common.logs import MemoryLogger
from podvisor.ipc.maps import (
    MIRRORS_KEY,
    POD_SET_KEY,
    DesiredPod,
    MirrorSet,
    PodRef,
    PodSetValue,
    PodStatusValue,
)
from podvisor.ipc.podstatus import PodStatus
from podvisor.services.apiserver import ApiConnection, Reflector
from podvisor.services.pod import pod_from_dict
from podvisor.services.status.api_main import StatusApiService
from podvisor.services.status.apicopy import ApiCopies
from podvisor.services.status.apiwriter import Snapshot, StatusWriter
from tests.conftest import MapBus
from tests.services.status.test_status_reconcile import gate, ours
from tests.support.kubeapi import KubeApi
from tests.support.kubeapi.others import mark_pods_not_ready, set_condition

NODE = "n-writer"
KEPT = ("name", "namespace", "uid", "labels", "annotations")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=0.5)
    server.start()
    yield server
    server.stop()


def kubeconfig(api: KubeApi, tmp_path: Path) -> Path:
    return api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                          groups=("system:nodes",))


def create(api: KubeApi, name: str) -> dict[str, Any]:
    return api.create_pod("default", {"metadata": {"name": name}, "spec": {
        "nodeName": NODE, "automountServiceAccountToken": False,
        "containers": [{"name": "a", "image": "img"}, {"name": "b", "image": "img"}]}})


def entry(obj: dict[str, Any]) -> DesiredPod:
    """The sync loop's ``desired`` entry of an API pod (as the API source parses it)."""
    meta = {k: v for k, v in obj["metadata"].items() if k in KEPT}
    pod = pod_from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                         "spec": obj["spec"]}, "api", api_objects=True).pod
    return DesiredPod(pod=pod.to_dict(), source="api", worker="syncing")


def value(obj: dict[str, Any], status: PodStatus, version: int) -> PodStatusValue:
    meta = obj["metadata"]
    return PodStatusValue(status, version, PodRef(meta["name"], "default", meta["uid"]))


def api_status(api: KubeApi, name: str) -> dict[str, Any]:
    return dict(api.store.get("pods", "default", name)["status"])


def ready(api: KubeApi, name: str) -> str:
    return next((str(c["status"]) for c in api_status(api, name).get("conditions", [])
                 if c["type"] == "Ready"), "")


def patches(api: KubeApi, name: str) -> int:
    return api.count("PATCH", f"/pods/{name}/status", code=200)


def test_a_status_another_client_changed_is_written_again(api: KubeApi,
                                                           tmp_path: Path) -> None:
    obj = create(api, "w1")
    uid = obj["metadata"]["uid"]
    copies, log = ApiCopies(), MemoryLogger()
    writer = StatusWriter(ApiConnection(str(kubeconfig(api, tmp_path))), NODE, log,
                          copies=copies)
    snap = Snapshot({uid: entry(obj)}, {uid: value(obj, ours(), 1)}, None, None)
    copies.listed([obj], "1")  # the copy from before the first write
    writer.turn(snap, reconcile=True)
    assert patches(api, "w1") == 1 and ready(api, "w1") == "True"
    writer.turn(snap, reconcile=True)  # the copy predates the write: not compared
    assert patches(api, "w1") == 1
    copies.listed([obj], "1")  # a list served before the write, delivered after it
    writer.turn(snap, reconcile=True)  # differs: the pod is read afresh, and is in sync
    writer.turn(snap, reconcile=True)  # that copy is not compared again
    assert patches(api, "w1") == 1 and api.count("GET", "/pods/w1") == 1
    copies.event("MODIFIED", api.store.get("pods", "default", "w1"))  # the write, back
    writer.turn(snap, reconcile=True)
    assert patches(api, "w1") == 1 and api.count("GET", "/pods/w1") == 1  # in sync
    # the node lifecycle controller, and a readiness gate's controller
    assert mark_pods_not_ready(api.store, NODE, api.wall) == ["w1"]
    set_condition(api.store, "default", "w1", {"type": "example.com/gate", "status": "True"},
                  api.wall)
    copies.event("MODIFIED", api.store.get("pods", "default", "w1"))
    writer.turn(snap)  # a turn for a new snapshot compares nothing (the kubelet's too)
    assert patches(api, "w1") == 1 and ready(api, "w1") == "False"
    writer.turn(snap, reconcile=True)  # read afresh, still differs: written
    assert patches(api, "w1") == 2 and ready(api, "w1") == "True"
    assert api.count("GET", "/pods/w1") == 2
    assert [c["status"] for c in api_status(api, "w1")["conditions"]
            if c["type"] == "example.com/gate"] == ["True"]  # not the kubelet's: kept
    [line] = log.named("status.api.reconciled")
    assert line["differed"] == ["conditions.Ready"] and line["pod"] == "w1_default"
    assert writer.counters["reconciles"] == 1


def test_a_terminal_phase_in_the_api_is_left_alone(api: KubeApi, tmp_path: Path) -> None:
    obj = create(api, "t1")
    uid = obj["metadata"]["uid"]
    api.store.update("pods", "default", "t1",
                     lambda pod: {**pod, "status": {"phase": "Failed", "reason": "Evicted"}},
                     subresource="status")
    copies, log = ApiCopies(), MemoryLogger()
    writer = StatusWriter(ApiConnection(str(kubeconfig(api, tmp_path))), NODE, log,
                          copies=copies)
    writer.written[uid] = 1  # written before the API's phase went terminal
    copies.listed([api.store.get("pods", "default", "t1")], "1")
    snap = Snapshot({uid: entry(obj)}, {uid: value(obj, ours(), 1)}, None, None)
    writer.turn(snap, reconcile=True)
    writer.turn(snap, reconcile=True)
    assert patches(api, "t1") == 0 and api_status(api, "t1")["phase"] == "Failed"
    assert len(log.named("status.api.terminal_in_api")) == 1


def test_back_forgets_what_waited_on_the_outage(api: KubeApi, tmp_path: Path) -> None:
    writer = StatusWriter(ApiConnection(str(kubeconfig(api, tmp_path))), NODE, MemoryLogger())
    writer.creating[("default", "st-n")] = "hash"
    writer.node_uid, writer.terminal = "old-node-uid", {"u"}
    writer.back()
    assert writer.creating == {} and writer.node_uid == "" and writer.terminal == set()


class _Sink:
    def __init__(self) -> None:
        self.lists = 0
        self.failures = 0

    def listed(self, items: list[dict[str, Any]], rv: str) -> None:
        self.lists += 1

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        pass

    def failed(self, why: str) -> None:
        self.failures += 1


def test_retry_ends_the_reflectors_back_off(api: KubeApi, tmp_path: Path,
                                            wait_for: Callable[..., Any]) -> None:
    sink = _Sink()
    conn = ApiConnection(str(kubeconfig(api, tmp_path)))
    api.stop()
    reflector = Reflector(conn, "/api/v1/pods", {"fieldSelector": f"spec.nodeName={NODE}"},
                          sink, initial_delay=120.0, max_delay=120.0)
    reflector.start()
    try:
        wait_for(lambda: sink.failures == 1, timeout=30, message="the first failure")
        api.start()
        reflector.retry()  # another request of the process got an answer
        wait_for(lambda: sink.lists == 1, timeout=30,
                 message="the list, long before the 120 s back-off ends")
    finally:
        reflector.stop()
        conn.close()


class _Service:
    """StatusApiService on a real bus (the test owns ``desired``, ``statuses``, ``pods-api`` and
    ``api-mirrors``) and the stand-in, its loop on a thread."""

    def __init__(self, root: Path, kubeconfig: Path, initial_delay: float,
                 **config: Any) -> None:
        self.bus = MapBus(root, ("desired", "statuses", "pods-api", "api-mirrors"))
        self.desired, self.statuses, pods, mirrors = (
            self.bus.maps[m] for m in ("desired", "statuses", "pods-api", "api-mirrors"))
        pods.set(POD_SET_KEY, PodSetValue("api", [], []))
        mirrors.set(MIRRORS_KEY, MirrorSet())
        cfg = Config(root_dir=str(root), node_name=NODE, kubeconfig=str(kubeconfig), **config)
        self.ctx = FakeChildContext(self.bus.paths, "status-api", config=cfg, zctx=self.bus.zctx)
        self.log = self.ctx.log
        self.svc = StatusApiService(self.ctx, initial_delay=initial_delay)
        self.thread = threading.Thread(target=self.svc.run, name="status-api", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.ctx.stop.set()
        self.thread.join(10)
        self.svc.close()
        self.bus.close()


def test_the_server_back_ends_the_writers_back_off(api: KubeApi, tmp_path: Path,
                                                   wait_for: Callable[..., Any]) -> None:
    """The writer fails while the server is away and would wait 120 s before its next try;
    the server comes back: its watch lists, and the new status and the correction of what
    another client wrote meanwhile reach the API within one of the watch's retries."""
    obj = create(api, "s1")
    uid = obj["metadata"]["uid"]
    svc = _Service(tmp_path / "root", kubeconfig(api, tmp_path), initial_delay=120.0,
                   api_retry_max_delay=2.0, status_sweep_frequency=60.0)
    try:
        svc.desired.set(uid, entry(obj))
        svc.statuses.set(uid, value(obj, ours(ready=False), 1))
        wait_for(lambda: ready(api, "s1") == "False", timeout=30, pump=svc.bus.serve,
                 message="the first status written")
        api.stop()
        svc.statuses.set(uid, value(obj, ours(ready=True), 2))
        wait_for(lambda: svc.log.named("status.api.unreachable"), timeout=30,
                 pump=svc.bus.serve, message="the writer failed and backs off")
        set_condition(api.store, "default", "s1", {"type": "ContainersReady",
                                                   "status": "False"}, api.wall)
        api.start()
        wait_for(lambda: ready(api, "s1") == "True", timeout=30, pump=svc.bus.serve,
                 message="the new status, long before the writer's 120 s back-off ends")
        wait_for(lambda: {c["type"]: c["status"] for c in api_status(api, "s1")["conditions"]}
                 .get("ContainersReady") == "True", timeout=30, pump=svc.bus.serve,
                 message="what another client wrote while the server was away, corrected")
        assert svc.log.named("status.api.relisted")
    finally:
        svc.close()


def test_the_sweep_corrects_another_clients_write(api: KubeApi, tmp_path: Path,
                                                  wait_for: Callable[..., Any]) -> None:
    obj = create(api, "s2")
    uid = obj["metadata"]["uid"]
    svc = _Service(tmp_path / "root", kubeconfig(api, tmp_path), initial_delay=0.8,
                   status_sweep_frequency=1.0)
    try:
        svc.desired.set(uid, entry(obj))
        svc.statuses.set(uid, value(obj, ours(), 1))
        wait_for(lambda: ready(api, "s2") == "True", timeout=30, pump=svc.bus.serve)
        for turn in range(2):  # twice: each write of another client is corrected
            assert mark_pods_not_ready(api.store, NODE, api.wall) == ["s2"]
            # the writer logs after the server answered its PATCH, i.e. after the store
            # shows Ready again: wait for the line, not for the store
            wait_for(lambda turn=turn: len(svc.log.named("status.api.reconciled")) == turn + 1,
                     timeout=30, pump=svc.bus.serve, message="Ready written again by a sweep")
            assert ready(api, "s2") == "True"
            if turn == 0:  # a condition not the kubelet's, before the second correction
                set_condition(api.store, "default", "s2", gate(), api.wall)
        assert [c["status"] for c in api_status(api, "s2")["conditions"]
                if c["type"] == "example.com/gate"] == ["True"]  # kept by the second write
        assert [e["differed"] for e in svc.log.named("status.api.reconciled")] == [
            ["conditions.Ready"]] * 2
    finally:
        svc.close()
