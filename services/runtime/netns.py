"""Named network namespaces for pod sandboxes: ``<runtime root>/netns/<sandbox id>``.

A namespace is kept alive by a bind mount of ``/proc/<pid>/ns/net`` on a file (what
``ip netns add`` does under /run/netns, and containerd under its state dir with
``netns_mounts_under_state_dir``): made by util-linux ``unshare --net=FILE true``, so no
thread of the (multi-threaded) runtime ever changes namespace to make one. Everything here is
idempotent: ``make`` on an existing namespace keeps it, ``remove`` of a missing one is done.
Keeping them under the runtime's root means a crash leaves them where the next start finds
them (``engine.py`` sweeps the ones no ready sandbox owns).

``enter(path)`` switches the *calling thread* (network namespaces are per thread) and returns
a function that switches it back: port forwarding opens its socket that way, on a thread of
its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

CLONE_NEWNET = 0x40000000
MNT_DETACH = 2


class NetnsError(Exception):
    pass


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def is_namespace(path: Path) -> bool:
    """``path`` holds a network namespace (an nsfs bind mount), not just a file."""
    try:  # nsfs files share one device: compare with this process's own namespace file
        return os.stat(path).st_dev == os.stat("/proc/self/ns/net").st_dev
    except OSError:
        return False


def make(path: Path) -> None:
    """Create the namespace at ``path`` (kept if it is one already)."""
    if is_namespace(path):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(exist_ok=True)
    unshare = shutil.which("unshare")
    if unshare is None:
        raise NetnsError("a pod network namespace needs unshare (util-linux) on the PATH")
    done = subprocess.run([unshare, f"--net={path}", "true"], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise NetnsError(f"network namespace {path}: {done.stderr.strip() or done.returncode}")


def remove(path: Path) -> None:
    """Unmount and delete the namespace file (nothing to do when it is gone)."""
    libc = _libc()
    while is_namespace(path):
        if libc.umount2(os.fsencode(str(path)), MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"unmount {path}: {os.strerror(err)}")
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def listed(directory: Path) -> Iterator[Path]:
    """The namespace files under ``directory`` (made or left half-made by ``make``)."""
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(directory.iterdir()):
            if not entry.name.startswith("."):
                yield entry


def enter(path: str) -> Callable[[], None]:
    """Move the calling thread into the namespace at ``path``; the returned function moves it
    back to the one it was in. Use on a thread that does nothing else meanwhile."""
    libc = _libc()
    own = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        os.close(own)
        raise
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            os.close(own)
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(target)

    def back() -> None:
        try:
            if libc.setns(own, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns back: {os.strerror(err)}")
        finally:
            os.close(own)
    return back
