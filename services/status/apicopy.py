"""``ApiCopies``: the API's copy of the status of each pod of this node, as status-api's own
list+watch (a ``Reflector`` on ``pods?fieldSelector=spec.nodeName=<node>``) last delivered it.

The status writer compares them with podvisor's statuses (the kubelet's status manager reads
the same copies from its pod manager, fed by its one pod watch). Why a watch of its own rather
than the API source's pods (``pods-api``): that source drops ``status`` on purpose (its set is
what the sync loop runs; a status in it would republish the whole set on every status write,
podvisor's own included); here the writer knows when its copy was listed again (``lists``:
the API server is back, every copy is fresh) and needs nobody else to be up to read it.

Each copy carries ``seq``, the count of deliveries when it came: a copy with ``seq`` at most
the count taken before a write of that pod predates the write (the writer waits for the watch
to bring a newer one before it compares again). The reflector's thread writes, the writer's
reads: every method takes the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from podvisor.services.apiserver import ApiMeta, Obj

__all__ = ["ApiCopies", "ApiStatus"]


@dataclass(frozen=True)
class ApiStatus:
    """One pod's ``status`` as the API holds it, and the delivery count when it arrived."""

    status: Mapping[str, Any]
    seq: int


def _status(obj: Obj) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


class ApiCopies:
    """The reflector's sink (``listed``, ``event``, ``failed``), by pod UID. ``on_list`` is
    called (on the reflector's thread) after every list: the first, and each one after the
    API server came back or expired the watch's version."""

    def __init__(self, on_list: Callable[[], None] = lambda: None) -> None:
        self._lock = threading.Lock()
        self._copies: dict[str, ApiStatus] = {}
        self._seq = 0
        self._lists = 0
        self._error = ""
        self._on_list = on_list

    def listed(self, items: list[Obj], rv: str) -> None:
        with self._lock:
            self._seq += 1
            self._copies = {uid: ApiStatus(_status(i), self._seq)
                            for i in items if (uid := ApiMeta.of(i).uid)}
            self._lists += 1
            self._error = ""
        self._on_list()

    def event(self, kind: str, obj: Obj) -> None:
        uid = ApiMeta.of(obj).uid
        if kind == "BOOKMARK" or not uid:
            return
        with self._lock:
            self._seq += 1
            if kind == "DELETED":
                self._copies.pop(uid, None)
            else:
                self._copies[uid] = ApiStatus(_status(obj), self._seq)
            self._error = ""

    def failed(self, why: str) -> None:
        with self._lock:
            self._error = why

    def get(self, uid: str) -> ApiStatus | None:
        with self._lock:
            return self._copies.get(uid)

    @property
    def seq(self) -> int:
        """Deliveries so far (take it before a write: see the module)."""
        with self._lock:
            return self._seq

    @property
    def lists(self) -> int:
        """Lists so far (0: no copy yet)."""
        with self._lock:
            return self._lists

    @property
    def error(self) -> str:
        """Why the last list or watch failed ("" once one succeeded since)."""
        with self._lock:
            return self._error

    def __len__(self) -> int:
        with self._lock:
            return len(self._copies)
