"""bench/outside.py: whole-tree CPU (reaped children included) and PSS, read from a /proc copy
written by the test; windows timed by the one FakeClock (its sleep advances it and moves the
fake processes). No real process is measured: the figures' meaning, not their values, is tested.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from podvisor.ipc.clock import FakeClock

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import outside

TICK = outside.CLK_TCK


def write_proc(root: Path, pid: int, ppid: int, comm: str, ticks: tuple[int, int, int, int],
               start: int = 1, state: str = "S", pss_kb: int = 0,
               argv: tuple[str, ...] = ()) -> None:
    """A /proc/PID with stat (fields as the kernel writes them), smaps_rollup and cmdline."""
    d = root / str(pid)
    d.mkdir(exist_ok=True)
    utime, stime, cutime, cstime = ticks
    fields = [state, str(ppid), "1", "1", "0", "-1", "4194304", "0", "0", "0", "0",
              str(utime), str(stime), str(cutime), str(cstime), "20", "0", "1", "0", str(start),
              "1000", "100"]
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)} 0 0 0\n")
    (d / "smaps_rollup").write_text(f"00400000-7ffff [rollup]\nRss: {pss_kb * 2} kB\n"
                                    f"Pss: {pss_kb} kB\nPss_Anon: 1 kB\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def remove_proc(root: Path, pid: int) -> None:
    for f in (root / str(pid)).iterdir():
        f.unlink()
    (root / str(pid)).rmdir()


def test_parse_stat_takes_comm_up_to_the_last_parenthesis() -> None:
    stat = outside.parse_stat("42 (pv (sync) loop) S 7 1 1 0 -1 0 0 0 0 0 "
                              "3 4 5 6 20 0 1 0 999 1000 100 0 0\n")
    assert (stat.pid, stat.ppid, stat.comm, stat.state) == (42, 7, "pv (sync) loop", "S")
    assert stat.ticks == 3 + 4 + 5 + 6  # utime + stime + cutime + cstime
    assert stat.key == (42, 999)


def test_tree_follows_children_and_prunes_subtrees(tmp_path: Path) -> None:
    for pid, ppid in ((10, 1), (11, 10), (12, 11), (13, 10), (14, 13), (20, 1)):
        write_proc(tmp_path, pid, ppid, f"p{pid}", (0, 0, 0, 0))
    stats = outside.Proc(tmp_path).stats()
    assert outside.tree(stats, [10]) == {10, 11, 12, 13, 14}
    assert outside.tree(stats, [10], prune={13}) == {10, 11, 12}
    assert outside.tree(stats, [10, 20, 99]) == {10, 11, 12, 13, 14, 20}  # 99: not alive


def _measure(tmp_path: Path, steps: list[Callable[[], None]], groups: list[outside.Group],
             seconds: float = 10.0) -> dict[str, outside.Figures]:
    clock = FakeClock()
    todo = list(steps)

    def sleep(s: float) -> None:  # a window passes: the fake processes move
        clock.advance(s)
        todo.pop(0)()

    return outside.measure(groups, len(steps), seconds, outside.Proc(tmp_path), clock, sleep)


def test_a_child_reaped_inside_the_window_counts_through_its_parents_cutime(
        tmp_path: Path) -> None:
    write_proc(tmp_path, 10, 1, "agent", (100, 0, 0, 0), pss_kb=2048)
    write_proc(tmp_path, 11, 10, "probe", (30, 20, 0, 0), start=5, pss_kb=1024)
    agent = outside.Group("agent", outside.tree_selector(lambda: [10]))

    def probe_exits_and_is_reaped() -> None:
        # the probe spent 10 more ticks, then exited: its 60 ticks land in the agent's cutime
        remove_proc(tmp_path, 11)
        write_proc(tmp_path, 10, 1, "agent", (100 + TICK, 0, 60, 0), pss_kb=2048)

    def a_child_as_zombie() -> None:
        write_proc(tmp_path, 12, 10, "sh", (2 * TICK, 0, 0, 0), start=9, state="Z")

    [fig] = _measure(tmp_path, [probe_exits_and_is_reaped, a_child_as_zombie], [agent]).values()
    # window 1: agent +TICK ticks, probe 50 -> 60 (reaped): (TICK + 10) ticks in 10 s
    assert fig.cpu_pct[0] == pytest.approx(100.0 * (TICK + 10) / TICK / 10.0)
    # window 2: a zombie's ticks still count (its reaper takes them when it waits)
    assert fig.cpu_pct[1] == pytest.approx(100.0 * 2 / 10.0)
    assert fig.pss_mb == [2.0, 2.0]
    assert fig.procs == [1, 2]
    assert fig.gone == 0


def test_a_member_exiting_with_its_reaper_outside_the_group_is_counted_as_gone(
        tmp_path: Path) -> None:
    write_proc(tmp_path, 30, 1, "containerd", (0, 0, 0, 0))
    write_proc(tmp_path, 31, 1, "containerd-shim", (40, 0, 0, 0), start=3)
    runtime = outside.Group("runtime", lambda stats: {p for p in (30, 31) if p in stats})
    [fig] = _measure(tmp_path, [lambda: remove_proc(tmp_path, 31)], [runtime]).values()
    assert fig.gone == 1
    assert fig.procs == [1]


def test_groups_share_the_windows_and_the_ratio_is_of_medians(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, 1, "agent", (0, 0, 0, 0), pss_kb=4096)
    write_proc(tmp_path, 20, 1, "kubelet", (0, 0, 0, 0), pss_kb=8192)
    spent = {"agent": 0, "kubelet": 0}

    def window(agent: int, kubelet: int) -> Callable[[], None]:
        def step() -> None:
            spent["agent"] += agent
            spent["kubelet"] += kubelet
            write_proc(tmp_path, 10, 1, "agent", (spent["agent"], 0, 0, 0), pss_kb=4096)
            write_proc(tmp_path, 20, 1, "kubelet", (spent["kubelet"], 0, 0, 0), pss_kb=8192)
        return step

    figures = _measure(
        tmp_path, [window(TICK, 2 * TICK), window(3 * TICK, 4 * TICK), window(TICK, 4 * TICK)],
        [outside.Group("agent", outside.tree_selector(lambda: [10])),
         outside.Group("kubelet", outside.tree_selector(lambda: [20]))], seconds=100.0)
    agent, kubelet = figures["agent"], figures["kubelet"]
    assert agent.cpu_pct == pytest.approx([1.0, 3.0, 1.0])
    assert kubelet.cpu_pct == pytest.approx([2.0, 4.0, 4.0])
    assert outside.ratio(agent.cpu_pct, kubelet.cpu_pct) == pytest.approx(0.25)
    assert outside.ratio(agent.pss_mb, kubelet.pss_mb) == pytest.approx(0.5)
    assert outside.spread(agent.cpu_pct) == outside.Spread(1.0, 1.0, 3.0, 3)
    assert agent.by_process == [("agent", pytest.approx(5 / 3), 4.0)]
    lines = outside.report(figures, peer="kubelet")
    assert "vs kubelet: CPU 0.25x, PSS 0.50x" in lines[0]


def test_no_ratio_without_a_peer_figure() -> None:
    assert outside.ratio([1.0], []) is None
    assert outside.ratio([1.0], [0.0]) is None  # an idle peer below one tick: no ratio
    assert outside.spread([]) is None


def test_python_processes_are_named_by_module_or_script(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, 1, "python3", (0, 0, 0, 0),
               argv=("/v/bin/python", "-m", "podvisor.services.runtime", "--root", "/r"))
    write_proc(tmp_path, 11, 1, "python3", (0, 0, 0, 0), argv=("/v/bin/python", "/v/bin/podvisor",
                                                                "run"))
    write_proc(tmp_path, 12, 1, "pv-syncloop", (0, 0, 0, 0))
    proc = outside.Proc(tmp_path)
    stats = proc.stats()
    assert outside.name_of(proc, stats[10]) == "podvisor.services.runtime"
    assert outside.name_of(proc, stats[11]) == "podvisor"
    assert outside.name_of(proc, stats[12]) == "pv-syncloop"


def test_a_containerd_instance_is_its_daemon_and_the_shims_of_its_socket(tmp_path: Path) -> None:
    write_proc(tmp_path, 30, 1, "containerd", (0, 0, 0, 0),
               argv=("containerd", "--config", "/a/config.toml"))
    write_proc(tmp_path, 31, 1, "containerd-shim", (0, 0, 0, 0),
               argv=("containerd-shim-runc-v2", "-namespace", "k8s.io", "-address",
                     "/a/run/containerd.sock"))
    write_proc(tmp_path, 32, 31, "pause", (0, 0, 0, 0))  # a pod's own: the workload
    write_proc(tmp_path, 41, 1, "containerd-shim", (0, 0, 0, 0),
               argv=("containerd-shim-runc-v2", "-address", "/other/containerd.sock"))
    proc = outside.Proc(tmp_path)
    select = outside.containerd_selector("/a/run/containerd.sock", lambda: 30, proc)
    assert select(proc.stats()) == {30, 31}


def test_threads_are_summed_by_name_with_their_own_ticks_and_pss_is_split(
        tmp_path: Path) -> None:
    write_proc(tmp_path, 10, 1, "pv-pleg", (0, 0, 0, 0), pss_kb=3000)
    for tid, comm, ticks in ((10, "pv-pleg", (5, 1, 70, 70)),
                             (11, "grpc_global_tim", (2, 2, 70, 70)),
                             (12, "grpc_global_tim", (1, 0, 70, 70))):
        (tmp_path / "10" / "task" / str(tid)).mkdir(parents=True)
        write_proc(tmp_path / "10" / "task", tid, 1, comm, ticks)
    proc = outside.Proc(tmp_path)
    # cutime/cstime of a thread are its process's: not a thread's own
    assert proc.threads(10) == {"pv-pleg": (1, 6), "grpc_global_tim": (2, 5)}
    assert proc.pss_parts(10) == {"Pss": 3000, "Pss_Anon": 1}
