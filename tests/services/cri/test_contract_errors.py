"""CRI contract: unknown IDs and bad input give clear gRPC errors; the runtime stays up."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from tests.services.conftest import runs_processes

UNKNOWN = "0" * 64


def still_up(rt: Any) -> None:
    assert rt.client.version().runtime_api_version == "v1"
    if rt.embedded is not None:
        assert rt.embedded.proc is not None and rt.embedded.proc.poll() is None


@pytest.mark.parametrize("call", [
    lambda c: c.container_status(UNKNOWN),
    lambda c: c.pod_sandbox_status(UNKNOWN),
    lambda c: c.start_container(UNKNOWN),
    lambda c: c.stop_container(UNKNOWN, 0),
    lambda c: c.exec_sync(UNKNOWN, ["true"], 5),
    lambda c: c.container_stats(UNKNOWN),
], ids=["ContainerStatus", "PodSandboxStatus", "StartContainer", "StopContainer", "ExecSync",
        "ContainerStats"])
def test_unknown_ids_are_not_found(cri_runtime: Any, call: Any) -> None:
    with pytest.raises(CriError) as info:
        call(cri_runtime.client)
    assert info.value.code == grpc.StatusCode.NOT_FOUND, info.value
    still_up(cri_runtime)


def test_remove_unknown_ids_is_a_no_op(cri_runtime: Any) -> None:
    cri_runtime.client.remove_container(UNKNOWN)
    cri_runtime.client.remove_pod_sandbox(UNKNOWN)


def _create_and_start(rt: Any, config: pb.ContainerConfig,
                      sandbox: tuple[str, pb.PodSandboxConfig] | None = None) -> CriError:
    sid, sconfig = sandbox or rt.run("bad")
    with pytest.raises(CriError) as info:
        cid = rt.client.create_container(sid, config, sconfig)
        rt.client.start_container(cid)
    still_up(rt)
    return info.value


def test_missing_command_gives_errno_text(cri_runtime: Any) -> None:
    runs_processes(cri_runtime, "exec errors")
    err = _create_and_start(cri_runtime, cri_runtime.container_config(
        "nocmd", ["/nonexistent/podvisor-no-such-command"]))
    assert "no such file" in err.message.lower() or "not found" in err.message.lower(), err
    if cri_runtime.name == "embedded":
        assert "ENOENT" in err.message


def test_unwritable_log_path(cri_runtime: Any) -> None:
    runs_processes(cri_runtime, "log files")
    not_a_dir = cri_runtime.tmp / "a-file"
    not_a_dir.write_text("x")
    config = cri_runtime.sandbox_config("badlog")
    config.log_directory = str(not_a_dir / "logs")
    sid = cri_runtime.client.run_pod_sandbox(config)
    err = _create_and_start(cri_runtime, cri_runtime.container_config("c", ["true"]),
                            (sid, config))
    if cri_runtime.name == "embedded":
        assert "Not a directory" in err.message


def test_huge_env(cri_runtime: Any) -> None:
    runs_processes(cri_runtime, "execve limits")
    # One 256 KiB variable is over the kernel's per-string limit for execve (128 KiB).
    config = cri_runtime.container_config("hugeenv", ["true"], env={"HUGE": "x" * 256 * 1024})
    if cri_runtime.name == "embedded":
        err = _create_and_start(cri_runtime, config)
        assert "Argument list too long" in err.message
        return
    # containerd accepts the start; runc's exec then fails inside the container (exit 1).
    sid, sconfig = cri_runtime.run("bad")
    try:
        cid = cri_runtime.client.create_container(sid, config, sconfig)
        cri_runtime.client.start_container(cid)
    except CriError:
        pass
    else:
        assert cri_runtime.wait_exited(cid).exit_code != 0
    still_up(cri_runtime)


def test_create_in_unknown_sandbox(cri_runtime: Any) -> None:
    _sid, sconfig = cri_runtime.run("ghost")
    with pytest.raises(CriError):
        cri_runtime.client.create_container(
            UNKNOWN, cri_runtime.container_config("c", ["true"]), sconfig)
    still_up(cri_runtime)


def test_start_twice_fails(cri_runtime: Any) -> None:
    sandbox = cri_runtime.run("twice")
    cid = cri_runtime.start(sandbox, "c", ["sleep", "1000"])
    with pytest.raises(CriError):
        cri_runtime.client.start_container(cid)
    still_up(cri_runtime)


def test_embedded_rejects_bad_configs(cri_runtime: Any) -> None:
    if cri_runtime.name != "embedded":
        pytest.skip("embedded-specific validation messages")
    client = cri_runtime.client
    sid, sconfig = cri_runtime.run("invalid")
    no_cmd = cri_runtime.container_config("nocmd", [])
    with pytest.raises(CriError) as info:
        client.create_container(sid, no_cmd, sconfig)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    other_image = cri_runtime.container_config("img", ["true"])
    other_image.image.image = "busybox:latest"
    with pytest.raises(CriError) as info:
        client.create_container(sid, other_image, sconfig)
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert "not present in the embedded runtime: pull it first" in info.value.message
    with pytest.raises(CriError) as info:  # a loopback registry nobody serves: refused at once
        client.pull_image("127.0.0.1:1/podvisor/nothing:1")
    assert "pulling image '127.0.0.1:1/podvisor/nothing:1'" in info.value.message
    assert client.pull_image("host")
    with pytest.raises(CriError) as info:
        client.run_pod_sandbox(pb.PodSandboxConfig())
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    still_up(cri_runtime)


def test_unimplemented_calls_say_so(cri_runtime: Any) -> None:
    if cri_runtime.name != "embedded":
        pytest.skip("which calls are unimplemented differs per runtime")
    from cri_api.v1 import api_pb2_grpc

    channel = grpc.insecure_channel(f"unix://{cri_runtime.embedded.socket}")
    try:
        stub: Any = api_pb2_grpc.RuntimeServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as info:
            stub.CheckpointContainer(pb.CheckpointContainerRequest(container_id=UNKNOWN),
                                     timeout=5)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        channel.close()
    still_up(cri_runtime)
