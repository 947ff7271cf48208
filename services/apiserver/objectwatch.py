"""One watch per referenced API object: the kubelet's ``Watch`` strategy for ConfigMaps and
Secrets (``configMapAndSecretChangeDetectionStrategy: Watch``, its ``watch_based_manager``).

``ObjectWatches.register(owner, keys)`` says which objects an owner (a pod's UID) references;
each object referenced by at least one owner has a ``Reflector`` of its own: list + watch of its
namespace's collection with ``fieldSelector=metadata.name=<name>``, so the API server sends only
that object's changes, and nothing is polled. An object no owner references any more has its
watch stopped (``register`` with fewer keys, ``unregister``). An object marked ``immutable``
has its watch stopped once read, as the kubelet does (it can only be deleted and recreated).

``get(key)`` answers from the watch's copy: the object, or None when it does not exist. A watch
that has not listed yet is waited for up to ``sync_timeout`` (1 s, the kubelet's); then
``NotSynced`` (an ``OSError``: the caller's "cannot read it now", with the last failure). A key
no owner registered is ``NotRegistered`` (also an ``OSError``). Through an outage of the API
server the last copy keeps being served (the reflector retries with back-off).

``on_change(key, owners)`` is called on the watch's thread when an object's content changed
after its first list (an update, a deletion, a creation): the owners can act at once (the sync
loop syncs the pods, which rewrite their volumes with the ``..data`` swap).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from podvisor.services.apiserver.client import ApiConnection, Obj
from podvisor.services.apiserver.meta import ApiMeta
from podvisor.services.apiserver.reflector import Reflector

ObjectKey = tuple[str, str, str]  # (resource: "configmaps" | "secrets", namespace, name)
SYNC_TIMEOUT = 1.0


class NotSynced(OSError):
    """The object's watch has not listed it yet (the API server is slow or away)."""


class NotRegistered(OSError):
    """No owner references this object, so it is not watched."""


def _content(obj: Obj | None) -> Obj | None:
    """What an owner sees of an object: everything but its metadata's bookkeeping."""
    if obj is None:
        return None
    return {k: v for k, v in obj.items() if k != "metadata"}


@dataclass
class _Item:
    key: ObjectKey
    owners: set[str] = field(default_factory=set)
    synced: threading.Event = field(default_factory=threading.Event)
    value: Obj | None = None
    error: str = ""
    immutable: bool = False
    reflector: Reflector | None = None


class _Sink:
    """The reflector's callbacks for one object (called on its thread)."""

    def __init__(self, watches: ObjectWatches, item: _Item) -> None:
        self.watches, self.item = watches, item

    def listed(self, items: list[Obj], rv: str) -> None:
        name = self.item.key[2]
        found = [i for i in items if ApiMeta.of(i).name == name]
        self.watches._store(self.item, found[0] if found else None)

    def event(self, kind: str, obj: Obj) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self.watches._store(self.item, obj)
        elif kind == "DELETED":
            self.watches._store(self.item, None)

    def failed(self, why: str) -> None:
        self.item.error = why


class ObjectWatches:
    def __init__(self, conn: ApiConnection, *,
                 on_change: Callable[[ObjectKey, frozenset[str]], None] = lambda key, owners: None,
                 watch_timeout: float = 300.0, max_delay: float = 30.0,
                 sync_timeout: float = SYNC_TIMEOUT) -> None:
        self.conn = conn
        self.on_change = on_change
        self.watch_timeout = watch_timeout
        self.max_delay = max_delay
        self.sync_timeout = sync_timeout
        self._lock = threading.Lock()
        self._items: dict[ObjectKey, _Item] = {}
        self._owned: dict[str, frozenset[ObjectKey]] = {}
        self._closed = False

    # --- references ---
    def register(self, owner: str, keys: Iterable[ObjectKey]) -> None:
        """``owner`` now references exactly ``keys``: watches start for new objects and stop
        for objects nobody references any more."""
        wanted = frozenset(keys)
        cancel: list[Reflector] = []
        with self._lock:
            if self._closed:
                return
            before = self._owned.get(owner, frozenset())
            if wanted:
                self._owned[owner] = wanted
            else:
                self._owned.pop(owner, None)
            for key in wanted - before:
                item = self._items.get(key)
                if item is None:
                    item = self._items[key] = _Item(key)
                    self._start(item)
                item.owners.add(owner)
            for key in before - wanted:
                cancel.extend(self._release(key, owner))
        for reflector in cancel:  # not waited for: the caller may be a busy loop
            reflector.cancel()

    def unregister(self, owner: str) -> None:
        self.register(owner, ())

    def watched(self) -> set[ObjectKey]:
        """The objects referenced now (their watches run, unless immutable)."""
        with self._lock:
            return set(self._items)

    def _release(self, key: ObjectKey, owner: str) -> list[Reflector]:
        item = self._items.get(key)
        if item is None:
            return []
        item.owners.discard(owner)
        if item.owners:
            return []
        del self._items[key]
        return [item.reflector] if item.reflector is not None else []

    def _start(self, item: _Item) -> None:
        resource, namespace, name = item.key
        item.reflector = Reflector(
            self.conn, f"/api/v1/namespaces/{namespace}/{resource}",
            {"fieldSelector": f"metadata.name={name}"}, _Sink(self, item),
            watch_timeout=self.watch_timeout, max_delay=self.max_delay)
        item.reflector.start()

    # --- reads ---
    def get(self, key: ObjectKey) -> Obj | None:
        with self._lock:
            item = self._items.get(key)
        if item is None:
            raise NotRegistered(f"{key[0]} {key[1]}/{key[2]} is not referenced by any pod")
        if not item.synced.wait(self.sync_timeout):
            raise NotSynced(f"{key[0]} {key[1]}/{key[2]} not read from the API server yet"
                            + (f" ({item.error})" if item.error else ""))
        return item.value

    # --- the watches' side ---
    def _store(self, item: _Item, obj: Obj | None) -> None:
        before, first = item.value, not item.synced.is_set()
        item.value = obj
        item.synced.set()
        if obj is not None and obj.get("immutable") is True and not item.immutable:
            item.immutable = True
            if item.reflector is not None:
                item.reflector.cancel()  # its content can never change
        if first or _content(before) == _content(obj):
            return
        with self._lock:
            owners = frozenset(item.owners) if self._items.get(item.key) is item else None
        if owners:
            self.on_change(item.key, owners)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            items = list(self._items.values())
            self._items.clear()
            self._owned.clear()
        for item in items:
            if item.reflector is not None:
                item.reflector.cancel()
        for item in items:
            if item.reflector is not None:
                item.reflector.stop()
