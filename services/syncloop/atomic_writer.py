"""Writing a projected volume's files atomically, as the kubelet's ``AtomicWriter``
(``pkg/volume/util/atomic_writer.go``):

    <dir>/..2024_05_01_12_00_00.123456789/<files>   the data, one timestamped folder
    <dir>/..data -> ..2024_05_01_12_00_00.123456789 swapped by rename(2), atomically
    <dir>/<top-level name> -> ..data/<top-level name>   what the container sees

A reader never sees a half-written set. Nothing is written when the files are unchanged; the
old folder and user-visible links of removed paths go after the swap. ``now`` is wall-clock
seconds, used only to name the folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

DATA_LINK = "..data"
_TMP_LINK = "..data_tmp"


def _current(target: Path) -> dict[str, tuple[bytes, int]] | None:
    data = target / DATA_LINK
    if not data.is_symlink():
        return None
    out: dict[str, tuple[bytes, int]] = {}
    for root, _dirs, files in os.walk(data, followlinks=True):
        for name in files:
            path = Path(root) / name
            rel = str(path.relative_to(data))
            out[rel] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return out


def _validate(path: str) -> None:
    parts = path.split("/")
    if not path or path.startswith(("/", "..")) or ".." in parts or "" in parts:
        raise ValueError(f"invalid file path {path!r}")


def write_atomic(target: Path, payload: Mapping[str, tuple[bytes, int]], now: float) -> bool:
    """Make ``target`` hold exactly ``payload`` (relative path -> (content, mode)). True when
    it wrote (the set changed). Raises OSError / ValueError."""
    for path in payload:
        _validate(path)
    target.mkdir(parents=True, exist_ok=True)
    current = _current(target)
    if current == dict(payload):
        return False
    old_dir = os.readlink(target / DATA_LINK) if current is not None else None
    stamp = time.strftime("%Y_%m_%d_%H_%M_%S.", time.gmtime(now))
    ts_dir = Path(tempfile.mkdtemp(prefix=".." + stamp, dir=target))
    os.chmod(ts_dir, 0o755)
    for path, (content, mode) in payload.items():
        file = ts_dir / path
        file.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        file.write_bytes(content)
        os.chmod(file, mode)
    tmp_link = target / _TMP_LINK
    if tmp_link.is_symlink():
        tmp_link.unlink()
    os.symlink(ts_dir.name, tmp_link)
    os.rename(tmp_link, target / DATA_LINK)
    wanted = {p.split("/", 1)[0] for p in payload}
    for name in sorted(wanted):
        link = target / name
        if not link.is_symlink():
            os.symlink(f"{DATA_LINK}/{name}", link)
    for entry in os.listdir(target):
        if entry.startswith(".."):
            continue
        link = target / entry
        if entry not in wanted and link.is_symlink():
            link.unlink()
    if old_dir is not None and old_dir != ts_dir.name:
        shutil.rmtree(target / old_dir, ignore_errors=True)
    return True
