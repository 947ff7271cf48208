"""Webhook authentication and authorization for the main port (the kubelet's
``authentication.webhook`` and ``authorization.mode: Webhook``): the API calls and their
caches. What a request means (its attributes) is the main port's business
(``services/server/auth.py``); this module only asks the API server.

- ``WebhookAuthenticator(conn, cache_ttl, clock).authenticate(token) -> User | None``: a
  TokenReview (``authentication.k8s.io/v1``). Answers (authenticated or not) are cached
  ``cache_ttl`` (``authentication.webhook.cacheTTL``, 2 min) per token, keyed by the token's
  SHA-256; an answer that carries ``status.error`` is "not authenticated" and not cached.
- ``WebhookAuthorizer(conn, authorized_ttl, unauthorized_ttl, clock).authorize(user, attrs)
  -> Decision``: a SubjectAccessReview (``authorization.k8s.io/v1``) of resource attributes.
  Allowed answers are cached ``authorized_ttl`` (``cacheAuthorizedTTL``, 5 min), the others
  ``unauthorized_ttl`` (``cacheUnauthorizedTTL``, 30 s), keyed by the whole review spec.
- Both raise ``ReviewFailed`` when no answer could be had (the API server unreachable, or an
  error status): nothing is cached then, so the next request asks again; the caller fails
  closed (401 / 403).

As the kubelet (client-go's ``webhook`` authenticator/authorizer), nothing is retried inside a
request. Thread-safe; the clock (monotonic seconds) is injected.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from podvisor.services.apiserver.client import ApiConnection, ApiError, ApiUnreachable

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
CACHE_MAX = 10000  # entries; expired ones are dropped when it is reached


class ReviewFailed(Exception):
    """The API server gave no usable answer to a review (nothing was cached)."""


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Attributes:
    """The resource attributes of a SubjectAccessReview."""

    verb: str
    resource: str
    subresource: str = ""
    name: str = ""
    namespace: str = ""
    group: str = ""
    version: str = "v1"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


@dataclass
class _Cache:
    clock: Callable[[], float]
    entries: dict[str, tuple[float, object]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: str) -> tuple[bool, object]:
        with self.lock:
            hit = self.entries.get(key)
            if hit is None:
                return False, None
            if hit[0] <= self.clock():
                del self.entries[key]
                return False, None
            return True, hit[1]

    def put(self, key: str, value: object, ttl: float) -> None:
        if ttl <= 0:
            return
        with self.lock:
            now = self.clock()
            if len(self.entries) >= CACHE_MAX:
                self.entries = {k: v for k, v in self.entries.items() if v[0] > now}
                if len(self.entries) >= CACHE_MAX:  # all alive: drop the oldest half
                    keep = sorted(self.entries.items(), key=lambda kv: kv[1][0])
                    self.entries = dict(keep[len(keep) // 2:])
            self.entries[key] = (now + ttl, value)


def _review(conn: ApiConnection, path: str, body: dict[str, object]) -> dict[str, object]:
    try:
        answer = conn.request("POST", path, body=body)
    except (ApiError, ApiUnreachable) as exc:
        raise ReviewFailed(str(exc)) from None
    status = answer.get("status")
    return status if isinstance(status, dict) else {}


class WebhookAuthenticator:
    def __init__(self, conn: ApiConnection, cache_ttl: float,
                 clock: Callable[[], float]) -> None:
        self.conn = conn
        self.cache_ttl = cache_ttl
        self._cache = _Cache(clock)

    def authenticate(self, token: str) -> User | None:
        """The token's user, or None when the API server says it is not authenticated;
        raises ``ReviewFailed``."""
        if not token:
            return None
        key = hashlib.sha256(token.encode()).hexdigest()
        hit, value = self._cache.get(key)
        if hit:
            return value if isinstance(value, User) else None
        status = _review(self.conn, TOKEN_REVIEWS, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token}})
        if not status.get("authenticated"):
            if not status.get("error"):  # an error is not cached: asked again next time
                self._cache.put(key, None, self.cache_ttl)
            return None
        u = status.get("user")
        u = u if isinstance(u, dict) else {}
        extra = u.get("extra")
        extra = extra if isinstance(extra, dict) else {}
        user = User(str(u.get("username", "")), str(u.get("uid", "")),
                    tuple(str(g) for g in u.get("groups") or []),
                    tuple((str(k), tuple(str(x) for x in v or []))
                          for k, v in sorted(extra.items())))
        self._cache.put(key, user, self.cache_ttl)
        return user


class WebhookAuthorizer:
    def __init__(self, conn: ApiConnection, authorized_ttl: float, unauthorized_ttl: float,
                 clock: Callable[[], float]) -> None:
        self.conn = conn
        self.authorized_ttl = authorized_ttl
        self.unauthorized_ttl = unauthorized_ttl
        self._cache = _Cache(clock)

    def authorize(self, user: User, attrs: Attributes) -> Decision:
        """Allowed only when the review says ``allowed`` (a denial or no opinion is not);
        raises ``ReviewFailed``."""
        resource = {"verb": attrs.verb, "resource": attrs.resource, "group": attrs.group,
                    "version": attrs.version}
        for field_name, text in (("subresource", attrs.subresource), ("name", attrs.name),
                                 ("namespace", attrs.namespace)):
            if text:
                resource[field_name] = text
        spec: dict[str, object] = {"user": user.name, "groups": list(user.groups),
                                   "resourceAttributes": resource}
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        cache_key = json.dumps(spec, sort_keys=True)
        hit, value = self._cache.get(cache_key)
        if hit and isinstance(value, Decision):
            return value
        status = _review(self.conn, ACCESS_REVIEWS, {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": spec})
        decision = Decision(bool(status.get("allowed")) and not status.get("denied"),
                            str(status.get("reason") or status.get("evaluationError") or ""))
        self._cache.put(cache_key, decision, self.authorized_ttl if decision.allowed
                        else self.unauthorized_ttl)
        return decision
