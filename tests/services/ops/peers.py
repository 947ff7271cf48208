"""supervisord's ecosystem, from PyPI, in its OWN virtualenv (imported as
``tests.services.ops.peers``).

``peer_bin()`` creates ``$XDG_CACHE_HOME/podvisor/ops-peers`` (default ``~/.cache``) once with
``python3 -m venv`` and ``pip install supervisor superlance`` and returns its ``bin`` folder
(supervisorctl, crashmail, memmon, ...); the test is skipped, with the reason, when that cannot
be done (no package index reachable). Never installed into podvisor's own environment.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = ("supervisor", "superlance")


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "podvisor" / "ops-peers"


def peer_bin() -> Path:
    venv = _cache()
    done = venv / ".installed"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / "ops-peers.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel sessions build it once
        if not done.exists():
            steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
                     [str(venv / "bin" / "pip"), "install", "-q", *PACKAGES]]
            for cmd in steps:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                if out.returncode != 0:
                    pytest.skip(f"cannot build the supervisord peer venv ({' '.join(cmd)}): "
                                f"{out.stderr.strip()[-400:]}")
            done.touch()
    return venv / "bin"
