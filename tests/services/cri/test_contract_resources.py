"""CRI contract: container resources are enforced through cgroups (issue 17).

Same tests on the embedded runtime and containerd (cgroupfs driver, this machine's cgroup v1):
a 50 MiB container that touches 200 MB is OOM-killed (exit 137, reason OOMKilled); a CPU-bound
container limited to 200m uses about a fifth of a core, measured by the runtime's
ContainerStats from its cgroup; UpdateContainerResources changes the limit in the container's
cgroup (``<cgroup_parent>/<container id>``). Embedded-only, with the reason: the pids limit
(CRI has no pids field; runc refuses ``unified`` on cgroup v1), refusals at CreateContainer,
and OOMKilled learnt across a kill -9 of the runtime. Bounds are generous: the machine is shared.
Commands are ones busybox has too (dd, sh).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from tests.services.conftest import (
    EmbeddedRuntime,
    RuntimeUnderTest,
    cleanup,
    poll,
    runs_processes,
    short_tmp,
)
from tests.support.containerd import remove_pod_cgroup

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")
MI = 1024 * 1024
ALLOC_200MB = ["dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"]
SPIN = ["sh", "-c", "while :; do :; done"]


@pytest.fixture
def rt(cri_runtime: Any) -> Iterator[Any]:
    """The runtime under test with every sandbox under a per-test pod cgroup parent (the
    embedded runtime's are removed here, containerd's by its fixture)."""
    runs_processes(cri_runtime, "cgroups")
    if not MEMORY_ROOT.is_dir():
        pytest.skip("no cgroup v1 memory hierarchy on this host")
    mine = not cri_runtime.cgroup_parent
    if mine:
        cri_runtime.cgroup_parent = f"/podvisor-test-{secrets.token_hex(4)}"
    yield cri_runtime
    if mine:  # the sandboxes go first (the runtime fixture's cleanup comes after this one)
        client = cri_runtime.client
        for sb in client.list_pod_sandbox(pb.PodSandboxFilter(
                label_selector={"podvisor.test/run": cri_runtime.run_label})):
            client.stop_pod_sandbox(sb.id)
            client.remove_pod_sandbox(sb.id)
        for cgroup in cri_runtime.pod_cgroups:
            remove_pod_cgroup(cgroup)
        remove_pod_cgroup(cri_runtime.cgroup_parent)


def create(rt: Any, sandbox: tuple[str, pb.PodSandboxConfig], name: str, cmd: list[str],
           res: pb.LinuxContainerResources) -> str:
    sid, sconfig = sandbox
    config = rt.container_config(name, cmd)
    config.linux.resources.CopyFrom(res)
    return str(rt.client.create_container(sid, config, sconfig))


def memory_dir(rt: Any, sconfig: pb.PodSandboxConfig, cid: str) -> Path:
    return MEMORY_ROOT / sconfig.linux.cgroup_parent.strip("/") / cid


def test_memory_limit_oom_kill_is_reported(rt: Any) -> None:
    sandbox = rt.run("oom")
    res = pb.LinuxContainerResources(memory_limit_in_bytes=50 * MI)
    cid = create(rt, sandbox, "hog", ALLOC_200MB, res)
    rt.client.start_container(cid)
    status = rt.wait_exited(cid, 60.0)
    assert (status.exit_code, status.reason) == (137, "OOMKilled"), status


def test_within_the_limit_is_not_oom(rt: Any) -> None:
    res = pb.LinuxContainerResources(memory_limit_in_bytes=300 * MI)
    sandbox = rt.run("fits")
    cid = create(rt, sandbox, "fits", ALLOC_200MB, res)
    rt.client.start_container(cid)
    status = rt.wait_exited(cid, 60.0)
    assert (status.exit_code, status.reason) == (0, "Completed")


def test_cpu_quota_limits_usage(rt: Any, poll: Any) -> None:
    res = pb.LinuxContainerResources(cpu_period=100_000, cpu_quota=20_000, cpu_shares=204)
    sandbox = rt.run("cpu")
    cid = create(rt, sandbox, "spin", SPIN, res)
    rt.client.start_container(cid)

    def cpu_ns() -> int:
        stats = rt.client.container_stats(cid)
        return int(stats.cpu.usage_core_nano_seconds.value)

    poll(lambda: cpu_ns() > 0, 30.0, "first CPU usage from the container's cgroup")
    start_cpu, start = cpu_ns(), time.monotonic()
    # measured until the container used 0.6 s of CPU: about 3 s at 20 % of a core
    poll(lambda: cpu_ns() - start_cpu >= 600_000_000, 30.0, "0.6 s of CPU")
    share = (cpu_ns() - start_cpu) / 1e9 / (time.monotonic() - start)
    print(f"{rt.name}: the 200m container used {share:.0%} of a core")
    assert 0.10 <= share <= 0.35, share
    memory = rt.client.container_stats(cid).memory
    assert 0 < memory.working_set_bytes.value <= memory.usage_bytes.value


def test_update_container_resources_changes_the_limit(rt: Any, poll: Any) -> None:
    sandbox = rt.run("upd")
    res = pb.LinuxContainerResources(memory_limit_in_bytes=100 * MI)
    cid = create(rt, sandbox, "sleeper", ["sleep", "1000"], res)
    rt.client.start_container(cid)
    limit = memory_dir(rt, sandbox[1], cid) / "memory.limit_in_bytes"
    assert limit.read_text().strip() == str(100 * MI)
    rt.client.update_container_resources(
        cid, pb.LinuxContainerResources(memory_limit_in_bytes=200 * MI))
    assert limit.read_text().strip() == str(200 * MI)
    rt.client.update_container_resources(
        cid, pb.LinuxContainerResources(memory_limit_in_bytes=64 * MI))
    assert limit.read_text().strip() == str(64 * MI)


def test_container_cgroup_is_removed_with_the_container(rt: Any) -> None:
    sandbox = rt.run("rm")
    res = pb.LinuxContainerResources(memory_limit_in_bytes=100 * MI)
    cid = create(rt, sandbox, "gone", ["sleep", "1000"], res)
    rt.client.start_container(cid)
    folder = memory_dir(rt, sandbox[1], cid)
    assert folder.is_dir()
    procs = (folder / "cgroup.procs").read_text().split()
    assert procs, "the container's process is in its cgroup"
    rt.client.stop_container(cid, 0)
    rt.client.remove_container(cid)
    assert not folder.exists()


# --- embedded only ---------------------------------------------------------------------------

def only_embedded(rt: Any, why: str) -> None:
    if rt.name != "embedded":
        pytest.skip(f"{rt.name}: {why}")


def test_pids_limit(rt: Any, poll: Any) -> None:
    only_embedded(rt, "CRI has no pids field and runc refuses `unified` on cgroup v1 hosts")
    sandbox = rt.run("pids")
    res = pb.LinuxContainerResources(unified={"pids.max": "4"})
    cmd = ["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 1000 & done; echo forked; wait"]
    cid = create(rt, sandbox, "forker", cmd, res)
    rt.client.start_container(cid)
    folder = Path("/sys/fs/cgroup/pids") / sandbox[1].linux.cgroup_parent.strip("/") / cid
    assert (folder / "pids.max").read_text().strip() == "4"
    status = rt.wait_exited(cid, 30.0)  # the shell gives up at the fork the limit refuses
    log = (Path(sandbox[1].log_directory) / "forker/0.log").read_text()
    assert status.exit_code != 0 and "forked" not in log
    assert "fork" in log.lower(), log  # "sh: 0: Cannot fork" (dash), "can't fork" (busybox)


@pytest.mark.parametrize(("res", "words"), [
    (pb.LinuxContainerResources(hugepage_limits=[pb.HugepageLimit(page_size="2MB",
                                                                  limit=2 * MI)]),
     "hugepage limits (2MB) are not supported"),
    (pb.LinuxContainerResources(unified={"memory.high": "10M"}),
     "unified cgroup setting 'memory.high' is not supported"),
    (pb.LinuxContainerResources(cpuset_cpus="0"), "cpusets"),
])
def test_refused_at_create(rt: Any, res: pb.LinuxContainerResources, words: str) -> None:
    only_embedded(rt, "runc decides at its own stage what it refuses")
    sandbox = rt.run("refused")
    with pytest.raises(CriError) as err:
        create(rt, sandbox, "no", ["true"], res)
    assert words in str(err.value)
    assert rt.client.list_containers(pb.ContainerFilter(pod_sandbox_id=sandbox[0])) == []


def test_oom_learnt_after_a_runtime_restart(rt: Any, poll: Any) -> None:
    only_embedded(rt, "kills the runtime process")
    embedded = rt.embedded
    sandbox = rt.run("oomrestart")
    go = rt.tmp / "go"
    cmd = ["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.05; done; exec ' + " ".join(ALLOC_200MB)]
    cid = create(rt, sandbox, "late", cmd, pb.LinuxContainerResources(
        memory_limit_in_bytes=50 * MI))
    rt.client.start_container(cid)
    embedded.kill9()
    go.touch()
    exit_file = embedded.root / "containers" / f"{cid}.exit.json"
    poll(exit_file.exists, 60.0, "the monitor to record the exit")
    embedded.start()
    status = rt.client.container_status(cid)
    assert (status.exit_code, status.reason) == (137, "OOMKilled")


class _UnprivilegedRuntime(EmbeddedRuntime):
    """The standalone runtime as uid/gid 65534 (nobody) with CAP_DAC_READ_SEARCH only (to reach
    this checkout's Python under /root): a runtime without write access to the cgroup tree."""

    def start(self) -> None:
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(
                ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                 "--inh-caps", "+dac_read_search", "--ambient-caps", "+dac_read_search",
                 sys.executable, "-m", "podvisor.services.runtime", "--root", str(self.root),
                 "--socket", str(self.socket)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=self.env)
        poll(self._up, 30.0, "the unprivileged runtime to answer Version")


def test_without_cgroup_access_limits_are_refused_not_ignored(tmp_path: Path) -> None:
    """podvisor not run as root: a container with resources fails CreateContainer with the
    reason (never runs unlimited); one without resources still runs."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (to drop to nobody) and util-linux setpriv")
    base = short_tmp("pvnr")
    os.chown(base, 65534, 65534)
    rt = _UnprivilegedRuntime(base, {"HOME": str(base), "PODVISOR_CACHE_DIR": str(base / "c")})
    try:
        rt.start()
        under = RuntimeUnderTest("embedded", rt.client, "host", base / "t")
        sandbox = under.run("nonroot")
        for d in (base / "t", *(p for p in (base / "t").rglob("*") if p.is_dir())):
            os.chown(d, 65534, 65534)  # the sandbox's log directory, made by this test as root
        with pytest.raises(CriError) as err:
            create(under, sandbox, "limited", ["true"],
                   pb.LinuxContainerResources(memory_limit_in_bytes=50 * MI))
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "Permission denied (the embedded runtime must run as root" in err.value.message
        cid = create(under, sandbox, "free", ["true"], pb.LinuxContainerResources())
        rt.client.start_container(cid)
        assert under.wait_exited(cid).exit_code == 0
    finally:
        try:
            if rt.proc is not None:
                cleanup(rt.client)
        finally:
            rt.stop()
            rt.client.close()
            shutil.rmtree(base, ignore_errors=True)
