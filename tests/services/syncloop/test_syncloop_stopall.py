"""`stop_all_pods` (what `podvisorctl shutdown --pods` does with no agent) over the CRI fake:
every pod is stopped with the grace recorded on its containers, its sandboxes and containers
removed, its `pods/<uid>` directory deleted; one pod's failure never stops the others."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path
from typing import ClassVar

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.common.logs import MemoryLogger
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.pod import (
    ContainerPort,
    ExecAction,
    HTTPGetAction,
    HTTPHeader,
    LifecycleHandler,
    SleepAction,
    TCPSocketAction,
    URIScheme,
    recorded_handler,
    recorded_ports,
)
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.stopall import (
    StoppedPod,
    owned_pod_uids,
    runtime_pods,
    stop_all_pods,
)


def add_pod(cri: FakeRuntimeClient, name: str, uid: str, grace: int, running: int = 1,
            pre_stop: LifecycleHandler | None = None,
            ports: tuple[ContainerPort, ...] = ()) -> str:
    labels = L.pod_labels(name, "default", uid)
    sid = cri.run_pod_sandbox(pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="default"), labels=labels))
    for i in range(running):
        cid = cri.create_container(sid, pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=f"c{i}"),
            labels=L.container_labels(name, "default", uid, f"c{i}"),
            annotations=L.container_annotations("h", 0, grace, pre_stop, ports=ports)),
            pb.PodSandboxConfig())
        cri.start_container(cid)
    return sid


def stop(cri: FakeRuntimeClient, pods_dir: Path, log: MemoryLogger) -> list[StoppedPod]:
    return stop_all_pods(cri, log, pods_dir, None, lambda _s: None, lambda: 100.0,
                         lambda: 1_700_000_000.0)


def test_every_pod_is_stopped_with_its_recorded_grace(tmp_path: Path) -> None:
    cri = FakeRuntimeClient()
    add_pod(cri, "a", "u-a", grace=10, running=2)
    add_pod(cri, "b", "u-b", grace=3)
    (tmp_path / "u-a" / "volumes").mkdir(parents=True)
    log = MemoryLogger()
    results = stop(cri, tmp_path, log)
    assert [(r.name, r.uid, r.containers, r.grace, r.ok) for r in results] == [
        ("default/a", "u-a", 2, 10, True), ("default/b", "u-b", 1, 3, True)]
    stops = sorted(timeout for _cid, timeout in cri.method_calls("StopContainer"))
    assert stops == [3, 10, 10]
    assert cri.list_pod_sandbox() == [] and cri.list_containers() == []
    assert not (tmp_path / "u-a").exists()
    assert {e["pod_uid"] for e in log.named("syncloop.pod.stopped")} == {"u-a", "u-b"}


def test_a_pod_without_recorded_grace_gets_the_default_and_short_ones_two_seconds(
        tmp_path: Path) -> None:
    cri = FakeRuntimeClient()
    add_pod(cri, "old", "u-old", grace=-1)  # no grace annotation readable
    add_pod(cri, "quick", "u-quick", grace=0)
    results = {r.uid: r for r in stop(cri, tmp_path, MemoryLogger())}
    assert results["u-old"].grace == 30
    assert sorted(t for _c, t in cri.method_calls("StopContainer")) == [2, 30]


def test_a_failed_teardown_is_tried_again(tmp_path: Path) -> None:
    cri = FakeRuntimeClient()
    add_pod(cri, "a", "u-a", grace=5)
    cri.fail("RemovePodSandbox", grpc.StatusCode.UNKNOWN, "already in removing state", times=1)
    [r] = stop(cri, tmp_path, MemoryLogger())
    assert (r.ok, r.containers, r.grace) == (True, 1, 5)
    assert runtime_pods(cri) == {}


def test_one_failing_pod_does_not_stop_the_others(tmp_path: Path) -> None:
    cri = FakeRuntimeClient()
    add_pod(cri, "a", "u-a", grace=5)
    add_pod(cri, "b", "u-b", grace=5)
    cri.fail("RemovePodSandbox", grpc.StatusCode.INTERNAL, "disk on fire", times=3)
    log = MemoryLogger()
    results = stop(cri, tmp_path, log)
    assert sum(not r.ok for r in results) == 1
    assert "disk on fire" in next(r.error for r in results if not r.ok)
    assert len(runtime_pods(cri)) == 1  # only the failed one is left
    assert [e["attempt"] for e in log.named("syncloop.pod.stop_failed")] == [1, 2, 3]


def test_only_the_pods_of_this_root_dir(tmp_path: Path) -> None:
    """On a shared runtime only the pods this rootDir's agent made (a log dir under
    pod-logs/) are stopped."""
    cri = FakeRuntimeClient()
    add_pod(cri, "mine", "u-mine", grace=5)
    add_pod(cri, "theirs", "u-theirs", grace=5)
    logs = tmp_path / "pod-logs"
    (logs / "default_mine_u-mine").mkdir(parents=True)
    (logs / "stray-file").write_text("")
    assert owned_pod_uids(logs) == {"u-mine"}
    results = stop_all_pods(cri, MemoryLogger(), tmp_path / "pods", None, lambda _s: None,
                            lambda: 100.0, lambda: 1_700_000_000.0, owned_pod_uids(logs))
    assert [r.uid for r in results] == ["u-mine"]
    assert set(runtime_pods(cri)) == {"u-theirs"}
    assert owned_pod_uids(tmp_path / "missing") == set()


def test_the_recorded_pre_stop_hook_runs_before_the_stop(tmp_path: Path) -> None:
    cri = FakeRuntimeClient()
    add_pod(cri, "a", "u-a", grace=10, pre_stop=ExecAction(("sh", "-c", "echo bye")))
    slept: list[float] = []
    add_pod(cri, "b", "u-b", grace=10, pre_stop=SleepAction(4))
    results = stop_all_pods(cri, MemoryLogger(), tmp_path, None, slept.append, lambda: 100.0,
                            lambda: 1_700_000_000.0)
    assert all(r.ok for r in results)
    [(cid, cmd, _timeout)] = cri.method_calls("ExecSync")
    assert list(cmd) == ["sh", "-c", "echo bye"]
    calls = [name for name, args in cri.calls if args and args[0] == cid]
    assert calls.index("ExecSync") < calls.index("StopContainer")  # the hook, then TERM
    assert 4 in slept


WEB = (ContainerPort(8080, name="web"),)


@pytest.mark.parametrize(("handler", "text"), [
    (ExecAction(("a", "b")), '{"exec": {"command": ["a", "b"]}}'),
    (SleepAction(3), '{"sleep": {"seconds": 3}}'),
    (TCPSocketAction("web"), '{"tcpSocket": {"port": "web"}}'),
    (HTTPGetAction("web", "/bye", "10.0.0.1", URIScheme.HTTPS, (HTTPHeader("X-A", "1"),)),
     '{"httpGet": {"host": "10.0.0.1", "httpHeaders": [{"name": "X-A", "value": "1"}], '
     '"path": "/bye", "port": "web", "scheme": "HTTPS"}}')])
def test_pre_stop_and_ports_annotations_round_trip(handler: LifecycleHandler, text: str) -> None:
    ann = L.container_annotations("h", 0, 1, handler, ports=WEB)
    assert ann[L.PRE_STOP] == text
    assert ann[L.CONTAINER_PORTS] == '[{"containerPort": 8080, "name": "web", "protocol": "TCP"}]'
    ports = recorded_ports(ann[L.CONTAINER_PORTS])
    assert ports == WEB
    assert recorded_handler(text, ports) == handler
    assert recorded_handler(text) == handler  # the named port is looked up when it runs


@pytest.mark.parametrize("bad", ["", "{", "[]", '{"exec": {"command": []}}',
                                 '{"exec": {"command": [1]}}', '{"sleep": {"seconds": true}}',
                                 '{"httpGet": {"port": 0}}', '{"grpc": {"port": 80}}',
                                 '{"exec": {"command": ["a"]}, "sleep": {"seconds": 1}}'])
def test_a_bad_pre_stop_annotation_is_none(bad: str) -> None:
    assert recorded_handler(bad) is None


@pytest.mark.parametrize("bad", ["", "{", "{}", '[{"containerPort": 0}]', '[{"name": 1}]'])
def test_a_bad_ports_annotation_is_none(bad: str) -> None:
    assert recorded_ports(bad) == ()


class _Hits(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("X-Bye")))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_an_orphans_http_pre_stop_runs_with_its_recorded_named_port(tmp_path: Path) -> None:
    """No pod spec: the handler and the ports recorded on the container (the kubelet's
    restoreSpecsFromContainerLabels), the GET before the container's TERM; a named port nobody
    recorded fails the hook with the kubelet's message, and the stop goes on."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hits)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = ContainerPort(server.server_address[1], name="web")
        hook = HTTPGetAction("web", "/bye", "127.0.0.1",
                             http_headers=(HTTPHeader("X-Bye", "now"),))
        cri = FakeRuntimeClient()
        add_pod(cri, "a", "u-a", grace=10, pre_stop=hook, ports=(port,))
        add_pod(cri, "b", "u-b", grace=10, pre_stop=hook)  # recorded without its ports
        log = MemoryLogger()
        results = stop(cri, tmp_path, log)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert all(r.ok for r in results)
    assert _Hits.seen == [("/bye", "now")]
    [failed] = log.named("syncloop.prestop.failed")
    assert failed["message"] == ('HTTP lifecycle hook (/bye) for Container "c0" in Pod '
                                 '"b_default(u-b)" failed - error: unable to find port \'web\' '
                                 'in container c0')
    assert cri.list_containers() == []


def test_nothing_to_stop(tmp_path: Path) -> None:
    assert stop(FakeRuntimeClient(), tmp_path, MemoryLogger()) == []
