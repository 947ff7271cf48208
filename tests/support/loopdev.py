"""A real block device for the raw block volume tests: a loop device (``losetup``) over a file
in the test's temp dir, detached at the end. Skips (with the reason) where loop devices are
unavailable: not root, no ``losetup``, no free loop device (a container without
/dev/loop-control)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SIZE = 4 * 1024 * 1024


@contextmanager
def loop_device(backing: Path) -> Iterator[str]:
    """Yields the device's path (``/dev/loopN``); ``backing`` is made (zeros, 4 MiB)."""
    if os.geteuid() != 0:
        pytest.skip("loop devices need root")
    if shutil.which("losetup") is None:
        pytest.skip("no losetup (util-linux / mount) on this host")
    with open(backing, "wb") as f:
        f.truncate(SIZE)
    made = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True,
                          text=True, check=False, timeout=60)
    if made.returncode != 0:
        pytest.skip(f"no loop device available: {made.stderr.strip()}")
    device = made.stdout.strip()
    try:
        yield device
    finally:
        subprocess.run(["losetup", "-d", device], check=False, timeout=60)


def read_back(backing: Path, length: int) -> bytes:
    """The first ``length`` bytes of the backing file, from the host's side."""
    with open(backing, "rb") as f:
        return f.read(length)
