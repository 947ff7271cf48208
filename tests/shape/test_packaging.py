"""The wheel installs beside PyPI `supervisor` (supervisord) and both import names work.

Builds a wheel of this checkout, installs it with its dependencies and `supervisor` into a fresh
venv (pip's cache makes this ~45 s), then runs both programs. No test here needs a network
beyond the package index pip already uses.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str | Path, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    # cwd outside the checkout: its `supervisor/` folder would shadow supervisord's package
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                         timeout=timeout, cwd="/")
    assert out.returncode == 0, (
        f"{args}: {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


@pytest.mark.timeout(900)
def test_wheel_coexists_with_supervisord(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, REPO)
    (wheel,) = wheels.glob("podvisor-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    py, bindir = venv / "bin" / "python", venv / "bin"
    _run(py, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel, "supervisor")
    probe = ("import supervisor, supervisor.supervisord, podvisor.supervisor, "
             "podvisor.supervisor.app, podvisor.ipc.bus; "
             "print(supervisor.__file__); print(podvisor.supervisor.__file__)")
    lines = _run(py, "-c", probe).stdout.splitlines()
    assert lines[0].endswith("site-packages/supervisor/__init__.py")
    assert lines[1].endswith("site-packages/podvisor/supervisor/__init__.py")
    assert _run(bindir / "supervisord", "--version").stdout.strip()
    assert "podvisor" in _run(bindir / "podvisor", "--help").stdout
    assert "status" in _run(bindir / "podvisorctl", "--help").stdout
    config = tmp_path / "c.yaml"
    config.write_text("nodeName: n1\nsyncFrequency: 30s\n")
    assert '"syncFrequency": "30.0s"' in _run(bindir / "podvisor", "config", "--config",
                                              config).stdout
