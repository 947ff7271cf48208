"""End to end: kill -9 of the file source, then of the embedded runtime, while 3 pods run; and
kill -9 of the runtime while 40 pods start at once.

After each kill: no container restarted (same container IDs and restart counts in /pods, same
sandbox IDs and container pids), no pod started twice, /pods correct again within a generous
deadline; and a manifest written right after the source restarts is still picked up (the file
check frequency is the default 20 s, so only the inotify watch can pick it up in time)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import psutil
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from podvisor.services.syncloop import labels as L
from tests.support.lifecycle import (
    agent_config,
    all_running,
    cri_for,
    free_port,
    get_pods,
    kill_pids,
    marked,
    pid_alive,
    pod_yaml,
    read_pid,
    summary,
)

NAMES = {"p1", "p2", "p3"}


def sandbox_ids(cri: Any) -> list[str] | None:
    try:
        return sorted(s.id for s in cri.list_pod_sandbox())
    except CriError:
        return None


def kill9(handle: Any, name: str, wait_for: Any) -> None:
    old = handle.state(name)
    handle.call("kill", name=name, signal="KILL")
    wait_for(lambda: handle.state(name)["state"] == "RUNNING"
             and handle.state(name)["pid"] != old["pid"], 30.0)


@pytest.mark.timeout(170)
def test_kill9_source_and_runtime_keep_pods(agent: Any, wait_for: Any) -> None:
    manifests = Path(tempfile.mkdtemp(prefix="pvk9", dir="/tmp"))
    marks = Path(tempfile.mkdtemp(prefix="pvk9m", dir="/tmp"))
    pids: list[int] = []
    try:
        for name in sorted(NAMES):
            (manifests / f"{name}.yaml").write_text(pod_yaml(name, marked(marks, name)), "utf-8")
        port = free_port()
        handle = agent(config=agent_config(manifests, port, fileCheckFrequency="20s",
                                           stopPodsOnExit=True))
        first = wait_for(lambda: (b := get_pods(port)) and all_running(b, NAMES) and b, 90.0)
        before = summary(first)
        base = [wait_for(lambda n=n: read_pid(marks, n), 10.0) for n in sorted(NAMES)]
        pids.extend(base)
        cri = cri_for(handle)
        try:
            sandboxes = sorted(s.id for s in cri.list_pod_sandbox())
            assert len(sandboxes) == 3

            def unchanged(after_kill: str) -> None:
                again = wait_for(lambda: (b := get_pods(port)) and all_running(b, NAMES) and b,
                                 60.0, 0.1, f"/pods all Running after kill -9 {after_kill}")
                assert summary(again) == before, f"after kill -9 {after_kill}"
                # the restarted runtime may not serve yet
                assert wait_for(lambda: sandbox_ids(cri), 30.0, 0.1) == sandboxes, after_kill
                assert all(pid_alive(p) for p in base), after_kill
                assert [read_pid(marks, n) for n in sorted(NAMES)] == base, after_kill

            kill9(handle, "source-file", wait_for)
            # right after the restart: a new manifest must still be seen
            (manifests / "p4.yaml").write_text(pod_yaml("p4", marked(marks, "p4")), "utf-8")
            wait_for(lambda: all_running(get_pods(port), NAMES | {"p4"}), 15.0, 0.1,
                     "the pod written right after the source restart")
            pids.append(wait_for(lambda: read_pid(marks, "p4"), 10.0))
            (manifests / "p4.yaml").unlink()
            wait_for(lambda: all_running(get_pods(port), NAMES), 30.0, 0.1, "p4 removed")
            wait_for(lambda: not pid_alive(pids[-1]), 30.0, 0.1, "p4's container gone")
            unchanged("source-file")

            kill9(handle, "runtime", wait_for)
            unchanged("runtime")
            # the runtime still works for the sync loop: a new pod runs, then goes away
            (manifests / "p5.yaml").write_text(pod_yaml("p5", marked(marks, "p5")), "utf-8")
            wait_for(lambda: all_running(get_pods(port), NAMES | {"p5"}), 30.0, 0.1, "p5 runs")
            pids.append(wait_for(lambda: read_pid(marks, "p5"), 10.0))
            (manifests / "p5.yaml").unlink()
            wait_for(lambda: not pid_alive(pids[-1]), 30.0, 0.1, "p5's container gone")
            unchanged("runtime (after p5)")
            restarts = sorted(int(c.annotations[L.RESTART_COUNT])
                              for c in cri.list_containers() if c.state == pb.CONTAINER_RUNNING)
            assert restarts == [0, 0, 0], restarts
        finally:
            cri.close()
        assert handle.stop() == 0
        wait_for(lambda: not any(pid_alive(p) for p in pids), 30.0, 0.1, "pods stopped on exit")
    finally:
        kill_pids([p for p in pids if pid_alive(p)])
        shutil.rmtree(manifests, ignore_errors=True)
        shutil.rmtree(marks, ignore_errors=True)


def _sleepers(tags: set[str]) -> dict[str, list[int]]:
    """tag -> pids of the processes running `sleep <tag>` (the burst's containers)."""
    out: dict[str, list[int]] = {}
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if len(cmd) == 2 and cmd[0] == "sleep" and cmd[1] in tags and pid_alive(proc.pid):
            out.setdefault(cmd[1], []).append(proc.pid)
    return out


@pytest.mark.timeout(170)
def test_kill9_runtime_during_a_burst(agent: Any, wait_for: Any) -> None:
    """The runtime is killed while it is creating and starting 40 pods (once a few containers
    exist; the rest are in flight). After recovery every pod runs exactly one container in one
    ready sandbox, and each pod's command runs exactly once: no container started twice, no
    orphan left by a create or start whose answer was lost, no restart counted (a container
    created and never started is started as it is). Once the manifests are removed no process
    of theirs is left. (The step-by-step form, deterministic: tests/services/
    runtime/test_exactly_once.py and tests/services/syncloop/test_e2e_exactly_once.py.)"""
    manifests = Path(tempfile.mkdtemp(prefix="pvk9b", dir="/tmp"))
    staging = Path(tempfile.mkdtemp(prefix="pvk9s", dir="/tmp"))
    base = 50000 + os.getpid() % 10000 * 10  # `sleep <tag>`: unique to this run
    tags = {f"b{i}": str(base + i * 100000) for i in range(40)}
    pids: list[int] = []
    try:
        for name, tag in tags.items():
            (staging / f"{name}.yaml").write_text(pod_yaml(name, f"exec sleep {tag}"), "utf-8")
        port = free_port()
        handle = agent(config=agent_config(manifests, port, stopPodsOnExit=True))
        wait_for(lambda: get_pods(port) is not None, 60.0, message="/pods answering")
        cri = cri_for(handle)
        try:
            for name in tags:
                (staging / f"{name}.yaml").rename(manifests / f"{name}.yaml")

            def some_created() -> bool:
                try:
                    return len(cri.list_containers()) >= 5
                except CriError:
                    return False
            wait_for(some_created, 60.0, 0.005, "the first containers")
            kill9(handle, "runtime", wait_for)
            wait_for(lambda: all_running(get_pods(port), set(tags)), 120.0, 0.1,
                     "all 40 pods Running after the runtime's kill -9")

            running = [c for c in cri.list_containers() if c.state == pb.CONTAINER_RUNNING]
            per_pod = sorted(c.labels[L.POD_NAME].rsplit("-", 1)[0] for c in running)
            assert per_pod == sorted(tags), "one running container per pod"
            ready = sorted(s.metadata.name.rsplit("-", 1)[0] for s in cri.list_pod_sandbox()
                           if s.state == pb.SANDBOX_READY)
            assert ready == sorted(tags), "one ready sandbox per pod"
            procs = _sleepers(set(tags.values()))
            pids.extend(p for found in procs.values() for p in found)
            assert {t: len(procs.get(t, [])) for t in tags.values()} == \
                {t: 1 for t in tags.values()}, "each pod's command runs exactly once"
            restarts = [int(c.annotations[L.RESTART_COUNT]) for c in running]
            assert restarts == [0] * len(tags), "no restart counted for the runtime's crash"
            for name in tags:
                (manifests / f"{name}.yaml").unlink()
            wait_for(lambda: not _sleepers(set(tags.values())), 60.0, 0.1,
                     "no process left once the manifests are removed")
        finally:
            cri.close()
        assert handle.stop() == 0
    finally:
        kill_pids([p for p in pids if pid_alive(p)])
        shutil.rmtree(manifests, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
