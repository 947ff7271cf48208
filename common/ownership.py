"""The kubelet's ``SetVolumeOwnership`` (pkg/volume/volume_linux.go): a pod's ``fsGroup`` on a
writable volume's files. Shared by the sync loop (emptyDir) and the volume manager (local and
CSI volumes)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

_RW, _EXEC = 0o660, 0o110


def _wanted(mode: int, is_dir: bool) -> int:
    return mode | _RW | ((_EXEC | stat.S_ISGID) if is_dir else 0)


def set_volume_ownership(root: Path, fs_group: int, on_root_mismatch: bool) -> None:
    """The kubelet's ``SetVolumeOwnership`` (pkg/volume/volume_linux.go) for a writable volume:
    lchown to group ``fs_group``, mode |= 0660 (directories |= 0770 and setgid; symlinks
    untouched). ``on_root_mismatch``: skip when the root already has the group and mode."""
    st = os.lstat(root)
    if on_root_mismatch and st.st_gid == fs_group and (
            st.st_mode & 0o7777 == _wanted(st.st_mode & 0o7777, True)):
        return
    def change(path: str) -> None:
        info = os.lstat(path)
        os.lchown(path, -1, fs_group)
        if not stat.S_ISLNK(info.st_mode):
            os.chmod(path, _wanted(info.st_mode & 0o7777, stat.S_ISDIR(info.st_mode)))

    def fail(err: OSError) -> None:
        raise err

    for base, dirs, files in os.walk(root, onerror=fail):  # symlinks are not followed
        change(base)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            change(os.path.join(base, name))
