"""CRI contract: logs in CRI format, ReopenContainerLog, ExecSync, stats, images."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from podvisor.services.cri.fake import FakeRuntimeClient
from tests.services.conftest import runs_processes

CRI_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)) (stdout|stderr) ([FP]) "
    r"(.*)$")


def parse_log(path: str) -> list[tuple[str, str, str]]:
    lines = Path(path).read_text().splitlines()
    out = []
    for line in lines:
        m = CRI_LINE.match(line)
        assert m, f"not a CRI log line: {line!r}"
        out.append((m.group(2), m.group(3), m.group(4)))
    return out


def test_logs_in_cri_format(cri_runtime: Any) -> None:
    runs_processes(cri_runtime, "log files")
    cmd = ["sh", "-c", "echo hello; echo oops >&2; printf 'no newline'"]
    cid = cri_runtime.start(cri_runtime.run("logs"), "logger", cmd)
    status = cri_runtime.wait_exited(cid)
    records = parse_log(status.log_path)
    assert ("stdout", "F", "hello") in records
    assert ("stderr", "F", "oops") in records
    assert "no newline" in "".join(text for stream, _tag, text in records if stream == "stdout")


def test_reopen_container_log(cri_runtime: Any, poll: Any) -> None:
    runs_processes(cri_runtime, "log files")
    cmd = ["sh", "-c", "while true; do echo tick; sleep 0.05; done"]
    cid = cri_runtime.start(cri_runtime.run("reopen"), "ticker", cmd)
    path = cri_runtime.client.container_status(cid).log_path
    poll(lambda: os.path.exists(path) and os.path.getsize(path) > 0, message="first tick")
    os.rename(path, path + ".1")
    cri_runtime.client.reopen_container_log(cid)
    poll(lambda: os.path.exists(path) and os.path.getsize(path) > 0, message="tick in new log")
    assert parse_log(path)[0][2] == "tick"


def test_exec_sync_output_and_exit_code(cri_runtime: Any) -> None:
    runs_processes(cri_runtime, "exec output")
    cid = cri_runtime.start(cri_runtime.run("exec"), "target", ["sleep", "1000"])
    resp = cri_runtime.client.exec_sync(cid, ["sh", "-c", "echo out; echo err >&2; exit 3"], 10)
    assert resp.stdout == b"out\n"
    assert resp.stderr == b"err\n"
    assert resp.exit_code == 3
    assert cri_runtime.client.exec_sync(cid, ["true"], 10).exit_code == 0


def test_exec_sync_timeout(cri_runtime: Any) -> None:
    runs_processes(cri_runtime, "exec timeouts")
    cid = cri_runtime.start(cri_runtime.run("exectimeout"), "target", ["sleep", "1000"])
    with pytest.raises(CriError) as info:
        cri_runtime.client.exec_sync(cid, ["sleep", "30"], 1)
    if cri_runtime.name == "embedded":
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "timed out" in info.value.message
    assert cri_runtime.client.exec_sync(cid, ["true"], 10).exit_code == 0  # still serving


def test_exec_sync_in_stopped_container_fails(cri_runtime: Any) -> None:
    cid = cri_runtime.start(cri_runtime.run("execstopped"), "done", ["true"])
    cri_runtime.wait_exited(cid)
    with pytest.raises(CriError):
        cri_runtime.client.exec_sync(cid, ["true"], 5)


def test_stats(cri_runtime: Any) -> None:
    sandbox = cri_runtime.run("stats")
    cid = cri_runtime.start(sandbox, "busy", ["sleep", "1000"])
    stats = cri_runtime.client.container_stats(cid)
    assert stats.attributes.id == cid
    assert stats.attributes.metadata.name == "busy"
    all_stats = cri_runtime.client.list_container_stats(
        pb.ContainerStatsFilter(pod_sandbox_id=sandbox[0]))
    assert [s.attributes.id for s in all_stats] == [cid]
    if cri_runtime.name == "embedded":
        assert stats.memory.working_set_bytes.value > 0
        assert stats.cpu.timestamp > 0


def test_pod_sandbox_stats(cri_runtime: Any) -> None:
    """CRI PodSandboxStats / ListPodSandboxStats (over the client's gRPC stub: the
    RuntimeClient interface has no method for them yet, so the fake is left out)."""
    if not hasattr(cri_runtime.client, "_rt"):
        pytest.skip(f"{cri_runtime.name}: not a gRPC client (no PodSandboxStats stub)")
    sandbox = cri_runtime.run("sbstats")
    cid = cri_runtime.start(sandbox, "busy", ["sleep", "1000"])
    stub = cri_runtime.client._rt
    one = stub.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=sandbox[0]),
                               timeout=30).stats
    assert one.attributes.id == sandbox[0]
    assert [c.attributes.id for c in one.linux.containers] == [cid]
    listed = stub.ListPodSandboxStats(pb.ListPodSandboxStatsRequest(
        filter=pb.PodSandboxStatsFilter(id=sandbox[0])), timeout=30).stats
    assert [s.attributes.id for s in listed] == [sandbox[0]]
    if cri_runtime.name == "embedded":
        assert one.linux.memory.working_set_bytes.value > 0
        assert one.linux.memory.working_set_bytes.value == \
            one.linux.containers[0].memory.working_set_bytes.value


def test_list_filters(cri_runtime: Any) -> None:
    client = cri_runtime.client
    a = cri_runtime.run("fa", labels={"tier": "front"})
    b = cri_runtime.run("fb", labels={"tier": "back"})
    a_run = cri_runtime.start(a, "run", ["sleep", "1000"], labels={"role": "server"})
    a_done = cri_runtime.start(a, "done", ["true"], labels={"role": "job"})
    b_run = cri_runtime.start(b, "run", ["sleep", "1000"], labels={"role": "server"})
    cri_runtime.wait_exited(a_done)

    def ids(f: pb.ContainerFilter) -> set[str]:
        return {c.id for c in client.list_containers(f)}

    assert ids(pb.ContainerFilter(id=a_run)) == {a_run}
    assert ids(pb.ContainerFilter(pod_sandbox_id=a[0])) == {a_run, a_done}
    running = pb.ContainerStateValue(state=pb.CONTAINER_RUNNING)
    exited = pb.ContainerStateValue(state=pb.CONTAINER_EXITED)
    assert ids(pb.ContainerFilter(pod_sandbox_id=a[0], state=running)) == {a_run}
    assert a_done in ids(pb.ContainerFilter(state=exited))
    assert ids(pb.ContainerFilter(label_selector={"role": "server"})) >= {a_run, b_run}
    assert a_done not in ids(pb.ContainerFilter(label_selector={"role": "server"}))

    sb = {s.id for s in client.list_pod_sandbox(pb.PodSandboxFilter(label_selector={
        "tier": "front", "podvisor.test/run": cri_runtime.run_label}))}
    assert sb == {a[0]}
    assert {s.id for s in client.list_pod_sandbox(pb.PodSandboxFilter(id=b[0]))} == {b[0]}
    client.stop_pod_sandbox(b[0])
    notready = pb.PodSandboxStateValue(state=pb.SANDBOX_NOTREADY)
    assert b[0] in {s.id for s in client.list_pod_sandbox(pb.PodSandboxFilter(state=notready))}


def test_images(cri_runtime: Any) -> None:
    client = cri_runtime.client
    image = client.image_status(cri_runtime.image)
    assert image is not None and image.id
    assert image.id in {i.id for i in client.list_images()}
    assert client.image_status("podvisor.invalid/no-such-image:v0") is None
    if isinstance(client, FakeRuntimeClient):  # its registry: told which names do not exist
        client.unpullable.add("127.0.0.1:1/podvisor/no-such-image:v0")
    with pytest.raises(CriError):
        client.pull_image("127.0.0.1:1/podvisor/no-such-image:v0")
    assert client.image_fs_info().image_filesystems


def test_container_events_stream_or_unimplemented(cri_runtime: Any) -> None:
    """The embedded runtime pushes events (see test_embedded_durability); containerd 1.6 says
    UNIMPLEMENTED, which is what tells PLEG to rely on relisting."""
    stream = cri_runtime.client.container_events()
    try:
        if cri_runtime.name in ("embedded", "fake"):
            stream.wait_subscribed()  # from here on no event is missed
            sandbox = cri_runtime.run("ev")
            cri_runtime.client.create_container(
                sandbox[0], cri_runtime.container_config("c", ["true"]), sandbox[1])
            event = next(iter(stream))
            assert event.container_event_type == pb.CONTAINER_CREATED_EVENT
        else:
            with pytest.raises(CriError) as info:
                stream.wait_subscribed()  # the answer is the status: no headers first
            assert info.value.code == grpc.StatusCode.UNIMPLEMENTED
            with pytest.raises(CriError) as info:
                next(iter(stream))
            assert info.value.code == grpc.StatusCode.UNIMPLEMENTED
    finally:
        stream.close()


def test_an_event_stream_closed_from_another_thread_ends_its_reader(
        cri_runtime: Any, wait_for: Any) -> None:
    """PLEG's and the sync loop's watchers read on a thread and are stopped from the main one:
    the blocked reader's iteration ends cleanly (no error), and so does a stream closed before
    its reader ever ran."""
    import threading

    if cri_runtime.name not in ("embedded", "fake"):
        pytest.skip("containerd 1.6 has no event stream (UNIMPLEMENTED, tested above)")
    got: list[object] = []
    stream = cri_runtime.client.container_events()
    subscribed = threading.Event()

    def read() -> None:
        try:
            stream.wait_subscribed()
            subscribed.set()  # from here on no event is missed
            got.extend(stream)
            got.append("ended")
        except BaseException as exc:  # the test fails on any
            got.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert subscribed.wait(30), got
        sandbox = cri_runtime.run("evclose")
        cri_runtime.client.create_container(
            sandbox[0], cri_runtime.container_config("c", ["true"]), sandbox[1])
        wait_for(lambda: got, 30.0, message="the created event at the blocked reader")
    finally:
        stream.close()
        reader.join(10)
    assert not reader.is_alive()
    assert got[-1] == "ended" and not any(isinstance(x, BaseException) for x in got), got
    unused = cri_runtime.client.container_events()
    unused.close()
    assert list(unused) == []


def test_update_container_resources_applies_or_says_why_not(cri_runtime: Any) -> None:
    cid = cri_runtime.start(cri_runtime.run("resources"), "c", ["sleep", "1000"])
    limits = pb.LinuxContainerResources(memory_limit_in_bytes=256 * 1024 * 1024,
                                        cpu_period=100_000, cpu_quota=50_000)
    try:
        cri_runtime.client.update_container_resources(cid, limits)
    except CriError as err:
        assert "cgroup" in err.message, err
        if cri_runtime.name == "embedded":  # as root with cgroups mounted it must work
            assert os.geteuid() != 0 or not os.path.isdir("/sys/fs/cgroup/memory"), err
            assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    else:
        if cri_runtime.name == "embedded":  # no cgroup_parent: under the runtime's default
            folder = Path("/sys/fs/cgroup/memory/podvisor-embedded") / cid
            assert (folder / "memory.limit_in_bytes").read_text().strip() == str(256 * 1024**2)
            assert (folder / "cgroup.procs").read_text().split(), "the process was moved in"
            cri_runtime.client.stop_container(cid, 0)
            cri_runtime.client.remove_container(cid)
            assert not folder.exists()
            for hierarchy in Path("/sys/fs/cgroup").glob("*/podvisor-embedded"):
                with contextlib.suppress(OSError):  # the runtime's folder, if no one else's
                    hierarchy.rmdir()
            return
    assert cri_runtime.client.container_status(cid).state == pb.CONTAINER_RUNNING
