"""Node-level reclaim before an eviction (the kubelet's ``buildSignalToNodeReclaimFuncs`` and
``reclaimNodeLevelResources``). Pure: which reclaim a signal has, and whether it sufficed.

A disk signal first asks for every unused dead container (``containers``: the kubelet's
``containerGC.DeleteAllUnusedContainers``) and then every unused image (``images``:
``imageGC.DeleteUnusedImages``); both are the ``imagegc`` process's work, asked with
``ReclaimNodeResources`` (service.py). With a dedicated image filesystem only the imagefs
signals have them (nodefs pressure then only evicts, as the kubelet: its reclaim would free
the other filesystem). Memory and PIDs have none: their thresholds evict at once.
After the reclaim the signals are read again; the eviction goes ahead only if a threshold,
any of them, is still met with its minimum reclaim added (``thresholdsMet(..., true)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from podvisor.services.eviction.signals import (
    IMAGEFS,
    IMAGEFS_INODES,
    NODEFS,
    NODEFS_INODES,
    Observations,
)
from podvisor.services.eviction.thresholds import Threshold, thresholds_met

CONTAINERS, IMAGES = "containers", "images"  # in the kubelet's order
ReclaimFuncs = Mapping[str, tuple[str, ...]]


def node_reclaim_funcs(dedicated_imagefs: bool) -> dict[str, tuple[str, ...]]:
    """Signal -> the reclaim it asks for, in order (absent: none)."""
    both = (CONTAINERS, IMAGES)
    out: dict[str, tuple[str, ...]] = {IMAGEFS: both, IMAGEFS_INODES: both}
    if not dedicated_imagefs:
        out |= {NODEFS: both, NODEFS_INODES: both}
    return out


def reclaim_sufficed(thresholds: Sequence[Threshold], after: Observations) -> bool:
    """No threshold is met any more once its minimum reclaim is added: no pod to evict."""
    return not thresholds_met(thresholds, after, True)
