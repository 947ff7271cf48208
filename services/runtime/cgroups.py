"""UpdateContainerResources on cgroup v2, where the host allows it.

The container's process group is moved into ``<cgroup2>/podvisor/<container id>`` and the
memory/cpu limits written there. Hosts without a cgroup v2 hierarchy that delegates the needed
controllers (for example a hybrid v1 host) get a clear FAILED_PRECONDITION instead.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.faults import precondition

_CANDIDATES = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


def _cgroup2_root() -> Path | None:
    for path in _CANDIDATES:
        if (path / "cgroup.controllers").exists() and (path / "cgroup.subtree_control").exists():
            return path
    return None


def _needed(res: pb.LinuxContainerResources) -> set[str]:
    need = set()
    if res.memory_limit_in_bytes:
        need.add("memory")
    if res.cpu_quota or res.cpu_shares:
        need.add("cpu")
    return need


def apply(container_id: str, pids: list[int], res: pb.LinuxContainerResources) -> None:
    need = _needed(res)
    if not need:
        return
    root = _cgroup2_root()
    if root is None:
        raise precondition("cannot update container resources: this host has no cgroup v2 "
                           "hierarchy (cgroup v1 limits are not supported by the embedded runtime)")
    available = set((root / "cgroup.controllers").read_text().split())
    missing = need - available
    if missing:
        raise precondition(
            f"cannot update container resources: cgroup v2 at {root} does not offer the "
            f"{', '.join(sorted(missing))} controller(s) (available: {sorted(available) or 'none'})"
        )
    try:
        parent = root / "podvisor"
        parent.mkdir(exist_ok=True)
        _enable(root, need)
        _enable(parent, need)
        cg = parent / container_id
        cg.mkdir(exist_ok=True)
        for pid in pids:
            (cg / "cgroup.procs").write_text(str(pid))
        if res.memory_limit_in_bytes:
            (cg / "memory.max").write_text(str(res.memory_limit_in_bytes))
        if res.cpu_quota:
            period = res.cpu_period or 100_000
            quota = "max" if res.cpu_quota < 0 else str(res.cpu_quota)
            (cg / "cpu.max").write_text(f"{quota} {period}")
        if res.cpu_shares:
            weight = 1 + ((res.cpu_shares - 2) * 9999) // 262142  # the runc conversion
            (cg / "cpu.weight").write_text(str(max(1, min(weight, 10000))))
    except OSError as err:
        raise precondition(f"cannot update container resources: {err}") from None


def _enable(cg: Path, controllers: set[str]) -> None:
    enabled = set((cg / "cgroup.subtree_control").read_text().split())
    for name in controllers - enabled:
        (cg / "cgroup.subtree_control").write_text(f"+{name}")


def remove(container_id: str) -> None:
    root = _cgroup2_root()
    if root is not None:
        with contextlib.suppress(OSError):
            os.rmdir(root / "podvisor" / container_id)
