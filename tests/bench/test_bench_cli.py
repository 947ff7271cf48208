"""`python -m bench` keeps working (issue 16): its listing, its refusal of an unknown stage, and
a run whose stages are all skipped (no benchmark runs, the table and JSON are still printed).
No timing is asserted: figures live in bench/, not in tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_list_names_every_stage() -> None:
    out = _bench("--list")
    assert out.returncode == 0, out.stderr
    for name in ("bus", "restart", "pods", "circus", "containerd", "kubelet", "idle", "podman"):
        assert name in out.stdout
    for script in ("bus.py", "restart.py", "pods.py", "circus_peer.py", "containerd_pods.py",
                   "kubelet_peer.py", "podman_peer.py"):
        assert (ROOT / "bench" / script).exists()
        assert script in out.stdout


def test_unknown_stage_is_refused() -> None:
    out = _bench("--stages", "nope")
    assert out.returncode == 2
    assert "unknown stage(s): nope" in out.stderr


def test_skipped_stage_still_prints_the_table_and_json() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PODVISOR_CONTAINERD_ENDPOINT", "PODVISOR_BENCH_KUBELET")}
    env["PATH"] = str(Path(sys.executable).parent)  # no podman on it: its stage is skipped
    out = _bench("--stages", "containerd,kubelet,podman", env=env)
    assert out.returncode == 0, out.stderr
    assert "skipped: PODVISOR_CONTAINERD_ENDPOINT is not set" in out.stdout
    assert "skipped: podman is not installed" in out.stdout
    # every kubelet row says why it is empty: no binary given, and none on this machine
    kubelet_rows = [line for line in out.stdout.splitlines() if "kubelet peer" in line]
    assert len(kubelet_rows) == 9
    assert all("skipped: PODVISOR_BENCH_KUBELET is not set (no kubelet binary" in line
               for line in kubelet_rows)
    assert "machine: " in out.stdout
    out = _bench("--stages", "containerd,podman", "--json", env=env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["machine"]["cpus"] == os.cpu_count()
    rows = {row["figure"]: row for row in doc["figures"]}
    assert rows["on containerd: 1 manifest -> Running in /pods"]["podvisor"] is None
    assert any(row["peer"] == "podman kube play" and row["missing"] for row in doc["figures"])
    assert all(row["missing"].startswith("skipped") for row in doc["figures"])


def test_a_peer_figure_of_zero_has_no_ratio() -> None:
    sys.path.insert(0, str(ROOT))
    from bench.__main__ import Row, machine, ratio, table

    row = Row("idle CPU", "%", peer="podman", ours=[1.5], theirs=[0.0])
    assert ratio(row) is None
    assert "| - |" in table([row], machine(os.getloadavg()))
