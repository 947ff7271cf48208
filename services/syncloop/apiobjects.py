"""API objects for API pods' env and volumes: ConfigMaps, Secrets and service account tokens.

ConfigMaps and Secrets follow ``configMapAndSecretChangeDetectionStrategy`` (the kubelet's):

- ``Watch`` (the default): ``register_pod(pod)`` (the sync loop, when a pod arrives or changes)
  starts one watch per object the pod references (``ObjectWatches``: list + watch with
  ``fieldSelector=metadata.name=<name>``), ``unregister_pod(uid)`` (when it is gone) stops the
  watches nobody references; reads come from the watches' copies, nothing is polled. A change
  calls ``on_pods_changed(uids)`` with the pods referencing the object, so the sync loop syncs
  them now and their volumes follow (``..data`` swap) without waiting for ``syncFrequency``.
  A watch that has not listed yet is waited for 1 s, then the read fails (``OSError``) and
  the pod retries; an object read through a watch is served through an outage.
- ``Cache``: a read within ``apiObjectCacheTTL`` is served from memory, a later one GETs again.
- ``Get``: every read GETs.
With ``Cache``/``Get``, and for a key no pod registered, when the server cannot be reached the
last value read is served (a pod keeps starting and its files keep their content through an
outage), and with none an ``OSError`` says why. Tokens come from the TokenRequest API
(``serviceaccounts/<sa>/token``, bound to the pod) and are requested again once 80 % of their
life has passed, as the kubelet's token manager does. Thread-safe (pod worker threads).

``volume_files(pod, volume, objects, node)`` makes the files of a ``configMap``, ``secret`` or
``projected`` volume: path -> (bytes, mode), written by ``atomic_writer`` (the ``..data``
symlink swap, so an update reaches a mounted volume atomically).
"""

from __future__ import annotations

import base64
import datetime as dt
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from podvisor.services.apiserver import (
    ApiConnection,
    ApiError,
    ApiUnreachable,
    NotRegistered,
    ObjectKey,
    ObjectWatches,
)
from podvisor.services.pod import ApiVolume, NodeFacts, Pod, projected_downward_files

DEFAULT_MODE = 0o644
TOKEN_REFRESH = 0.8


STRATEGIES = ("Watch", "Cache", "Get")


def _resource(kind: str) -> str:
    return "configmaps" if kind == "configmap" else "secrets"


# a pull Secret's type, kept beside its data under a key no Secret can have (keys are
# [-._a-zA-Z0-9]+): the kubelet uses a pull Secret only when its type says what it holds
_TYPE_KEY = "\0type"


def object_refs(pod: Pod) -> set[ObjectKey]:
    """The ConfigMaps and Secrets a pod references: env (``configMapKeyRef``,
    ``secretKeyRef``), ``envFrom``, ``configMap``/``secret`` volumes and ``projected`` sources."""
    ns = pod.namespace
    refs: set[ObjectKey] = set()
    for c in pod.all_containers():
        for source in c.env_from:
            refs.add((_resource("configmap" if source.kind == "configMapRef" else "secret"),
                      ns, source.name))
        for var in c.env:  # an ApiKeyRef (the pod package's front door does not export it)
            ref_kind = getattr(var.value_from, "kind", "")
            if ref_kind in ("configMapKeyRef", "secretKeyRef"):
                kind = "configmap" if ref_kind == "configMapKeyRef" else "secret"
                refs.add((_resource(kind), ns, str(getattr(var.value_from, "name", ""))))
    for name in pod.spec.image_pull_secrets:
        if name:
            refs.add(("secrets", ns, name))
    for v in pod.spec.volumes:
        if not isinstance(v.source, ApiVolume):
            continue
        spec = v.source.spec
        if v.source.kind == "configMap":
            refs.add(("configmaps", ns, str(spec["name"])))
        elif v.source.kind == "secret":
            refs.add(("secrets", ns, str(spec["secretName"])))
        else:
            for source in spec.get("sources") or []:
                if "configMap" in source:
                    refs.add(("configmaps", ns, str(source["configMap"]["name"])))
                elif "secret" in source:
                    refs.add(("secrets", ns, str(source["secret"]["name"])))
    return refs


class ApiObjects:
    def __init__(self, conn: ApiConnection, ttl: float,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, strategy: str = "Cache",
                 watch_timeout: float = 300.0, max_delay: float = 30.0) -> None:
        """``strategy``: ``Watch``, ``Cache`` (``ttl``) or ``Get`` (see the module's doc)."""
        self.conn = conn
        self.ttl = ttl if strategy == "Cache" else 0.0
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str, str], tuple[float, Mapping[str, bytes] | None]] = {}
        self._tokens: dict[tuple[str, ...], tuple[float, str]] = {}
        # the sync loop's: sync these pods now (called on a watch's thread)
        self.on_pods_changed: Callable[[frozenset[str]], None] = lambda uids: None
        self.watches = (ObjectWatches(conn, on_change=self._changed,
                                      watch_timeout=watch_timeout, max_delay=max_delay)
                        if strategy == "Watch" else None)

    def register_pod(self, pod: Pod) -> None:
        """The pod (new or changed) references these objects now (Watch: their watches)."""
        if self.watches is not None:
            self.watches.register(pod.uid, object_refs(pod))

    def unregister_pod(self, uid: str) -> None:
        if self.watches is not None:
            self.watches.unregister(uid)

    def _changed(self, key: ObjectKey, owners: frozenset[str]) -> None:
        self.on_pods_changed(owners)

    def close(self) -> None:
        if self.watches is not None:
            self.watches.close()

    def data(self, kind: str, namespace: str, name: str) -> Mapping[str, bytes] | None:
        if self.watches is not None:
            try:
                obj = self.watches.get((_resource(kind), namespace, name))
            except NotRegistered:
                pass  # read directly (below): no pod registered it
            else:
                return None if obj is None else _decode(kind, obj)
        key = (kind, namespace, name)
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        resource = _resource(kind)
        try:
            obj = self.conn.request("GET", f"/api/v1/namespaces/{namespace}/{resource}/{name}")
        except ApiUnreachable as err:
            if hit is not None:
                return hit[1]
            raise OSError(f"the API server is unreachable: {err}") from None
        except ApiError as err:
            if err.status != 404:
                if hit is not None:
                    return hit[1]
                raise OSError(str(err)) from None
            value: Mapping[str, bytes] | None = None
        else:
            value = _decode(kind, obj)
        with self._lock:
            self._cache[key] = (now, value)
        return value

    def pull_secret(self, namespace: str, name: str) -> tuple[str, Mapping[str, bytes]] | None:
        """An image pull Secret's type and data (None: there is no such Secret). Raises
        ``OSError`` when it cannot be read."""
        data = self.data("pullsecret", namespace, name)
        if data is None:
            return None
        return data.get(_TYPE_KEY, b"").decode(), {k: v for k, v in data.items()
                                                  if k != _TYPE_KEY}

    def token(self, namespace: str, account: str, audience: str, seconds: int,
              pod: Pod) -> str:
        key = (namespace, account, audience, str(seconds), pod.uid)
        now = self._wall()
        with self._lock:
            hit = self._tokens.get(key)
        if hit is not None and now < hit[0]:
            return hit[1]
        spec: dict[str, Any] = {"expirationSeconds": seconds, "boundObjectRef": {
            "apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}}
        if audience:
            spec["audiences"] = [audience]
        try:
            answer = self.conn.request(
                "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                      "spec": spec})
        except (ApiError, ApiUnreachable) as err:
            if hit is not None:
                return hit[1]  # an expiring token beats none while the server is away
            raise OSError(f"requesting a token for {namespace}/{account}: {err}") from None
        status = answer.get("status")  # the TokenRequest's status
        if not isinstance(status, Mapping):
            status = {}
        token = str(status.get("token", ""))
        expires = _parse_time(str(status.get("expirationTimestamp", "")), now + seconds)
        with self._lock:
            self._tokens[key] = (now + TOKEN_REFRESH * (expires - now), token)
        return token


def _decode(kind: str, obj: Mapping[str, Any]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    if kind == "configmap":
        for k, v in (obj.get("data") or {}).items():
            out[k] = str(v).encode()
        for k, v in (obj.get("binaryData") or {}).items():
            out[k] = base64.b64decode(v)
    else:
        for k, v in (obj.get("data") or {}).items():
            out[k] = base64.b64decode(v)
        for k, v in (obj.get("stringData") or {}).items():
            out[k] = str(v).encode()
        if kind == "pullsecret":
            out[_TYPE_KEY] = str(obj.get("type") or "").encode()
    return out


def _parse_time(text: str, default: float) -> float:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def _keyed(data: Mapping[str, bytes] | None, src: Mapping[str, Any], mode: int, what: str,
           ) -> dict[str, tuple[bytes, int]]:
    optional = bool(src.get("optional"))
    if data is None:
        if optional:
            return {}
        raise ValueError(f'{what} not found')
    items = src.get("items") or []
    if not items:
        return {k: (v, mode) for k, v in data.items()}
    out = {}
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise ValueError(f"{what}: no key {item['key']!r}")
        out[item["path"]] = (data[item["key"]], int(item.get("mode", mode)))
    return out


def volume_files(pod: Pod, volume: ApiVolume, objects: ApiObjects,
                 node: NodeFacts) -> dict[str, tuple[bytes, int]]:
    """The files of one API-backed volume. Raises ValueError/OSError (the volume's error)."""
    spec = volume.spec
    mode = int(spec.get("defaultMode", DEFAULT_MODE))
    if volume.kind == "configMap":
        return _keyed(objects.data("configmap", pod.namespace, spec["name"]), spec, mode,
                      f'configmap "{spec["name"]}"')
    if volume.kind == "secret":
        return _keyed(objects.data("secret", pod.namespace, spec["secretName"]), spec, mode,
                      f'secret "{spec["secretName"]}"')
    out: dict[str, tuple[bytes, int]] = {}
    for source in spec.get("sources") or []:
        if "configMap" in source:
            src = source["configMap"]
            out.update(_keyed(objects.data("configmap", pod.namespace, src["name"]), src, mode,
                              f'configmap "{src["name"]}"'))
        elif "secret" in source:
            src = source["secret"]
            out.update(_keyed(objects.data("secret", pod.namespace, src["name"]), src, mode,
                              f'secret "{src["name"]}"'))
        elif "downwardAPI" in source:
            out.update(projected_downward_files(pod, source["downwardAPI"], mode, node))
        elif "serviceAccountToken" in source:
            src = source["serviceAccountToken"]
            token = objects.token(pod.namespace, pod.spec.service_account_name or "default",
                                  str(src.get("audience", "")),
                                  int(src.get("expirationSeconds", 3600)), pod)
            out[src["path"]] = (token.encode(), mode)
    return out
