"""``/proc/self/mountinfo`` (proc(5)) read as ``MountPoint``s: the volume manager's mounts and
the sync loop's removal of a pod's folder (which never crosses a mount point under it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MountPoint:
    """One line of mountinfo: where, from which source root, with which options."""

    path: str
    root: str
    fstype: str
    source: str
    options: str

    @property
    def read_only(self) -> bool:
        return "ro" in self.options.split(",")


def _unescape(text: str) -> str:
    return (text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


def parse_mountinfo(text: str) -> list[MountPoint]:
    """mountinfo lines as ``MountPoint``s, in mount order (malformed lines skipped)."""
    out: list[MountPoint] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 2:
            continue
        out.append(MountPoint(_unescape(fields[4]), _unescape(fields[3]), tail[0],
                              _unescape(tail[1]), fields[5]))
    return out


def host_mounts() -> list[MountPoint]:
    """This process's mounts (none when mountinfo cannot be read)."""
    try:
        with open("/proc/self/mountinfo") as f:
            return parse_mountinfo(f.read())
    except OSError:
        return []


def mounts_under(folder: Path, mounts: list[MountPoint]) -> set[str]:
    """The mount points at or below ``folder`` (its real path)."""
    real = str(folder.resolve()) if folder.exists() else str(folder)
    return {m.path for m in mounts if m.path == real or m.path.startswith(real + "/")}
