"""The /stats/summary scrape path's memory between scrapes: the runtime's process-group scan
(groupscan.GroupScanner) and the server's log folder usage (logusage.LogUsage) give what a fresh
read gives. Real processes and real folders."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.maps import PlegContainer, PlegPod, PlegSandbox
from podvisor.services.cri import CriError
from podvisor.services.runtime.cgroups import Usage
from podvisor.services.runtime.groupscan import GroupScanner, children_files
from podvisor.services.runtime.model import Container, StartInfo
from podvisor.services.runtime.stats import StatsCollector
from podvisor.services.server.logusage import LogUsage, log_usage
from podvisor.services.server.summary import summary
from podvisor.services.server.summarymaker import SummaryMaker


@pytest.fixture
def groups() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes each in its own process group (as containers are), killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:  # the group each started (its own pid), members and all
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _group(started: list[subprocess.Popen[bytes]], script: str) -> int:
    p = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    started.append(p)
    return p.pid


def _fresh(pgid: int) -> tuple[int, int]:
    """psutil's figures for the group's live members (what the scan used to compute)."""
    cpu = rss = 0
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                t = proc.cpu_times()
                cpu += int((t.user + t.system) * 1e9)
                rss += proc.memory_info().rss
        except (psutil.Error, ProcessLookupError):
            continue
    return cpu, rss


def test_group_scan_matches_psutil_and_finds_new_groups(
        groups: list[subprocess.Popen[bytes]], wait_for: object, tmp_path: Path) -> None:
    # a member holding 32 MiB resident: its death moves the sum far beyond stat's error bound
    # (it says when its pages are all touched: the figures are compared once they hold still)
    held = tmp_path / "held"
    big = (f"{sys.executable} -c 'import time; b = b\"x\" * (32 << 20); "
           f"open(\"{held}\", \"w\").close(); time.sleep(600)'")
    a = _group(groups, f"sleep 600 & {big} & wait")
    wait_for(lambda: len(psutil.Process(a).children()) == 2  # type: ignore[operator]
             and held.exists(), 10.0, 0.02)
    scanner = GroupScanner(full_every=3600.0)
    first = scanner.usage({a}, now=0.0)
    cpu, rss = _fresh(a)
    slack = 3 * 2 * max(32, 2 * (os.cpu_count() or 1)) * 3 * os.sysconf("SC_PAGE_SIZE")
    assert rss > 0 and abs(first[a][1] - rss) <= slack  # (stat's rss: per-CPU deltas pending)
    assert abs(first[a][0] - cpu) <= 20_000_000
    # a group that appears later is found without a full pass (its processes are new pids)
    b = _group(groups, "sleep 600")
    # (once the child has exec'd: in the middle of its exec it has no rss yet)
    wait_for(lambda: psutil.Process(b).name() in ("sh", "sleep")  # type: ignore[operator]
             and psutil.Process(b).memory_info().rss > 0, 10.0, 0.02)
    second = scanner.usage({a, b}, now=1.0)
    assert set(second) == {a, b} and second[b][1] > 0
    # a member that dies leaves the sum (the 32 MiB one: a sleep's ~1 MiB is within stat's
    # error bound, so a sleep's death could read as a rise: 2.5 MB, then 3.3 MB, in a run)
    [holder] = [c for c in psutil.Process(a).children() if "python" in c.name()]
    holder.kill()
    wait_for(lambda: len([c for c in psutil.Process(a).children()  # type: ignore[operator]
                          if c.status() != psutil.STATUS_ZOMBIE]) == 1, 10.0, 0.02)
    assert scanner.usage({a, b}, now=2.0)[a][1] < first[a][1] - (16 << 20)
    assert scanner.usage({b}, now=3.0).keys() == {b}


def test_group_scan_counts_a_process_that_has_just_execd(
        groups: list[subprocess.Popen[bytes]]) -> None:
    """A process stopped at its exec (traced: it stops before its first instruction) holds
    only the pages exec gave it, all still per-CPU deltas that ``stat``'s rss leaves out (0
    there since Linux 6.2): the scan reads it exact, from ``statm``. (Unstopped, such a
    process is read at any moment right after its exec, as a container just started.)"""
    p = subprocess.Popen([sys.executable, "-c", "import ctypes, os; "
                          "ctypes.CDLL(None).ptrace(0, 0, None, None); "  # PTRACE_TRACEME
                          "os.execvp('sleep', ['sleep', '600'])"], start_new_session=True)
    groups.append(p)
    _pid, status = os.waitpid(p.pid, 0)  # its tracer (this process) hears the exec's stop
    assert os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGTRAP
    with open(f"/proc/{p.pid}/statm") as f:
        exact = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    scanner = GroupScanner(full_every=3600.0)
    try:
        assert exact > 0 and scanner.usage({p.pid}, now=0.0)[p.pid][1] == exact
    finally:
        scanner.close()


def _controlled(started: list[subprocess.Popen[bytes]], script: str
                ) -> subprocess.Popen[bytes]:
    """A group whose leader runs ``script``, which reads its steps from stdin."""
    p = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, start_new_session=True)
    started.append(p)
    return p


def _step(p: subprocess.Popen[bytes]) -> None:
    assert p.stdin is not None
    p.stdin.write(b"go\n")
    p.stdin.flush()


def _live_members(pgid: int, zombies: bool = False) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and (
                    zombies or proc.status() != psutil.STATUS_ZOMBIE):
                out.append(proc)
    return out


def test_group_scan_follows_children_and_keeps_members_open(
        groups: list[subprocess.Popen[bytes]], wait_for: Any) -> None:
    """Between full passes, a member's new child is found through the kernel's children
    list; each member's stat stays open (up to max_open), a dead member's is closed."""
    if not children_files():
        pytest.skip("this kernel lists no children (CONFIG_PROC_CHILDREN)")
    leader = _controlled(groups, "read x; sleep 600 & read y; sleep 600 & wait")
    scanner = GroupScanner(full_every=3600.0)
    try:
        first = scanner.usage({leader.pid}, now=0.0)  # the full pass: the leader alone
        assert scanner.open_count() == 1 and first[leader.pid][1] > 0
        _step(leader)
        wait_for(lambda: len(_live_members(leader.pid)) == 2, 10.0, 0.02)
        second = scanner.usage({leader.pid}, now=1.0)  # not a full pass: the child is found
        assert scanner.open_count() == 2 and second[leader.pid][1] > 0
        _step(leader)
        wait_for(lambda: len(_live_members(leader.pid)) == 3, 10.0, 0.02)
        assert scanner.usage({leader.pid}, now=2.0) and scanner.open_count() == 3
        child = next(p for p in psutil.Process(leader.pid).children())
        child.kill()
        wait_for(lambda: len(_live_members(leader.pid)) == 2, 10.0, 0.02)
        scanner.usage({leader.pid}, now=3.0)
        assert scanner.open_count() == 2  # the dead member's descriptors are closed
        assert scanner.usage(set(), now=4.0) == {} and scanner.open_count() == 0
        # past the cap a member is read through descriptors opened for the read and closed,
        # and stays a member: the next pass (not a full one) still counts all of them, also
        # where no children list would find them again
        capped = GroupScanner(full_every=3600.0, max_open=1, follow_children=False)
        assert capped.usage({leader.pid}, now=0.0) == scanner.usage({leader.pid}, now=5.0)
        rss_all = scanner.usage({leader.pid}, now=6.0)[leader.pid][1]
        assert capped.usage({leader.pid}, now=1.0)[leader.pid][1] >= 0.9 * rss_all
        assert capped.open_count() == 1
        capped.close()
        assert capped.usage({leader.pid}, now=2.0)[leader.pid][1] >= 0.9 * rss_all
        capped.close()
    finally:
        scanner.close()
    assert scanner.open_count() == 0


@pytest.mark.parametrize("follow", [True, False])
def test_group_scan_orphan_before_and_after_a_full_pass(
        groups: list[subprocess.Popen[bytes]], wait_for: Any, follow: bool) -> None:
    """An orphan (a double fork: its parent left at once) is no member's child: following
    children lists, it is counted from the next full pass on (the documented blind spot);
    listing /proc at every pass (no children lists), at once, as a new pid."""
    if follow and not children_files():
        pytest.skip("this kernel lists no children (CONFIG_PROC_CHILDREN)")
    leader = _controlled(groups, "read x; (sleep 600 &); read y")
    scanner = GroupScanner(full_every=100.0, follow_children=follow)
    orphan = 0
    try:
        alone = scanner.usage({leader.pid}, now=0.0)[leader.pid]
        _step(leader)
        # the leader back in `read`: the subshell is gone (reaped), its sleep re-parented
        def reparented() -> list[psutil.Process] | None:
            try:  # (the subshell may go between the listing and its ppid)
                m = _live_members(leader.pid, zombies=True)
                return m if len(m) == 2 and all(p.ppid() != leader.pid for p in m) else None
            except psutil.Error:
                return None

        members = wait_for(reparented, 10.0, 0.02)
        orphan = next(p.pid for p in members if p.pid != leader.pid)
        after = scanner.usage({leader.pid}, now=1.0)[leader.pid]
        if follow:
            assert scanner.open_count() == 1  # not seen (re-parented: nobody's child here)
            after = scanner.usage({leader.pid}, now=100.0)[leader.pid]  # the full pass
        assert scanner.open_count() == 2 and after[1] > alone[1]
        # later passes count the same: read until the new sleep's pages have settled (its rss
        # still grows by a page or two right after its exec)
        now = iter(range(101, 100_000))
        wait_for(lambda: scanner.usage({leader.pid}, now=float(next(now))) ==
                 scanner.usage({leader.pid}, now=float(next(now))), 10.0, 0.05,
                 "two passes in a row counting the same")
    finally:
        scanner.close()
        if orphan:  # re-parented to pytest (a subreaper): kill and reap it here
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(orphan, 0)


def _container(cid: str, running: bool) -> Container:
    cfg = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=f"n-{cid}", attempt=1),
        labels={"io.kubernetes.pod.uid": f"uid-{cid}", "io.kubernetes.pod.name": "p"},
        annotations={"io.kubernetes.container.restartCount": "1"})
    started = StartInfo(monitor_pid=0, monitor_ticks=0, pid=1, pid_ticks=0,
                        started_at=1) if running else None
    return Container(cid, "s", cfg, 1, "", "host", started=started)


def test_stats_wire_answer_is_the_messages_answer() -> None:
    """``collect_wire`` (cached attributes, one reused message for the figures) serializes
    what ``collect`` builds message by message: running and not-running containers, rates
    from the previous sample, across calls; a forgotten container's cache goes too."""
    now = [1_000_000_000]
    cpu = {"a": 0, "b": 0}

    def make() -> StatsCollector:
        return StatsCollector(wall=lambda: now[0], cgroup_of=lambda cid: {"cpu": cid},
                              read_cgroup=lambda d: Usage(cpu[d["cpu"]], 300, 200, 100))

    by_messages, by_wire = make(), make()
    containers = [_container("a", True), _container("idle", False), _container("b", True)]
    for step in range(3):
        now[0] += 1_000_000_000
        cpu["a"] += 250_000_000 * step
        cpu["b"] += 7
        want = pb.ListContainerStatsResponse(stats=by_messages.collect(containers))
        got = pb.ListContainerStatsResponse.FromString(by_wire.collect_wire(containers))
        assert got == want, step
    assert got.stats[0].cpu.usage_nano_cores.value == 500_000_000
    assert not got.stats[1].HasField("cpu") and got.stats[1].HasField("writable_layer")
    assert got.stats[1].attributes.annotations["io.kubernetes.container.restartCount"] == "1"
    by_wire.forget("a")
    assert "a" not in by_wire._attrs_wire and "b" in by_wire._attrs_wire
    by_wire.close()
    by_messages.close()


@pytest.mark.parametrize("asked", ["all", "of"])
def test_log_usage_follows_growth_rotation_and_removal(tmp_path: Path, asked: str) -> None:
    """One ``LogUsage`` across calls (its memory of frozen bytes) gives what a fresh read
    gives: every folder (``all``) or the running containers' (``of``)."""
    usage = LogUsage()
    wanted = [("default", "web", "uid1", "app"), ("default", "db", "uid2", "db")]

    def read() -> dict[tuple[str, str], tuple[int, int]]:
        got = usage.all(str(tmp_path)) if asked == "all" else usage.of(str(tmp_path), wanted)
        assert got == log_usage(str(tmp_path))  # a fresh read
        return got

    cdir = tmp_path / "default_web_uid1" / "app"
    cdir.mkdir(parents=True)
    (cdir / "0.log").write_bytes(b"a" * 10)
    assert read() == {("uid1", "app"): (10, 1)}
    with (cdir / "0.log").open("ab") as f:  # the live file grows: no folder change
        f.write(b"b" * 5)
    assert read() == {("uid1", "app"): (15, 1)}
    (cdir / "0.log").rename(cdir / "0.log.20260101-000000")  # rotated, a new live file
    (cdir / "0.log").write_bytes(b"c")
    assert read() == {("uid1", "app"): (16, 2)}
    (cdir / "0.log.20260101-000000").rename(cdir / "0.log.20260101-000000.gz")  # compressed
    assert read() == {("uid1", "app"): (16, 2)}
    (cdir / "1.log").write_bytes(b"dd")  # restarted: 1.log is live, 0.log frozen
    with (cdir / "1.log").open("ab") as f:
        f.write(b"e")
    assert read() == {("uid1", "app"): (19, 3)}
    (tmp_path / "default_db_uid2" / "db").mkdir(parents=True)  # a second pod, no log yet
    assert read() == {("uid1", "app"): (19, 3), ("uid2", "db"): (0, 0)}
    for f in cdir.iterdir():
        f.unlink()
    cdir.rmdir()
    assert read() == {("uid2", "db"): (0, 0)}


def _stats(cid: str, uid: str, pod: str, name: str, cpu_ns: int) -> pb.ContainerStats:
    return pb.ContainerStats(
        attributes=pb.ContainerAttributes(
            id=cid, metadata=pb.ContainerMetadata(name=name),
            labels={"io.kubernetes.pod.uid": uid, "io.kubernetes.pod.name": pod,
                    "io.kubernetes.pod.namespace": "default"}),
        cpu=pb.CpuUsage(timestamp=2_000_000_000_000_000_000,
                        usage_core_nano_seconds=pb.UInt64Value(value=cpu_ns)),
        memory=pb.MemoryUsage(timestamp=2_000_000_000_000_000_000,
                              working_set_bytes=pb.UInt64Value(value=cpu_ns + 1)))


def _pleg(*pods: tuple[str, str, int]) -> dict[str, Any]:
    """uid -> a PlegPod with a ready sandbox created at ``t`` and container ``c-<uid>``."""
    return {uid: PlegPod(name=name, namespace="default",
                         sandboxes=(PlegSandbox(f"s-{uid}", "SANDBOX_READY", t),),
                         containers=(PlegContainer(f"c-{uid}", "c", "CONTAINER_RUNNING",
                                                   created_at=t + 1_000_000_000),))
            for uid, name, t in pods}


def test_summary_maker_matches_a_fresh_summary_across_changes(tmp_path: Path) -> None:
    """What the maker keeps between scrapes (container refs by ID, start times per pleg
    mapping, log folders) never shows: each answer equals a summary built from scratch, as
    containers come and go, the pleg replica moves, a log grows. (The refs memo takes a
    container ID for one container forever: CRI IDs are never reused.) The JSON
    text is the same Summary; ImageFsInfo's failure leaves imageFs out with the reason;
    ListContainerStats' failure raises."""
    pod_logs = tmp_path / "pod-logs"
    (pod_logs / "default_a_ua" / "c").mkdir(parents=True)
    (pod_logs / "default_a_ua" / "c" / "0.log").write_bytes(b"x" * 7)
    answer: list[pb.ContainerStats] = []
    image_fs_fails = [False]

    def image_fs_info() -> pb.ImageFsInfoResponse:
        if image_fs_fails[0]:
            raise CriError("ImageFsInfo", grpc.StatusCode.UNAVAILABLE, "down")
        return pb.ImageFsInfoResponse(image_filesystems=[pb.FilesystemUsage(
            timestamp=1, used_bytes=pb.UInt64Value(value=5))])

    wall = [1_800_000_000.0]
    maker = SummaryMaker("n", 0, str(tmp_path), str(pod_logs), lambda: list(answer),
                         image_fs_info, lambda: wall[0])

    def check(pleg: dict[str, Any]) -> dict[str, Any]:
        wall[0] += 10.0
        body, why = maker.make(pleg)
        assert why is None
        want = summary("n", 0, body["node"], list(answer), pleg,
                       log_usage(str(pod_logs)), body["node"]["runtime"]["imageFs"],
                       int(wall[0] * 1e9))
        assert body == want
        return body

    pleg = _pleg(("ua", "a", 1_700_000_000_000_000_000))
    answer[:] = [_stats("c-ua", "ua", "a", "c", 10)]
    first = check(pleg)
    assert first["pods"][0]["startTime"] == "2023-11-14T22:13:20Z"
    assert first["pods"][0]["containers"][0]["logs"]["usedBytes"] == 7
    answer[:] = [_stats("c-ua", "ua", "a", "c", 20), _stats("c-ub", "ub", "b", "c", 30)]
    pleg = _pleg(("ua", "a", 1_700_000_000_000_000_000), ("ub", "b", 1_700_000_100_000_000_000))
    (pod_logs / "default_a_ua" / "c" / "0.log").write_bytes(b"x" * 9)
    body = check(pleg)
    assert [p["podRef"]["name"] for p in body["pods"]] == ["a", "b"]
    assert body["pods"][1]["startTime"] == "2023-11-14T22:15:00Z"
    answer[:] = [_stats("c-uc", "uc", "c", "d", 40)]  # a and b gone, another pod's container
    body = check(pleg)
    assert body["pods"][0]["podRef"] == {"name": "c", "namespace": "default", "uid": "uc"}
    assert body["pods"][0]["startTime"] is None  # not in the pleg map
    text, why = maker.make_json(pleg)
    assert why is None and json.loads(text)["pods"] == body["pods"]
    image_fs_fails[0] = True
    body, why = maker.make(pleg)
    assert why is not None and "down" in why and "runtime" not in body["node"]
    answer.append(pb.ContainerStats())  # not running (no cpu): left out
    assert len(maker.make(pleg)[0]["pods"]) == 1

    def refuse() -> list[pb.ContainerStats]:
        raise CriError("ListContainerStats", grpc.StatusCode.UNAVAILABLE, "down")

    broken = SummaryMaker("n", 0, str(tmp_path), str(pod_logs), refuse, None, lambda: 1.0)
    with pytest.raises(CriError):
        broken.make({})
