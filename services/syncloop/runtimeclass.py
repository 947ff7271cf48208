"""RuntimeClasses and the runtime's handlers, as the kubelet keeps them
(``pkg/kubelet/runtimeclass`` Manager, ``runtimeState.runtimeHandlers``).

- ``RuntimeClasses``: the kubelet's RuntimeClass manager, an informer over
  ``node.k8s.io/v1`` ``runtimeclasses`` (list + watch of the whole collection; a ``Reflector``
  on its own thread). ``lookup(name)`` is its ``LookupRuntimeHandler``: "" for no name (the
  default handler), else the class's ``handler``; a class the cache does not hold raises
  ``RuntimeClassError`` with the lister's NotFound text (``runtimeclass.node.k8s.io "x" not
  found``), and a cache that has not listed yet within ``sync_timeout`` raises it with "failed
  to lookup RuntimeClass x: ...". The kubelet builds the manager only with an API client:
  without one (standalone, static pods only) there is none, ``runtimeClassName`` is not looked
  up and the sandbox gets the default handler "", and no handler is taken to support recursive
  read-only mounts (``runtimeClassSupportsRecursiveReadOnlyMounts``: false without a manager).
- ``handlers_of(status)``: the CRI ``StatusResponse.runtime_handlers`` as name -> supports
  recursive read-only mounts (empty: the runtime reports none, as containerd 1.6: then no
  handler supports them, ``runtimeHandlerSupportsRecursiveReadOnlyMounts``).

Thread-safe: pod workers look up on their pool threads, the reflector writes on its own.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from cri_api.v1 import api_pb2 as pb

from podvisor.services.apiserver import ApiConnection, ApiMeta, Obj, Reflector

PATH = "/apis/node.k8s.io/v1/runtimeclasses"
SYNC_TIMEOUT = 1.0


class RuntimeClassError(Exception):
    """The RuntimeClass cannot be resolved (the kubelet: the sandbox is not created)."""


def handlers_of(resp: pb.StatusResponse) -> dict[str, bool]:
    """The runtime's handlers: name ("" the default) -> recursive read-only mounts."""
    return {h.name: bool(h.features.recursive_read_only_mounts) for h in resp.runtime_handlers}


def supports_rro(handler: str, handlers: Mapping[str, bool]) -> bool:
    """``runtimeHandlerSupportsRecursiveReadOnlyMounts``: an unknown handler, or a runtime
    that lists none, does not."""
    return bool(handlers.get(handler, False))


class RuntimeClasses:
    def __init__(self, conn: ApiConnection, *, watch_timeout: float = 300.0,
                 max_delay: float = 30.0, sync_timeout: float = SYNC_TIMEOUT) -> None:
        self.conn = conn  # its API client (the sync loop hands it injected api faults)
        self.sync_timeout = sync_timeout
        self._lock = threading.Lock()
        self._handlers: dict[str, str] = {}
        self._synced = threading.Event()
        self._error = ""
        self._reflector = Reflector(conn, PATH, {}, self, watch_timeout=watch_timeout,
                                    max_delay=max_delay)

    def start(self) -> None:
        self._reflector.start()

    def close(self) -> None:
        self._reflector.stop()

    # --- the reflector's sink (its thread) ---
    def listed(self, items: list[Obj], rv: str) -> None:
        with self._lock:
            self._handlers = {ApiMeta.of(i).name: str(i.get("handler", "")) for i in items}
            self._error = ""
        self._synced.set()

    def event(self, kind: str, obj: Obj) -> None:
        name = ApiMeta.of(obj).name
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._handlers[name] = str(obj.get("handler", ""))
            elif kind == "DELETED":
                self._handlers.pop(name, None)

    def failed(self, why: str) -> None:
        with self._lock:
            self._error = why

    # --- reads (pool threads) ---
    def lookup(self, name: str) -> str:
        """The handler of RuntimeClass ``name`` ("" for no name)."""
        if not name:
            return ""
        if not self._synced.wait(self.sync_timeout):
            with self._lock:
                why = self._error or "the RuntimeClass cache has not synced yet"
            raise RuntimeClassError(f"failed to lookup RuntimeClass {name}: {why}")
        with self._lock:
            handler = self._handlers.get(name)
        if handler is None:
            raise RuntimeClassError(f'runtimeclass.node.k8s.io "{name}" not found')
        return handler
