"""SyncPod over the CRI fake for the last Pod fields of issue 24: a ``tcpSocket`` lifecycle
handler (the kubelet's runner fails it: FailedPostStartHook and the container killed,
FailedPreStopHook and the stop goes on), ``recursiveReadOnly`` resolved against the runtime's
handlers (``resolveRecursiveReadOnly``), and ``runtimeClassName`` resolved through the
RuntimeClass manager to RunPodSandbox's ``runtime_handler``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from podvisor.services.pod import TCPSocketAction, VolumeMount
from podvisor.services.syncloop import cri_config
from podvisor.services.syncloop.hooks import invalid_handler
from podvisor.services.syncloop.network import NetworkState
from podvisor.services.syncloop.runtimeclass import RuntimeClasses
from podvisor.services.syncloop.syncpod import SyncDeps, sync_pod
from podvisor.services.syncloop.terminate import terminate_pod
from tests.services.syncloop.test_syncloop_lifecycle import Harness, make_pod

TCP_MESSAGE = ("Cannot run handler: invalid handler: &LifecycleHandler{Exec:nil,HTTPGet:nil,"
               "TCPSocket:&TCPSocketAction{Port:{0 8080 },Host:,},Sleep:nil,}")


def test_invalid_handler_message_is_the_kubelets() -> None:
    assert invalid_handler(TCPSocketAction(8080)) == TCP_MESSAGE
    assert invalid_handler(TCPSocketAction("http", "10.0.0.1")) == (
        "Cannot run handler: invalid handler: &LifecycleHandler{Exec:nil,HTTPGet:nil,"
        "TCPSocket:&TCPSocketAction{Port:{1 0 http},Host:10.0.0.1,},Sleep:nil,}")


def test_post_start_tcp_socket_fails_and_kills_the_container(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    pod = make_pod([{"name": "app", "image": "host", "command": ["sleep", "9"], "lifecycle": {
        "postStart": {"tcpSocket": {"port": 8080}}}}])
    r = sync_pod(h.deps, pod)
    assert not r.ok and r.waiting["app"].reason == "PostStartHookError"
    assert r.waiting["app"].message == TCP_MESSAGE
    assert [m for m, _ in h.cri.calls if m == "StartContainer"] and h.running() == {}
    assert ("Warning", "FailedPostStartHook", "PostStartHook failed") in h.events()
    assert not h.cri.method_calls("ExecSync")  # nothing was run in the container
    h.now += 11  # restarted per restartPolicy (Always) after the back-off, and fails again
    again = sync_pod(h.deps, pod)
    assert h.cri.method_calls("CreateContainer")[-1][1].metadata.attempt == 1
    assert again.waiting["app"].reason == "PostStartHookError"


def test_pre_stop_tcp_socket_fails_and_the_stop_goes_on(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    pod = make_pod([{"name": "app", "image": "host", "command": ["sleep", "9"], "lifecycle": {
        "preStop": {"tcpSocket": {"port": 8080}}}}], terminationGracePeriodSeconds=5)
    assert sync_pod(h.deps, pod).ok
    terminate_pod(h.cri, h.log, pod.uid, pod, 5, h.deps.sleep, h.deps.mono, h.deps.wall,
                  h.deps.pods_dir)
    assert h.running() == {}
    assert ("Warning", "FailedPreStopHook", TCP_MESSAGE) in h.events()
    [(_cid, timeout)] = h.cri.method_calls("StopContainer")
    assert timeout == 5  # the whole grace: the failed hook took none of it
    assert not h.slept and not h.cri.method_calls("ExecSync")


def mount(rro: str, read_only: bool = True, propagation: str = "") -> VolumeMount:
    return VolumeMount("v", "/v", read_only, mount_propagation=propagation,
                       recursive_read_only=rro)


@pytest.mark.parametrize("m,supported,expected", [
    (mount(""), True, False),
    (mount("Disabled"), True, False),
    (mount("IfPossible"), True, True),
    (mount("IfPossible"), False, False),  # a plain read-only mount
    (mount("Enabled"), True, True),
    (mount("Enabled", propagation="None"), True, True),
    (mount("Enabled"), False, 'volume "v" requested recursive read-only mode, but it is not '
                              "supported by the runtime"),
    (mount("Enabled", read_only=False), True, "but it is not read-only"),
    (mount("IfPossible", propagation="HostToContainer"), True,
     'but it is not compatible with propagation "HostToContainer"'),
])
def test_resolve_recursive_read_only(m: VolumeMount, supported: bool, expected: Any) -> None:
    if isinstance(expected, bool):
        assert cri_config.resolve_recursive_read_only(m, supported) is expected
        return
    with pytest.raises(cri_config.RecursiveReadOnlyError) as info:
        cri_config.resolve_recursive_read_only(m, supported)
    assert str(info.value).startswith("failed to resolve recursive read-only mode: volume")
    assert expected in str(info.value)


def classes(**handlers: str) -> RuntimeClasses:
    """A RuntimeClass manager whose informer listed these classes (name -> handler)."""
    rc = RuntimeClasses(cast(Any, None), sync_timeout=0.0)
    rc.listed([{"metadata": {"name": n}, "handler": h} for n, h in handlers.items()], "1")
    return rc


def with_api(h: Harness, rc: RuntimeClasses | None) -> SyncDeps:
    from dataclasses import replace
    return replace(h.deps, runtime_classes=rc, network=NetworkState())


def rro_pod(mode: str, **spec: Any) -> Any:
    return make_pod([{"name": "app", "image": "host", "command": ["sleep", "9"],
                      "volumeMounts": [{"name": "v", "mountPath": "/v", "readOnly": True,
                                        "recursiveReadOnly": mode}]}],
                    volumes=[{"name": "v", "emptyDir": {}}], **spec)


def test_recursive_read_only_follows_the_handler_of_the_pods_runtime_class(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.cri.runtime_handlers = {"": False, "rro": True}
    deps = with_api(h, classes(fast="rro"))
    assert sync_pod(deps, rro_pod("Enabled", runtimeClassName="fast")).ok
    [(_sid, config, _sb)] = h.cri.method_calls("CreateContainer")
    m = next(x for x in config.mounts if x.container_path == "/v")
    assert m.readonly and m.recursive_read_only
    assert h.cri.method_calls("RunPodSandbox")[0][1] == "rro"

    # the default handler does not support it: IfPossible is a plain read-only mount...
    h2 = Harness(tmp_path / "2")
    h2.cri.runtime_handlers = {"": False, "rro": True}
    assert sync_pod(with_api(h2, classes()), rro_pod("IfPossible")).ok
    [(_sid, config, _sb)] = h2.cri.method_calls("CreateContainer")
    m = next(x for x in config.mounts if x.container_path == "/v")
    assert m.readonly and not m.recursive_read_only
    # ...and Enabled fails the container's config, as the kubelet's makeMounts
    h3 = Harness(tmp_path / "3")
    h3.cri.runtime_handlers = {"": False}
    r = sync_pod(with_api(h3, classes()), rro_pod("Enabled"))
    assert r.waiting["app"].reason == "CreateContainerConfigError"
    assert r.waiting["app"].message == (
        'failed to resolve recursive read-only mode: volume "v" requested recursive read-only '
        "mode, but it is not supported by the runtime")
    assert not h3.cri.method_calls("CreateContainer")


def test_without_an_api_server_no_handler_supports_recursive_read_only(tmp_path: Path) -> None:
    """The kubelet without a client has no RuntimeClass manager: no handler is taken to
    support recursive read-only mounts, whatever the runtime says, and runtimeClassName is
    not looked up (the default handler runs the pod)."""
    h = Harness(tmp_path)
    h.cri.runtime_handlers = {"": True}
    r = sync_pod(h.deps, rro_pod("Enabled", runtimeClassName="missing"))
    assert r.waiting["app"].reason == "CreateContainerConfigError"
    assert h.cri.method_calls("RunPodSandbox")[0][1] == ""


def test_a_missing_runtime_class_fails_the_sandbox(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    deps = with_api(h, classes(gvisor="runsc"))
    pod = make_pod([{"name": "app", "image": "host", "command": ["sleep", "9"]}],
                   runtimeClassName="kata")
    r = sync_pod(deps, pod)
    assert not r.ok and not h.cri.method_calls("RunPodSandbox")
    message = 'Failed to create pod sandbox: runtimeclass.node.k8s.io "kata" not found'
    assert message in r.errors
    assert ("Warning", "FailedCreatePodSandBox", message) in h.events()
    # the class created meanwhile: the retry runs the pod with its handler
    deps.runtime_classes.event("ADDED", {"metadata": {"name": "kata"},  # type: ignore[union-attr]
                                         "handler": "kata-qemu"})
    assert sync_pod(deps, pod).ok
    assert h.cri.method_calls("RunPodSandbox")[0][1] == "kata-qemu"


def test_a_handler_the_runtime_lacks_fails_the_sandbox_with_its_error(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.cri.runtime_handlers = {"": False, "runc": False}
    deps = with_api(h, classes(gvisor="runsc"))
    pod = make_pod([{"name": "app", "image": "host", "command": ["sleep", "9"]}],
                   runtimeClassName="gvisor")
    r = sync_pod(deps, pod)
    message = ('Failed to create pod sandbox: rpc error: code = NotFound desc = no runtime for '
               '"runsc" is configured')
    assert not r.ok and message in r.errors
    assert ("Warning", "FailedCreatePodSandBox", message) in h.events()
    assert not h.cri.method_calls("CreateContainer")


def test_pre_stop_http_get_is_run_before_the_signal_and_a_failure_is_an_event(
        tmp_path: Path) -> None:
    """preStop httpGet, as the kubelet's handler runner: a GET to the pod's IP (a hostNetwork
    pod's sandbox reports none here, so 127.0.0.1) on the container's named port,
    with the headers, before StopContainer; a GET that gets no answer is FailedPreStopHook
    with the kubelet's message, and the stop goes on."""
    import http.server
    import threading

    seen: list[tuple[str, str | None]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("X-Drain")))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        h = Harness(tmp_path)
        pod = make_pod([{"name": "app", "image": "host", "command": ["sleep", "9"],
                         "ports": [{"name": "admin", "containerPort": port}],
                         "lifecycle": {"preStop": {"httpGet": {
                             "path": "/drain", "port": "admin",
                             "httpHeaders": [{"name": "X-Drain", "value": "now"}]}}}}],
                       terminationGracePeriodSeconds=5, hostNetwork=True)
        assert sync_pod(h.deps, pod).ok
        h.cri.calls.clear()
        terminate_pod(h.cri, h.log, pod.uid, pod, 5, h.deps.sleep, h.deps.mono, h.deps.wall,
                      h.deps.pods_dir)
        assert seen == [("/drain", "now")] and h.running() == {}
        assert not [e for e in h.events() if e[1] == "FailedPreStopHook"]
    finally:
        server.shutdown()
        server.server_close()
    # nobody listens on that port now: the hook fails, the stop goes on
    h = Harness(tmp_path)
    pod = make_pod([{"name": "app", "image": "host", "command": ["sleep", "9"], "lifecycle": {
        "preStop": {"httpGet": {"path": "/drain", "port": port}}}}],
        terminationGracePeriodSeconds=5, hostNetwork=True)
    assert sync_pod(h.deps, pod).ok
    terminate_pod(h.cri, h.log, pod.uid, pod, 5, h.deps.sleep, h.deps.mono, h.deps.wall,
                  h.deps.pods_dir)
    assert h.running() == {}
    [failed] = [m for _t, r, m in h.events() if r == "FailedPreStopHook"]
    assert failed.startswith(f'HTTP lifecycle hook (/drain) for Container "app" in Pod '
                             f'"{pod.full_name}({pod.uid})" failed - error: ')
