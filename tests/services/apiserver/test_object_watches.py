"""ConfigMaps/Secrets through per-object watches (``ObjectWatches``, the kubelet's ``Watch``
strategy) against the stand-in API server with the real client: one watch per referenced
object (``fieldSelector=metadata.name``), started by the first pod that references it and
stopped when none does; an update reaches the owners through the watch with no GET of the
object (no polling); an immutable object's watch stops once read; a watch that cannot list
makes reads fail (``OSError``) until it does. ``ApiObjects``: the Cache strategy GETs per TTL,
the Watch strategy never GETs."""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from podvisor.services.apiserver import (
    ApiConnection,
    NotRegistered,
    NotSynced,
    ObjectKey,
    ObjectWatches,
)
from podvisor.services.pod import pod_from_dict
from podvisor.services.syncloop.apiobjects import ApiObjects, object_refs
from tests.support.kubeapi import KubeApi

CM = "/api/v1/namespaces/default/configmaps"
APP: ObjectKey = ("configmaps", "default", "app")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=0.5)
    server.start()
    yield server
    server.stop()


def connect(api: KubeApi, tmp_path: Path) -> ApiConnection:
    return ApiConnection(str(api.kubeconfig(tmp_path / "kc", user="system:node:n1",
                                            groups=("system:nodes",))))


def object_gets(api: KubeApi, name: str) -> int:
    return api.count("GET", f"{CM}/{name}") + api.count("GET", f"secrets/{name}")


def test_a_watch_per_object_from_first_reference_to_last(api: KubeApi, tmp_path: Path,
                                                         wait_for: Callable[..., Any]) -> None:
    api.store.create("configmaps", "default", {"metadata": {"name": "app"},
                                               "data": {"key": "v1"}})
    changes: list[tuple[ObjectKey, frozenset[str]]] = []
    changed = threading.Event()

    def on_change(key: ObjectKey, owners: frozenset[str]) -> None:
        changes.append((key, owners))
        changed.set()

    watches = ObjectWatches(connect(api, tmp_path), on_change=on_change, sync_timeout=10)
    try:
        base = len(api.store.watchers)
        watches.register("pod-a", [APP, ("secrets", "default", "missing")])
        watches.register("pod-b", [APP])
        assert watches.get(APP)["data"] == {"key": "v1"}  # type: ignore[index]
        assert watches.get(("secrets", "default", "missing")) is None  # does not exist
        wait_for(lambda: len(api.store.watchers) == base + 2, timeout=10,
                 message="one watch per object, however many pods reference it")
        lists = [r for r in api.requests if r.method == "GET" and r.path == CM]
        assert lists and all(r.query == "fieldSelector=metadata.name%3Dapp" for r in lists)
        with pytest.raises(NotRegistered):
            watches.get(("configmaps", "default", "other"))

        api.store.update("configmaps", "default", "app",
                         lambda cm: {**cm, "data": {"key": "v2"}})
        assert changed.wait(10)
        assert changes == [(APP, frozenset({"pod-a", "pod-b"}))]
        assert watches.get(APP)["data"] == {"key": "v2"}  # type: ignore[index]
        assert object_gets(api, "app") == 0  # through the watch: never polled

        watches.register("pod-a", [APP])  # pod-a no longer references the secret
        wait_for(lambda: len(api.store.watchers) == base + 1, timeout=10,
                 message="the unreferenced object's watch stopped")
        watches.unregister("pod-a")
        assert watches.watched() == {APP}  # pod-b still references it
        watches.unregister("pod-b")
        assert watches.watched() == set()
        wait_for(lambda: len(api.store.watchers) == base, timeout=10,
                 message="no watch once no pod references the object")
    finally:
        watches.close()


def test_immutable_object_is_not_watched_after_read(api: KubeApi, tmp_path: Path,
                                                    wait_for: Callable[..., Any]) -> None:
    api.store.create("configmaps", "default", {"metadata": {"name": "frozen"},
                                               "data": {"k": "v"}, "immutable": True})
    watches = ObjectWatches(connect(api, tmp_path), sync_timeout=10)
    try:
        base = len(api.store.watchers)
        key: ObjectKey = ("configmaps", "default", "frozen")
        watches.register("pod", [key])
        assert watches.get(key)["data"] == {"k": "v"}  # type: ignore[index]
        wait_for(lambda: len(api.store.watchers) == base, timeout=10,
                 message="the immutable object's watch stopped")
        assert watches.get(key)["data"] == {"k": "v"}  # type: ignore[index]
    finally:
        watches.close()


def test_unreachable_before_the_first_list_fails_reads(api: KubeApi, tmp_path: Path) -> None:
    conn = connect(api, tmp_path)
    api.stop()
    watches = ObjectWatches(conn, sync_timeout=0.2, max_delay=0.5)
    try:
        watches.register("pod", [APP])
        with pytest.raises(NotSynced) as err:
            watches.get(APP)
        assert isinstance(err.value, OSError)
    finally:
        watches.close()


def api_pod(uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": uid}, "spec": {
        "volumes": [{"name": "v", "configMap": {"name": "app"}},
                    {"name": "s", "projected": {"sources": [
                        {"secret": {"name": "creds"}}, {"configMap": {"name": "extra"}}]}}],
        "containers": [{"name": "c", "image": "busybox", "envFrom": [
            {"secretRef": {"name": "env-secret"}}], "env": [
            {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "a"}}}]}]}}


def test_api_objects_strategies(api: KubeApi, tmp_path: Path) -> None:
    pod = pod_from_dict(api_pod("u1"), "api", api_objects=True).pod
    assert object_refs(pod) == {
        ("configmaps", "default", "app"), ("secrets", "default", "creds"),
        ("configmaps", "default", "extra"), ("secrets", "default", "env-secret"),
        ("configmaps", "default", "env-cm")}
    api.store.create("configmaps", "default", {"metadata": {"name": "app"},
                                               "data": {"key": "v1"}})
    api.store.create("secrets", "default", {"metadata": {"name": "creds"}, "data": {
        "pw": base64.b64encode(b"s3cret").decode()}})
    now = [1000.0]
    cache = ApiObjects(connect(api, tmp_path), 10.0, lambda: now[0], lambda: now[0],
                       strategy="Cache")
    assert cache.data("configmap", "default", "app") == {"key": b"v1"}
    assert cache.data("configmap", "default", "app") == {"key": b"v1"}
    assert object_gets(api, "app") == 1  # within the TTL: from memory
    now[0] += 11
    cache.data("configmap", "default", "app")
    assert object_gets(api, "app") == 2

    watch = ApiObjects(connect(api, tmp_path), 10.0, lambda: now[0], lambda: now[0],
                       strategy="Watch")
    try:
        triggered: list[frozenset[str]] = []
        got = threading.Event()

        def changed(uids: frozenset[str]) -> None:
            triggered.append(uids)
            got.set()

        watch.on_pods_changed = changed
        watch.register_pod(pod)
        assert watch.data("secret", "default", "creds") == {"pw": b"s3cret"}
        assert watch.data("configmap", "default", "extra") is None
        # the app watch has listed (a read waits for it): the update below is a watch event,
        # not part of the first list
        assert watch.data("configmap", "default", "app") == {"key": b"v1"}
        api.store.update("configmaps", "default", "app",
                         lambda cm: {**cm, "data": {"key": "v2"}})
        assert got.wait(10) and triggered == [frozenset({"u1"})]
        assert watch.data("configmap", "default", "app") == {"key": b"v2"}
        assert object_gets(api, "app") == 2 and object_gets(api, "creds") == 0
        watch.unregister_pod("u1")
        assert watch.watches is not None and watch.watches.watched() == set()
    finally:
        watch.close()
