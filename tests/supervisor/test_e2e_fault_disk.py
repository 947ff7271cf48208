"""`disk` faults (issue 28): a pod's emptyDir full, or read-only, inside its container (a small
filesystem mounted over the volume in the container's mount namespace), with the volume's
files still there; ended, writes work again and nothing was lost; the host path and the rest
of the node never saw it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from podvisor.testing import Node

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
