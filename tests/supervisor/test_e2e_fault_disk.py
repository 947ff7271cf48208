"""`disk` faults (issue 28): a pod's emptyDir full, or read-only, inside its container (a small
filesystem mounted over the volume in the container's mount namespace), with the volume's
files still there; ended, writes work again and nothing was lost; the host path and the rest
of the node never saw it."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from podvisor.testing import Node, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")

POD = """apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 2
  volumes:
  - {name: data, emptyDir: {}}
  containers:
  - name: app
    image: host
    command: ["sleep", "100000"]
    volumeMounts:
    - {name: data, mountPath: /pvdata-faults}
"""


def _sh(node: Node, script: str) -> subprocess.CompletedProcess[str]:
    """``podvisorctl exec web -- sh -c SCRIPT``: in the container's mount namespace."""
    return node.agent.ctl("exec", "web", "--", "sh", "-c", script)


def test_an_emptydir_full_then_read_only_then_whole(podvisor_node: Node) -> None:
    node = podvisor_node
    node.apply(POD)
    node.wait_pod("web", "Running")
    [pid] = node.container_pids("web")
    assert _sh(node, "echo before > /pvdata-faults/old").returncode == 0
    [host] = list(node.paths.pods_dir.glob("*/volumes/kubernetes.io~empty-dir/data"))
    with node.fault("disk", "pod/web/data", action="full") as fault:
        assert fault.spec.describe() == "disk pod/web/data: full"
        full = _sh(node, "head -c 8192 /dev/zero > /pvdata-faults/big")
        assert full.returncode != 0 and "No space left" in full.stderr + full.stdout, full
        assert _sh(node, "cat /pvdata-faults/old").stdout == "before\n"  # its files are there
        (host / "host-side").write_text("ok\n")  # the host path is not full
    assert _sh(node, "rm -f /pvdata-faults/big && echo x > /pvdata-faults/new").returncode == 0
    with node.fault("disk", "pod/web/data", action="readonly"):
        ro = _sh(node, "echo y > /pvdata-faults/other")
        assert ro.returncode != 0 and "Read-only file system" in ro.stderr + ro.stdout, ro
    done = _sh(node, "echo z > /pvdata-faults/after && cat /pvdata-faults/old "
                     "/pvdata-faults/new /pvdata-faults/host-side")
    assert done.returncode == 0 and done.stdout == "before\nx\nok\n", done
    assert sorted(p.name for p in host.iterdir()) == ["after", "host-side", "new", "old"]
    assert node.container_pids("web") == [pid] and node.restarts("web") == 0
    mounts = Path(f"/proc/{pid}/mountinfo").read_text()
    assert "podvisor-fault" not in mounts  # unmounted
    bad = node.agent.ctl("fault", "inject", "disk", "pod/web/nosuch")
    assert bad.returncode == 1 and "no emptyDir 'nosuch' mounted" in bad.stderr
    node.check()


SLEEPER = """apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {name: app, image: host, command: ["sleep", "100000"]}
"""


def _persisted(node: Node, restarts: int) -> bool:
    """The status store's files under rootDir/state hold web's restartCount ``restarts``."""
    text = "".join(p.read_text(errors="replace")
                   for p in (node.paths.state_dir / "statuses").glob("*") if p.is_file())
    return f'"restartCount":{restarts}' in text


def _save_failures(node: Node, says: str) -> int:
    log = node.paths.logs_dir / "status.log"
    return sum(1 for line in log.read_text(errors="replace").splitlines()
               if "status.save_failed" in line and says in line) if log.exists() else 0


def test_rootdir_read_only_then_full_then_whole(podvisor_node: Node) -> None:
    """A disk fault on rootDir: the node's state cannot be written (EROFS, then ENOSPC), the
    node runs on (a killed container is restarted, /pods says so, no subsystem restarts), its
    state reads as before, and once the fault ends what it could not save is saved."""
    node = podvisor_node
    node.apply(SLEEPER)
    node.wait_pod("web", "Running")
    state = node.paths.state_dir
    before = {n: r["restarts"] for n, r in node.processes().items()}
    files = sorted(p.name for p in state.iterdir())
    with node.fault("disk", "rootDir", action="readonly") as fault:
        assert fault.spec.describe() == "disk rootDir: readonly"
        with pytest.raises(OSError) as err:
            (state / "written-by-the-test").write_text("x")
        assert err.value.errno == errno.EROFS
        node.kill_container("web")
        node.wait_pod("web", "Running", restarts=1)  # the node runs on
        wait_until(lambda: _save_failures(node, "Read-only file system"), 30, 0.1,
                   "the status store's save to fail")
        assert not _persisted(node, 1)  # /pods says it, the disk does not
        # what was there reads (a subsystem may have written one more file before the fault
        # was in force: imagegc's first imagegc.prom in a loaded run; none vanishes)
        assert set(files) <= {p.name for p in state.iterdir()}
    wait_until(lambda: _persisted(node, 1), 60, 0.1, "the restart saved once writable")
    with node.fault("disk", "rootDir", action="full"):
        with pytest.raises(OSError) as err:
            (state / "written-by-the-test").write_bytes(b"x" * 65536)
        assert err.value.errno == errno.ENOSPC
        assert _persisted(node, 1)  # the state reads as before
        node.kill_container("web")
        node.wait_pod("web", "Running", restarts=2)
        wait_until(lambda: _save_failures(node, "No space left"), 30, 0.1,
                   "the status store's save to fail")
        assert not _persisted(node, 2)
    wait_until(lambda: _persisted(node, 2), 60, 0.1, "the restart saved once there is room")
    assert "podvisor-fault" not in Path("/proc/self/mountinfo").read_text()  # all unmounted
    assert not list(node.paths.faults_dir.glob("disk-*"))
    # what the fault let through came back: the test's file, created but empty (a full disk
    # has inodes left; the read-only one let nothing through)
    assert (state / "written-by-the-test").read_bytes() == b""
    assert {n: r["restarts"] for n, r in node.processes().items()} == before
    node.check()
