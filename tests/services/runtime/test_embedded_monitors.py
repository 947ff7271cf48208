"""The embedded runtime's two container monitors, one contract: the C monitor (monitor.c, built
by native.py, used whenever a C compiler is there) and the Python monitor (monitor.py, the
fallback; forced here with ``PODVISOR_MONITOR=python``). Each behaviour runs against both."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from podvisor.services.runtime.monitor import MAX_LINE
from podvisor.services.runtime.native import MonitorBinary, monitor_binary
from tests.conftest import process_gone
from tests.services.conftest import RuntimeUnderTest, poll, running_embedded
from tests.services.cri.test_contract_io import parse_log
from tests.services.cri.test_contract_mounts import check_bind_mounts, check_recursive_read_only
from tests.services.cri.test_contract_seccomp import (
    check_exec_is_filtered,
    check_localhost,
    check_runtime_default,
    write_profile,
)
from tests.services.cri.test_contract_security import (
    check_identity,
    check_masked_paths,
    check_read_only_root,
)
from tests.services.runtime.test_attach import check_interactive


@pytest.fixture(params=["c", "python"])
def monitored(request: pytest.FixtureRequest) -> Iterator[RuntimeUnderTest]:
    if request.param == "c" and monitor_binary().path is None:
        pytest.skip(f"C monitor unavailable: {monitor_binary().why}")
    env = {"PODVISOR_MONITOR": "python"} if request.param == "python" else {}
    with running_embedded("pvmon", env) as rt:
        yield RuntimeUnderTest(request.param, rt.client, "host", rt.base / "t", embedded=rt)


def _started(rt: RuntimeUnderTest, cid: str) -> dict[str, Any]:
    assert rt.embedded is not None
    path = rt.embedded.root / "containers" / f"{cid}.started.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_the_monitor_is_the_one_asked_for(monitored: RuntimeUnderTest) -> None:
    cid = monitored.start(monitored.run("which"), "c", ["sleep", "1000"])
    monitor = psutil.Process(_started(monitored, cid)["monitor_pid"])
    assert monitor.name() == "pv-monitor"
    exe = Path(monitor.exe()).name
    if monitored.name == "c":
        assert exe.startswith("pv-monitor-")
        assert monitor.memory_full_info().uss < 1024 * 1024  # the point of the C monitor
    else:
        assert exe.startswith("python")


def test_logs_exit_code_and_long_lines(monitored: RuntimeUnderTest) -> None:
    cmd = ["sh", "-c", f"echo out; echo err >&2; head -c {MAX_LINE + 10} /dev/zero | tr '\\0' x;"
                       " echo; printf tail; exit 3"]
    cid = monitored.start(monitored.run("logs"), "c", cmd, env={"A": "b"})
    status = monitored.wait_exited(cid)
    assert (status.exit_code, status.reason) == (3, "Error")
    assert status.finished_at >= status.started_at > 0
    records = parse_log(status.log_path)
    assert ("stdout", "F", "out") in records and ("stderr", "F", "err") in records
    stdout = [r for r in records if r[0] == "stdout"]
    assert ("stdout", "P", "x" * MAX_LINE) in stdout
    assert ("stdout", "F", "x" * 10) in stdout
    assert stdout[-1] == ("stdout", "F", "tail")


def test_environment_path_and_working_dir(monitored: RuntimeUnderTest, tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "mytool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho \"$GREETING from $(pwd)\"\n")
    tool.chmod(0o755)
    sid, sconfig = monitored.run("env")
    config = monitored.container_config("c", ["mytool"], env={
        "GREETING": "hello", "PATH": f"{tool.parent}:/usr/bin:/bin"})
    config.working_dir = str(tmp_path)
    cid = monitored.client.create_container(sid, config, sconfig)
    monitored.client.start_container(cid)
    status = monitored.wait_exited(cid)
    assert status.exit_code == 0
    assert ("stdout", "F", f"hello from {tmp_path}") in parse_log(status.log_path)


@pytest.mark.parametrize("cmd, cwd, expect", [
    (["no-such-command-anywhere"], "", 'exec "no-such-command-anywhere": No such file'),
    (["/etc/passwd"], "", "Permission denied (errno 13 EACCES)"),
    (["true"], "/no/such/dir", "chdir '/no/such/dir': No such file or directory"),
])
def test_start_errors_are_reported(monitored: RuntimeUnderTest, cmd: list[str], cwd: str,
                                   expect: str) -> None:
    sid, sconfig = monitored.run("err")
    config = monitored.container_config("c", cmd)
    config.working_dir = cwd
    cid = monitored.client.create_container(sid, config, sconfig)
    with pytest.raises(CriError) as info:
        monitored.client.start_container(cid)
    assert expect in info.value.message
    status = monitored.client.container_status(cid)
    assert status.state == pb.CONTAINER_EXITED and status.reason == "StartError"


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
def test_bind_mounts(monitored: RuntimeUnderTest, tmp_path: Path) -> None:
    check_bind_mounts(monitored, tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing users and capabilities needs root")
def test_security_context(monitored: RuntimeUnderTest) -> None:
    """Users, groups, capabilities, no_new_privs, masks and a read-only root: applied by the
    monitor in the container's child before exec."""
    monitored.tmp.mkdir(parents=True, exist_ok=True)
    check_identity(monitored)
    check_masked_paths(monitored)
    check_read_only_root(monitored)


@pytest.mark.skipif(os.geteuid() != 0, reason="a filter without no_new_privs needs root")
def test_seccomp(monitored: RuntimeUnderTest) -> None:
    """The default profile and a Localhost one, loaded by the monitor in the container's child
    (after no_new_privs, or before the ids change without it): a denied syscall fails EPERM."""
    monitored.tmp.mkdir(parents=True, exist_ok=True)
    check_runtime_default(monitored)
    check_localhost(monitored)
    check_exec_is_filtered(monitored)


@pytest.mark.skipif(os.geteuid() != 0, reason="a filter without no_new_privs needs root")
def test_a_profile_that_denies_the_setup_fails_the_start(monitored: RuntimeUnderTest) -> None:
    """Without no_new_privs the filter is loaded before the ids change (runc's order), so a
    profile denying setresuid fails the start at that step, as with runc."""
    monitored.tmp.mkdir(parents=True, exist_ok=True)
    path = write_profile(monitored.tmp, {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["setresuid"], "action": "SCMP_ACT_ERRNO"}]})
    sid, sconfig = monitored.run("denysetuid")
    config = monitored.container_config("c", ["true"])
    config.linux.security_context.seccomp.profile_type = pb.SecurityProfile.Localhost
    config.linux.security_context.seccomp.localhost_ref = path
    config.linux.security_context.run_as_user.value = 65534
    cid = monitored.client.create_container(sid, config, sconfig)
    with pytest.raises(CriError) as err:
        monitored.client.start_container(cid)
    assert "security context: setuid: Operation not permitted (errno 1 EPERM)" \
        in err.value.message


def test_stdin_and_a_terminal(monitored: RuntimeUnderTest) -> None:
    """``kubectl run -it``: stdin (stdin_once) and a terminal through the monitor's attach
    socket (monitor.c STDIO, monitor_stdio.py)."""
    monitored.tmp.mkdir(parents=True, exist_ok=True)
    check_interactive(monitored, poll)


@pytest.mark.skipif(os.geteuid() != 0, reason="a UTS namespace needs root")
def test_the_pods_hostname_and_resolv_conf(monitored: RuntimeUnderTest) -> None:
    """A sandbox with a network of its own asks for a hostname: the container gets it in a UTS
    namespace of its own (and ExecSync joins it); a DNS config other than the node's is bound
    over the host image's /etc/resolv.conf; the host's own hostname is untouched."""
    import socket

    sconfig = monitored.sandbox_config("named")
    sconfig.hostname = "pv-named-host"
    sconfig.linux.security_context.namespace_options.network = pb.POD
    sconfig.dns_config.servers.append("192.0.2.53")
    sconfig.dns_config.searches.append("pv.example")
    sid = monitored.client.run_pod_sandbox(sconfig)
    config = monitored.container_config("c", ["sh", "-c", "hostname; cat /etc/resolv.conf; "
                                                          "exec sleep 1000"])
    cid = monitored.client.create_container(sid, config, sconfig)
    monitored.client.start_container(cid)
    path = monitored.client.container_status(cid).log_path
    poll(lambda: len(parse_log(path)) >= 3, message="the container's report")
    lines = [text for _s, _t, text in parse_log(path)]
    assert lines == ["pv-named-host", "nameserver 192.0.2.53", "search pv.example"], lines
    result = monitored.client.exec_sync(cid, ["hostname"], 10)
    assert result.stdout.decode().strip() == "pv-named-host"
    assert socket.gethostname() != "pv-named-host"


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
def test_mount_errors_are_reported(monitored: RuntimeUnderTest, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    sid, sconfig = monitored.run("mounterr")
    config = monitored.container_config("c", ["true"])
    config.mounts.append(pb.Mount(host_path=str(tmp_path / "file"),
                                  container_path=str(tmp_path / "dir"), readonly=True))
    cid = monitored.client.create_container(sid, config, sconfig)
    with pytest.raises(CriError) as info:
        monitored.client.start_container(cid)
    expect = (f'mount "{tmp_path}/file" on "{tmp_path}/dir" read-only: Not a directory '
              "(errno 20 ENOTDIR)")
    assert expect in info.value.message
    status = monitored.client.container_status(cid)
    assert status.state == pb.CONTAINER_EXITED and status.reason == "StartError"


def test_log_reopen_and_signal_exit(monitored: RuntimeUnderTest) -> None:
    cmd = ["sh", "-c", "while true; do echo tick; sleep 0.02; done"]
    cid = monitored.start(monitored.run("reopen"), "c", cmd)
    path = monitored.client.container_status(cid).log_path
    poll(lambda: os.path.exists(path) and os.path.getsize(path) > 0, message="first tick")
    os.rename(path, path + ".1")
    monitored.client.reopen_container_log(cid)
    poll(lambda: os.path.exists(path) and os.path.getsize(path) > 0, message="tick in new log")
    monitored.client.stop_container(cid, 10)
    status = monitored.client.container_status(cid)
    assert status.exit_code == 143  # 128 + SIGTERM, as the kubelet reports it


def test_exit_while_runtime_down_is_recorded(monitored: RuntimeUnderTest) -> None:
    assert monitored.embedded is not None
    go = monitored.tmp / "go"
    monitored.tmp.mkdir(parents=True, exist_ok=True)
    cmd = ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.01; done; exit 9"]
    cid = monitored.start(monitored.run("down"), "c", cmd)
    monitor = psutil.Process(_started(monitored, cid)["monitor_pid"])
    monitored.embedded.kill9()
    go.write_text("now")
    poll(lambda: process_gone(monitor), message="the monitor to finish while the runtime is down")
    monitored.embedded.start()
    status = monitored.client.container_status(cid)
    assert (status.state, status.exit_code) == (pb.CONTAINER_EXITED, 9)


def test_no_compiler_means_the_python_monitor(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    got = monitor_binary(tmp_path / "cache")
    assert got == MonitorBinary(None, got.why, seccomp_why=got.seccomp_why)
    assert "no-such-cc" in got.why
    monkeypatch.setenv("PODVISOR_MONITOR", "python")
    assert monitor_binary().path is None


def test_the_c_monitor_builds_into_an_empty_cache(tmp_path: Path) -> None:
    """What a fresh machine does on the runtime's first start (skipped without a compiler)."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler")
    got = monitor_binary(tmp_path / "cache")
    assert got.path is not None, got.why
    assert got.path.parent == tmp_path / "cache" and os.access(got.path, os.X_OK)
    assert monitor_binary(tmp_path / "cache") == got  # built once, then reused
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [got.path.name]  # no tmp left


@pytest.fixture
def cgroup_parent(monitored: RuntimeUnderTest) -> Iterator[str]:
    """Sandboxes of ``monitored`` under a per-test cgroup parent, removed at teardown."""
    from tests.support.containerd import remove_pod_cgroup

    if not Path("/sys/fs/cgroup/memory").is_dir() or os.geteuid() != 0:
        pytest.skip("needs root and a cgroup v1 memory hierarchy")
    monitored.cgroup_parent = f"/podvisor-test-{os.getpid()}-{monitored.name}"
    yield monitored.cgroup_parent
    for sb in monitored.client.list_pod_sandbox():
        monitored.client.stop_pod_sandbox(sb.id)
        monitored.client.remove_pod_sandbox(sb.id)
    for cgroup in monitored.pod_cgroups:
        remove_pod_cgroup(cgroup)
    remove_pod_cgroup(monitored.cgroup_parent)


def _limited(rt: RuntimeUnderTest, name: str, cmd: list[str]) -> tuple[str, Path]:
    sid, sconfig = rt.run(name)
    config = rt.container_config("c", cmd)
    config.linux.resources.memory_limit_in_bytes = 64 * 1024 * 1024
    cid = rt.client.create_container(sid, config, sconfig)
    return cid, Path(sconfig.log_directory) / "c/0.log"


def test_the_command_starts_in_its_cgroup(monitored: RuntimeUnderTest,
                                          cgroup_parent: str) -> None:
    """/proc/self/cgroup read by the command's first process (cat execs at once) already
    shows the container's memory cgroup: the join happened before the exec."""
    cid, log = _limited(monitored, "joined", ["cat", "/proc/self/cgroup"])
    monitored.client.start_container(cid)
    assert monitored.wait_exited(cid).exit_code == 0
    lines = dict(line.split(":", 2)[1:] for _s, _t, line in parse_log(str(log)))
    assert lines["memory"].startswith(f"{cgroup_parent}/pod") and lines["memory"].endswith(cid)
    assert lines["cpuacct"] == lines["memory"]
    assert not lines["pids"].endswith(cid)  # no pids limit: not moved there


def test_a_failed_join_fails_the_start(monitored: RuntimeUnderTest, cgroup_parent: str) -> None:
    cid, _log = _limited(monitored, "nojoin", ["true"])
    memory = next(Path("/sys/fs/cgroup/memory").glob(f"{cgroup_parent.strip('/')}/*/{cid}"))
    memory.rmdir()  # removed behind the runtime's back
    with pytest.raises(CriError) as err:
        monitored.client.start_container(cid)
    assert f'join cgroup "{memory}/tasks": No such file or directory' in err.value.message
    status = monitored.client.container_status(cid)
    assert (status.state, status.reason) == (pb.CONTAINER_EXITED, "StartError")


@pytest.mark.parametrize("user", [None, 65534])
def test_the_command_sees_its_oom_score_adj_from_its_first_instruction(
        monitored: RuntimeUnderTest, user: int | None) -> None:
    """The monitor's child writes the container's oom_score_adj before its exec (and before it
    changes its uid): ``cat`` reads its own value with its first instruction, not the
    runtime's."""
    from podvisor.services.runtime import oom

    current, lowering_allowed = oom.own_state()  # the runtime inherits the test's value
    wanted = min(oom.MAX, max(current, 0) + 500)
    expected = oom.effective(wanted, current, lowering_allowed)
    assert expected != current
    sid, sconfig = monitored.run(f"oom{user}")
    config = monitored.container_config("c", ["cat", "/proc/self/oom_score_adj"])
    config.linux.resources.oom_score_adj = wanted
    if user is not None:
        config.linux.security_context.run_as_user.value = user
    cid = monitored.client.create_container(sid, config, sconfig)
    monitored.client.start_container(cid)
    status = monitored.wait_exited(cid)
    lines = [text for _s, _t, text in parse_log(status.log_path)]
    assert (status.exit_code, lines) == (0, [str(expected)])


@pytest.mark.skipif(os.geteuid() != 0, reason="changing groups needs root")
def test_a_failed_security_step_fails_the_start(monitored: RuntimeUnderTest) -> None:
    """More supplemental groups than the kernel's NGROUPS_MAX (65536): setgroups(2) fails
    EINVAL in the container's child; the start fails naming the step and the errno."""
    sid, sconfig = monitored.run("toomanygroups")
    config = monitored.container_config("c", ["true"])
    config.linux.security_context.supplemental_groups.extend(range(100_000, 100_000 + 65_537))
    cid = monitored.client.create_container(sid, config, sconfig)
    with pytest.raises(CriError) as err:
        monitored.client.start_container(cid)
    assert "security context: setgroups: Invalid argument (errno 22 EINVAL)" \
        in err.value.message
    status = monitored.client.container_status(cid)
    assert (status.state, status.reason) == (pb.CONTAINER_EXITED, "StartError")


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")
def test_recursive_read_only_mounts(monitored: RuntimeUnderTest, tmp_path: Path) -> None:
    """CRI ``recursive_read_only``: the submount under the volume is read-only too (the C
    monitor's and the Python monitor's ``mount_setattr``)."""
    check_recursive_read_only(monitored, tmp_path)
