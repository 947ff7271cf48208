"""The allocation checkpoint: what the node granted each pod's containers, and what each
running container actually runs with (the kubelet's allocation manager and its
``allocated_pods_state_checkpoint`` / ``actuated_pods_state_checkpoint``).

One JSON file, ``<rootDir>/state/allocation.json``, rewritten whole on every change (a
temporary file, fsync, ``rename(2)``): a kill -9 of the sync loop at any point leaves either
the old or the new file, never a torn one. The sync loop reads it at start, so a restarted sync
loop knows which resizes it accepted and which it had applied; a resize interrupted between
the two is applied again (UpdateContainerResources is idempotent).

- ``allocated``: pod UID -> container name -> ``Amounts`` (``resize.py``): set when the pod is
  first synced (its spec as it is) and when a resize is accepted; forgotten with the pod.
- ``actuated``: pod UID -> container name -> (container ID, ``Amounts``): set when a container
  is created (with its allocation) and after each UpdateContainerResources. A record for an
  older container of that name says nothing of a newer one.

Thread-safe: the loop thread allocates, pool threads record what they applied.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from podvisor.common.logs import Log
from podvisor.services.syncloop.resize import Amounts, from_wire

FILE = "allocation.json"
VERSION = 1


class AllocationStore:
    def __init__(self, path: Path | None, log: Log) -> None:
        """``path``: the checkpoint file (None: kept in memory only, for unit tests)."""
        self.path = path
        self.log = log
        self._lock = threading.Lock()
        self._allocated: dict[str, dict[str, Amounts]] = {}
        self._actuated: dict[str, dict[str, tuple[str, Amounts]]] = {}
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            raw = json.loads(path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as err:
            self.log.warning("syncloop.allocation.unreadable", path=str(path), error=str(err),
                             reason="starting from the pods' specs")
            return
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            return
        for uid, per in (raw.get("allocated") or {}).items():
            if isinstance(per, dict):
                self._allocated[str(uid)] = {str(n): from_wire(a) for n, a in per.items()}
        for uid, per in (raw.get("actuated") or {}).items():
            if isinstance(per, dict):
                self._actuated[str(uid)] = {
                    str(n): (str(v[0]), from_wire(v[1])) for n, v in per.items()
                    if isinstance(v, list) and len(v) == 2}

    def _save(self) -> None:
        """Under the lock."""
        if self.path is None:
            return
        doc: dict[str, Any] = {
            "version": VERSION, "allocated": self._allocated,
            "actuated": {uid: {n: [cid, a] for n, (cid, a) in per.items()}
                         for uid, per in self._actuated.items()}}
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def allocated(self, uid: str) -> dict[str, Amounts] | None:
        """Container name -> its allocation (None: the pod was never allocated)."""
        with self._lock:
            per = self._allocated.get(uid)
            return dict(per) if per is not None else None

    def set_allocated(self, uid: str, allocation: Mapping[str, Amounts]) -> None:
        with self._lock:
            if self._allocated.get(uid) == dict(allocation):
                return
            self._allocated[uid] = dict(allocation)
            self._save()

    def actuated(self, uid: str) -> dict[str, tuple[str, Amounts]]:
        """Container name -> (the container ID it is about, what that container runs with)."""
        with self._lock:
            return dict(self._actuated.get(uid, {}))

    def set_actuated(self, uid: str, name: str, container_id: str, a: Amounts) -> None:
        with self._lock:
            per = self._actuated.setdefault(uid, {})
            if per.get(name) == (container_id, a):
                return
            per[name] = (container_id, a)
            self._save()

    def forget(self, uid: str) -> None:
        """The pod is gone (terminated for good)."""
        with self._lock:
            if self._allocated.pop(uid, None) is None and self._actuated.pop(uid, None) is None:
                return
            self._actuated.pop(uid, None)
            self._save()

    def uids(self) -> set[str]:
        with self._lock:
            return set(self._allocated) | set(self._actuated)
