"""The C container monitor (monitor.c): built once per machine and source version, then reused.

The package ships the source, not a binary: the runtime compiles it with the system C compiler
(``cc``, or ``$CC``) into a cache directory the first time it starts, as
``pv-monitor-<sha256 of the source, 16 hex>``, and every later start (any rootDir) reuses it.
Without a compiler, or when the build fails, the runtime falls back to the Python monitor
(monitor.py, forked from the zygote: the same contract, ~1.8 MB more private memory per
container) and says so in its log. ``PODVISOR_MONITOR=python`` forces the fallback.

Seccomp: when libseccomp's header is there (Debian ``libseccomp-dev``), the monitor is built with
``-DPV_SECCOMP -lseccomp`` and loads containers' seccomp filters (``MonitorBinary.seccomp``);
without it, it is built without, and the runtime refuses containers that ask for a profile. The
two builds have different names (``-seccomp``), so installing the header later builds anew.

Cache directory: ``$PODVISOR_CACHE_DIR``, else ``$XDG_CACHE_HOME/podvisor``, else
``~/.cache/podvisor``. The build writes a temporary file and renames it, so concurrent first
starts never run a half-written binary.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("monitor.c")
CFLAGS = ("-O2", "-Wall", "-Wextra")
BUILD_TIMEOUT = 60.0


@dataclass(frozen=True)
class MonitorBinary:
    """``path`` is None when the C monitor is not available; ``why`` says why."""

    path: Path | None
    why: str = ""
    seccomp: bool = False
    seccomp_why: str = ""


def cache_dir() -> Path:
    explicit = os.environ.get("PODVISOR_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "podvisor"


def monitor_binary(cache: Path | None = None) -> MonitorBinary:
    """The built C monitor, building it first when this source version has no binary yet."""
    if os.environ.get("PODVISOR_MONITOR", "") == "python":
        return MonitorBinary(None, "PODVISOR_MONITOR=python")
    try:
        source = SOURCE.read_bytes()
    except OSError as err:
        return MonitorBinary(None, f"no monitor source {SOURCE}: {err.strerror}")
    cache = cache or cache_dir()
    base = cache / f"pv-monitor-{hashlib.sha256(source).hexdigest()[:16]}"
    header = seccomp_header()
    if header is not None:
        built = _build(base.with_name(base.name + "-seccomp"), cache, SECCOMP_FLAGS)
        if built.path is not None:
            return MonitorBinary(built.path, seccomp=True)
        why = f"the build with libseccomp failed ({built.why})"
    else:
        why = ("the C monitor was built without libseccomp (no seccomp.h: install Debian's "
               "libseccomp-dev)")
    built = _build(base, cache, ())
    return MonitorBinary(built.path, built.why, seccomp=False, seccomp_why=why)


SECCOMP_FLAGS = ("-DPV_SECCOMP", "-lseccomp")
HEADER_DIRS = ("/usr/include", "/usr/local/include")


def seccomp_header() -> Path | None:
    """libseccomp's header (``$PODVISOR_SECCOMP_HEADER_DIRS``, ':'-separated, overrides where
    it is looked for: tests)."""
    dirs = os.environ.get("PODVISOR_SECCOMP_HEADER_DIRS")
    for d in dirs.split(":") if dirs is not None else HEADER_DIRS:
        path = Path(d) / "seccomp.h"
        if d and path.is_file():
            return path
    return None


def _build(target: Path, cache: Path, flags: tuple[str, ...]) -> MonitorBinary:
    if os.access(target, os.X_OK):
        return MonitorBinary(target)
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return MonitorBinary(None, "no C compiler (cc) found")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return MonitorBinary(None, f"cannot create {cache}: {err.strerror}")
    tmp = target.with_name(f"{target.name}.tmp.{os.getpid()}")
    libs = [f for f in flags if f.startswith("-l")]
    defines = [f for f in flags if not f.startswith("-l")]
    try:
        result = subprocess.run([compiler, *CFLAGS, *defines, "-o", str(tmp), str(SOURCE),
                                 *libs], capture_output=True, timeout=BUILD_TIMEOUT,
                                check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return MonitorBinary(None, f"{compiler} failed: {err}")
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        detail = result.stderr.decode(errors="replace").strip().splitlines()[-3:]
        return MonitorBinary(None, f"{compiler} exited {result.returncode}: {' | '.join(detail)}")
    os.rename(tmp, target)
    return MonitorBinary(target)
