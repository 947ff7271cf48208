"""Webhook authentication and authorization for the main port (the kubelet's
``authentication.webhook`` and ``authorization.mode: Webhook``), for the main port's server to
call; it owns the config keys (issue 13: ``authentication.webhook.{enabled,cacheTTL}``,
``authorization.webhook.{cacheAuthorizedTTL,cacheUnauthorizedTTL}``).

- ``WebhookAuthenticator(conn, cache_ttl).authenticate(token) -> User | None``: a TokenReview
  at the API server; answers (yes and no) are cached ``cache_ttl`` (2 min) per token.
- ``WebhookAuthorizer(conn, authorized_ttl, unauthorized_ttl).authorize(user, attrs)
  -> Decision``: a SubjectAccessReview; allowed answers cached 5 min, denials 30 s.
- ``request_attributes(method, path, node) -> Attributes``: the kubelet's mapping of a request
  to resource attributes (``server/auth.go``): verb from the method (GET get, POST create, PUT
  update, PATCH patch, DELETE delete), resource ``nodes``, name = the node, subresource by path
  (``/stats`` stats, ``/metrics`` metrics, ``/logs`` log, ``/spec`` spec, ``/checkpoint``
  checkpoint, ``/configz`` configz, ``/healthz`` healthz, ``/pods`` pods, anything else
  proxy).
An unreachable API server or an error answer is "not authenticated" / "not allowed" (never
cached), so the port fails closed. Thread-safe; the clock is injected.

Use (the main port's handler)::

    authn = WebhookAuthenticator(ApiConnection(kubeconfig), cache_ttl=cfg.webhook_cache_ttl)
    authz = WebhookAuthorizer(conn, cfg.webhook_cache_authorized_ttl,
                              cfg.webhook_cache_unauthorized_ttl)
    user = authn.authenticate(bearer_token)           # None -> 401
    decision = authz.authorize(user, request_attributes(method, path, node_name))
    if not decision.allowed: ...                      # 403 with decision.reason
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from podvisor.services.apiserver.client import ApiConnection, ApiError, ApiUnreachable


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Attributes:
    verb: str
    resource: str = "nodes"
    subresource: str = "proxy"
    name: str = ""
    api_group: str = ""
    api_version: str = "v1"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
         "DELETE": "delete"}
SUBRESOURCES = (("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log"),
                ("/spec", "spec"), ("/checkpoint", "checkpoint"), ("/configz", "configz"),
                ("/healthz", "healthz"), ("/pods", "pods"))


def request_attributes(method: str, path: str, node: str) -> Attributes:
    sub = "proxy"
    for prefix, name in SUBRESOURCES:
        if path == prefix or path.startswith(prefix + "/"):
            sub = name
            break
    return Attributes(VERBS.get(method.upper(), method.lower()), "nodes", sub, node)


@dataclass
class _Cache:
    clock: Callable[[], float]
    entries: dict[str, tuple[float, object]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: str) -> object | None:
        with self.lock:
            hit = self.entries.get(key)
            if hit is None or hit[0] <= self.clock():
                self.entries.pop(key, None)
                return None
            return hit[1]

    def put(self, key: str, value: object, ttl: float) -> None:
        if ttl <= 0:
            return
        with self.lock:
            if len(self.entries) > 10000:
                now = self.clock()
                self.entries = {k: v for k, v in self.entries.items() if v[0] > now}
            self.entries[key] = (self.clock() + ttl, value)


_NO = object()


class WebhookAuthenticator:
    def __init__(self, conn: ApiConnection, cache_ttl: float = 120.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.conn = conn
        self.cache_ttl = cache_ttl
        self._cache = _Cache(clock)

    def authenticate(self, token: str) -> User | None:
        if not token:
            return None
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._cache.get(key)
        if hit is not None:
            return None if hit is _NO else hit  # type: ignore[return-value]
        try:
            answer = self.conn.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                                       body={"apiVersion": "authentication.k8s.io/v1",
                                             "kind": "TokenReview",
                                             "spec": {"token": token}})
        except (ApiError, ApiUnreachable):
            return None  # fail closed, not cached
        status = answer.get("status") or {}
        user: User | None = None
        if status.get("authenticated"):
            u = status.get("user") or {}
            user = User(str(u.get("username", "")), str(u.get("uid", "")),
                        tuple(str(g) for g in u.get("groups") or []),
                        tuple((str(k), tuple(str(x) for x in v))
                              for k, v in sorted((u.get("extra") or {}).items())))
        self._cache.put(key, user if user is not None else _NO, self.cache_ttl)
        return user


class WebhookAuthorizer:
    def __init__(self, conn: ApiConnection, authorized_ttl: float = 300.0,
                 unauthorized_ttl: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.conn = conn
        self.authorized_ttl = authorized_ttl
        self.unauthorized_ttl = unauthorized_ttl
        self._cache = _Cache(clock)

    def authorize(self, user: User, attrs: Attributes) -> Decision:
        key = repr((user, attrs))
        hit = self._cache.get(key)
        if isinstance(hit, Decision):
            return hit
        spec = {"user": user.name, "uid": user.uid, "groups": list(user.groups),
                "extra": {k: list(v) for k, v in user.extra},
                "resourceAttributes": {"verb": attrs.verb, "resource": attrs.resource,
                                       "subresource": attrs.subresource, "name": attrs.name,
                                       "group": attrs.api_group, "version": attrs.api_version}}
        try:
            answer = self.conn.request(
                "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                body={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                      "spec": spec})
        except (ApiError, ApiUnreachable) as exc:
            return Decision(False, f"authorization webhook failed: {exc}")
        status = answer.get("status") or {}
        decision = Decision(bool(status.get("allowed")) and not status.get("denied"),
                            str(status.get("reason", "")))
        self._cache.put(key, decision, self.authorized_ttl if decision.allowed
                        else self.unauthorized_ttl)
        return decision
