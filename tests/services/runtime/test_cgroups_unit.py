"""Unit tests of the embedded runtime's cgroups (services/runtime/cgroups.py): the arithmetic
(``plan``: what is written for a LinuxContainerResources on v1 and v2, what is refused), the
mountinfo parsing, and the file effects (create, update, OOM detection, usage, removal) against a
``Layout`` over a temp dir."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.cgroups import (
    UNIFIED,
    Cgroups,
    Layout,
    Write,
    parse_mountinfo,
    plan,
    shares_to_weight,
)
from podvisor.services.runtime.faults import Fault

MI = 1024 * 1024
R = pb.LinuxContainerResources

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
COMOUNTED = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"


def test_mountinfo_hybrid_host_uses_the_v1_controllers() -> None:
    lay = parse_mountinfo(HYBRID)
    assert lay.version == 1
    assert dict(lay.mounts) == {"cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct",
                                "memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids"}


def test_mountinfo_comounted_cpu_cpuacct_share_a_folder() -> None:
    lay = parse_mountinfo(COMOUNTED)
    dirs = Cgroups(lay).dirs_for("/pod1/c1")
    assert dirs == {"cpu": "/sys/fs/cgroup/cpu,cpuacct/pod1/c1",
                    "cpuacct": "/sys/fs/cgroup/cpu,cpuacct/pod1/c1"}


def test_mountinfo_v2_only_and_none(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    lay = parse_mountinfo(f"41 31 0:38 / {tmp_path} rw - cgroup2 cgroup2 rw\n")
    assert (lay.version, dict(lay.mounts), lay.v2_controllers) == (
        2, {UNIFIED: str(tmp_path)}, frozenset({"cpu", "memory", "pids"}))
    assert parse_mountinfo("").version == 0


# --- the arithmetic ------------------------------------------------------------------------------

def test_plan_nothing_asked_is_no_cgroup() -> None:
    assert plan(R(), 1) == [] and plan(R(), 2) == []


def test_plan_v1() -> None:
    res = R(memory_limit_in_bytes=50 * MI, cpu_shares=204, cpu_quota=20_000, cpu_period=100_000,
            unified={"pids.max": "10"})
    assert plan(res, 1) == [
        Write("memory", "memory.limit_in_bytes", str(50 * MI)),
        Write("memory", "memory.memsw.limit_in_bytes", str(50 * MI), optional=True),
        Write("cpu", "cpu.shares", "204"),
        Write("cpu", "cpu.cfs_period_us", "100000"),
        Write("cpu", "cpu.cfs_quota_us", "20000"),
        Write("pids", "pids.max", "10"),
    ]


def test_plan_v1_defaults_and_bounds() -> None:
    assert plan(R(cpu_quota=-1), 1) == [Write("cpu", "cpu.cfs_period_us", "100000"),
                                        Write("cpu", "cpu.cfs_quota_us", "-1")]
    assert plan(R(cpu_shares=1), 1) == [Write("cpu", "cpu.shares", "2")]
    assert plan(R(cpu_shares=10**7), 1) == [Write("cpu", "cpu.shares", "262144")]
    swap = plan(R(memory_limit_in_bytes=MI, memory_swap_limit_in_bytes=2 * MI), 1)[1]
    assert swap.value == str(2 * MI)


def test_plan_v2() -> None:
    res = R(memory_limit_in_bytes=50 * MI, memory_swap_limit_in_bytes=50 * MI, cpu_shares=1024,
            cpu_quota=20_000, cpu_period=100_000, unified={"memory.high": "40M"})
    assert plan(res, 2) == [
        Write(UNIFIED, "memory.max", str(50 * MI)),
        Write(UNIFIED, "memory.swap.max", "0", optional=True),
        Write(UNIFIED, "cpu.weight", "39"),
        Write(UNIFIED, "cpu.max", "20000 100000"),
        Write(UNIFIED, "memory.high", "40M"),
    ]
    assert plan(R(cpu_quota=-1), 2) == [Write(UNIFIED, "cpu.max", "max 100000")]


def test_shares_to_weight_is_runcs() -> None:
    assert [shares_to_weight(s) for s in (2, 1024, 262144)] == [1, 39, 10000]


@pytest.mark.parametrize(("res", "version", "words"), [
    (R(hugepage_limits=[pb.HugepageLimit(page_size="2MB", limit=MI)]), 1, "hugepage limits"),
    (R(cpuset_cpus="0-1"), 2, "cpusets"),
    (R(unified={"memory.high": "1M"}), 1, "on cgroup v1 only pids.max"),
    (R(unified={"io.max": "8:0 rbps=1"}), 2, "'io.max' is not supported"),
    (R(unified={"pids.max": ""}), 2, "bad value"),
    (R(memory_limit_in_bytes=-5), 1, "negative"),
    (R(memory_limit_in_bytes=100), 1, "below one page"),
])
def test_plan_refuses(res: pb.LinuxContainerResources, version: int, words: str) -> None:
    with pytest.raises(Fault) as err:
        plan(res, version)
    assert words in err.value.message


# --- the effects over a temp dir ---------------------------------------------------------------

def v1_layout(root: Path, controllers: tuple[str, ...] = ("memory", "cpu", "cpuacct", "pids")
              ) -> Layout:
    mounts = {}
    for c in controllers:
        (root / c).mkdir(parents=True, exist_ok=True)
        mounts[c] = str(root / c)
    return Layout(1, mounts)


def test_create_v1_makes_the_needed_hierarchies_and_writes_limits(tmp_path: Path) -> None:
    cg = Cgroups(v1_layout(tmp_path))
    dirs = cg.create("/podvisor/podU/cid", R(memory_limit_in_bytes=50 * MI, cpu_quota=20_000))
    assert dirs == {c: str(tmp_path / c / "podvisor/podU/cid")
                    for c in ("memory", "cpu", "cpuacct")}  # no pids limit: no pids folder
    only_pids = cg.create("/podvisor/podU/c2", R(unified={"pids.max": "9"}))
    assert sorted(only_pids) == ["cpuacct", "memory", "pids"]  # memory, cpuacct: OOM, stats
    assert (tmp_path / "memory/podvisor/podU/cid/memory.limit_in_bytes").read_text() \
        == str(50 * MI)
    assert not (tmp_path / "memory/podvisor/podU/cid/memory.memsw.limit_in_bytes").exists()
    assert (tmp_path / "cpu/podvisor/podU/cid/cpu.cfs_quota_us").read_text() == "20000"
    assert (tmp_path / "cpu/podvisor/podU/cid/cpu.cfs_period_us").read_text() == "100000"
    assert cg.create("/podvisor/podU/other", R()) == {}
    assert not (tmp_path / "memory/podvisor/podU/other").exists()


def test_update_raising_the_limit_writes_memsw_first(tmp_path: Path) -> None:
    cg = Cgroups(v1_layout(tmp_path))
    dirs = cg.create("/p/c", R(memory_limit_in_bytes=50 * MI))
    memsw = Path(dirs["memory"]) / "memory.memsw.limit_in_bytes"
    memsw.write_text(str(50 * MI))  # the kernel accounts swap: the file exists
    order: list[str] = []
    real_open = os.open

    def spy(path: str, *a: int) -> int:
        order.append(os.path.basename(path))
        return real_open(path, *a)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "open", spy)
        cg.update(dirs, R(memory_limit_in_bytes=100 * MI))
    assert order == ["memory.memsw.limit_in_bytes", "memory.limit_in_bytes"]
    assert memsw.read_text() == str(100 * MI)


def test_missing_controller_is_refused_and_nothing_left(tmp_path: Path) -> None:
    cg = Cgroups(v1_layout(tmp_path, ("memory", "cpuacct")))
    with pytest.raises(Fault) as err:
        cg.create("/p/c", R(memory_limit_in_bytes=50 * MI, cpu_shares=512))
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "the cpu cgroup controller(s) are not mounted" in err.value.message
    assert not (tmp_path / "memory/p").exists()
    with pytest.raises(Fault) as err:
        Cgroups(Layout(0, why="no cgroup hierarchy is mounted on this host")).create(
            "/p/c", R(memory_limit_in_bytes=50 * MI))
    assert "no cgroup hierarchy is mounted" in err.value.message


def test_not_root_is_refused_with_the_reason(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cg = Cgroups(v1_layout(tmp_path))

    def denied(path: str, mode: int = 0o777) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(os, "mkdir", denied)
    with pytest.raises(Fault) as err:
        cg.create("/p/c", R(memory_limit_in_bytes=50 * MI))
    assert "Permission denied" in err.value.message
    assert "must run as root" in err.value.message


def test_write_failure_rolls_back_the_folders(tmp_path: Path) -> None:
    cg = Cgroups(v1_layout(tmp_path))
    (tmp_path / "pids/p/c").mkdir(parents=True)
    (tmp_path / "pids/p/c/pids.max").mkdir()  # writing it fails (EISDIR)
    with pytest.raises(Fault) as err:
        cg.create("/p/c", R(unified={"pids.max": "5"}))
    assert "pids.max" in err.value.message
    assert not (tmp_path / "memory/p").exists()


def test_v2_enables_controllers_down_the_path(tmp_path: Path) -> None:
    (tmp_path / "cgroup.subtree_control").write_text("")
    cg = Cgroups(Layout(2, {UNIFIED: str(tmp_path)}, {}, frozenset({"memory", "cpu", "pids"})))
    dirs = cg.create("/podvisor/podU/cid", R(memory_limit_in_bytes=50 * MI, cpu_shares=1024))
    assert dirs == {UNIFIED: str(tmp_path / "podvisor/podU/cid")}
    # a real cgroupfs keeps "+cpu" and "+memory" both; the temp file keeps the last write
    assert (tmp_path / "podvisor/cgroup.subtree_control").read_text() in ("+cpu", "+memory")
    assert (tmp_path / "podvisor/podU/cid/memory.max").read_text() == str(50 * MI)
    assert (tmp_path / "podvisor/podU/cid/cpu.weight").read_text() == "39"
    with pytest.raises(Fault) as err:
        Cgroups(Layout(2, {UNIFIED: str(tmp_path)}, {}, frozenset({"cpu"}))).create(
            "/x/c", R(memory_limit_in_bytes=50 * MI))
    assert "does not offer the memory controller" in err.value.message


def test_oom_and_usage_read_the_cgroup_files(tmp_path: Path) -> None:
    cg = Cgroups(v1_layout(tmp_path))
    dirs = cg.create("/p/c", R(memory_limit_in_bytes=50 * MI))
    mem = Path(dirs["memory"])
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert not cg.oom_killed(dirs)
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert cg.oom_killed(dirs)
    (Path(dirs["cpuacct"]) / "cpuacct.usage").write_text("123456789\n")
    (mem / "memory.usage_in_bytes").write_text(str(10 * MI))
    (mem / "memory.stat").write_text(f"cache 1\ntotal_rss {6 * MI}\n"
                                     f"total_inactive_file {3 * MI}\n")
    usage = cg.usage(dirs)
    assert usage is not None
    assert (usage.cpu_ns, usage.memory_bytes, usage.working_set_bytes, usage.rss_bytes) == (
        123456789, 10 * MI, 7 * MI, 6 * MI)
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    (v2 / "cpu.stat").write_text("usage_usec 2000\nuser_usec 1000\n")
    (v2 / "memory.current").write_text("4096\n")
    (v2 / "memory.stat").write_text("anon 1024\ninactive_file 5000\n")
    v2dirs = {UNIFIED: str(v2)}
    assert cg.oom_killed(v2dirs)
    assert cg.usage(v2dirs) == type(usage)(2_000_000, 4096, 0, 1024)


def test_remove_rmdirs_and_reports_what_stays(tmp_path: Path) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    cg = Cgroups(v1_layout(tmp_path), sleep=sleep, monotonic=lambda: now[0])
    dirs = cg.create("/p/c", R(memory_limit_in_bytes=50 * MI))
    # on a temp dir the memory folder holds the limit file, so its rmdir fails ENOTEMPTY (on
    # cgroupfs the files go with the folder): reported, not retried; the others are gone
    failed = cg.remove(dirs)
    assert len(failed) == 1 and failed[0].startswith(dirs["memory"])
    assert "not empty" in failed[0].lower()
    for f in Path(dirs["memory"]).iterdir():
        f.unlink()
    assert cg.remove(dirs) == []
    assert not any(Path(d).exists() for d in dirs.values())
    assert cg.remove(dirs) == []  # idempotent


def test_join_files_v1_tasks_v2_procs() -> None:
    v1 = {"memory": "/cg/memory/p/c", "cpu": "/cg/cpu,cpuacct/p/c",
          "cpuacct": "/cg/cpu,cpuacct/p/c"}
    assert Cgroups.join_files(v1) == ["/cg/cpu,cpuacct/p/c/tasks", "/cg/memory/p/c/tasks"]
    assert Cgroups.join_files({UNIFIED: "/cg/p/c"}) == ["/cg/p/c/cgroup.procs"]
