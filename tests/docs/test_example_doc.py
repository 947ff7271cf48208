"""docs/examples/test_workload.py, a user's test written against the plugin's public API only,
passes here too (with podvisor as this venv installed it; .ci/example.sh runs it in a fresh
venv with podvisor installed from the checkout, as a user would)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "test_workload.py"


@pytest.mark.timeout(400)
def test_the_example_of_the_docs_passes(tmp_path: Path) -> None:
    copy = tmp_path / EXAMPLE.name  # outside the repository: no conftest, no ini of ours
    copy.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "no:randomly", str(copy)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=380, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout
