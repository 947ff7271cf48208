"""bench/podman_peer.py (issue 16): podman's private setup stays inside its temp root and within
this machine's limits, and one tiny run (1 pod, 1 kill, no idle window) leaves nothing behind:
no process, mount, file or cgroup of its pods. No timing is asserted: figures live in bench/."""

from __future__ import annotations

import importlib.util
import json
import resource
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _peer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("podman_peer", ROOT / "bench" / "podman_peer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_is_private_and_within_the_hard_limits(tmp_path: Path) -> None:
    peer = _peer()
    conf = peer.containers_conf(tmp_path)
    assert f'infra_image = "{peer.PAUSE_IMAGE}"' in conf
    [ulimits] = [line for line in conf.splitlines() if line.startswith("default_ulimits")]
    values = dict(item.split("=") for item in json.loads(ulimits.split("=", 1)[1].strip()))
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = (int(v) for v in values[name].split(":"))
        limit = resource.getrlimit(which)[1]
        assert soft == hard and (limit == resource.RLIM_INFINITY or hard <= limit)
    paths = [line.split("=", 1)[1].strip().strip('"') for line in conf.splitlines()
             if line.split("=")[0].strip().endswith(("_path", "_dir"))]
    assert len(paths) == 5 and all(p.startswith(f"{tmp_path}/") for p in paths)
    storage = peer.storage_conf(tmp_path)
    assert f'graphroot = "{tmp_path}/root"' in storage
    assert f'runroot = "{tmp_path}/runroot"' in storage


@pytest.mark.timeout(300)
def test_one_tiny_run_leaves_nothing_behind() -> None:
    peer = _peer()
    why = peer.why_not()
    if why:
        pytest.skip(why)
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "podman_peer.py"), "--many", "1",
                          "--idle-pods", "1", "-n", "1", "-k", "1", "--idle-seconds", "0",
                          "--json"], capture_output=True, text=True, timeout=280, check=False)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert "error" not in out, out
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(out["one_s"]) == 1 and len(out["kill_s"]) == 1 and out["many"] == 1
    assert "cleanup_forced" not in out, out  # `pod rm -a` removed everything by itself
    root = out["root"]
    assert not Path(root).exists()
    assert root not in Path("/proc/self/mountinfo").read_text()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            assert root not in cmdline, cmdline
    assert len(out["pod_ids"]) == 2  # one0 and pm0
    leftovers = [parent / pod_id for pod_id in out["pod_ids"] for parent in peer._parents()
                 if (parent / pod_id).exists()]
    assert leftovers == []
