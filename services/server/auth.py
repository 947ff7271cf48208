"""Authentication and authorization of the main port, as the kubelet does them.

Authentication, in order: a bearer token (``Authorization: Bearer T``) looked up in
``authentication.tokenFile`` (kube-apiserver's static token CSV: ``token,user,uid,"g1,g2"``),
then, with ``authentication.webhook.enabled``, sent to the API server in a TokenReview (cached
``webhook.cacheTTL``, 2 min); a client certificate verified against
``authentication.x509.clientCAFile`` (user = its CN, groups = its Os); else
``system:anonymous`` when ``authentication.anonymous.enabled``. A token that is presented but
unknown is a 401 even when anonymous requests are allowed (as the kubelet's union of
authenticators does), and so is a token the API server could not review (unreachable: nothing
is cached, the next request asks again).

Authorization: ``AlwaysAllow``, or ``Webhook``: a SubjectAccessReview of the request's
attributes, computed as the kubelet's ``server/auth.go`` does: ``verb`` from the method (GET/HEAD
get, POST create, PUT update, PATCH patch, DELETE delete), resource ``nodes``, name = this node,
subresource ``stats``/``metrics``/``log``/``spec`` for ``/stats``, ``/metrics``, ``/logs``,
``/spec`` and their subpaths, else ``proxy``. Allowed answers are cached
``webhook.cacheAuthorizedTTL`` (5 min), the others ``cacheUnauthorizedTTL`` (30 s). When the API
server cannot be asked the request is refused with a 403 (the kubelet answers 500 there;
podvisor never answers 500 for something that is not its own bug).

The webhook client is the apiserver package's (through its front door, imported only when a
webhook mode is configured, so the server process loads the ``kubernetes`` client only then).
Its calls block, so the middleware runs them on a thread (``authenticate_async`` /
``authorize_async``); the static checks run inline.
"""

from __future__ import annotations

import asyncio
import csv
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from podvisor.common.config import Config

if TYPE_CHECKING:
    from podvisor.services.apiserver import WebhookAuthenticator, WebhookAuthorizer

__all__ = ["ANONYMOUS", "AlwaysAllow", "Attributes", "AuthConfigError", "Authenticator",
           "Authorizer", "TokenFileError", "User", "WebhookAuthz", "attributes",
           "authenticate_async", "authorize_async", "build_auth", "load_token_file",
           "user_from_cert"]


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = field(default_factory=tuple)
    # a TokenReview's user.extra (key -> values), passed on to SubjectAccessReviews
    extra: tuple[tuple[str, tuple[str, ...]], ...] = field(default_factory=tuple)


ANONYMOUS = User("system:anonymous", groups=("system:unauthenticated",))


class AuthConfigError(Exception):
    """The main port's authentication cannot be set up (the message says which file/key)."""


class TokenFileError(AuthConfigError):
    """The token file cannot be read or a line is malformed (the message names the line)."""


def load_token_file(path: Path) -> dict[str, User]:
    """Parse kube-apiserver's static token file: ``token,user,uid[,"group1,group2"]`` per line
    (CSV quoting; blank lines and lines starting with ``#`` skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"cannot read authentication.tokenFile {path}: {exc}") from None
    tokens: dict[str, User] = {}
    for lineno, row in enumerate(csv.reader(text.splitlines()), start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) < 3 or not row[0].strip() or not row[1].strip():
            raise TokenFileError(f"authentication.tokenFile {path} line {lineno}: expected "
                                 'token,user,uid[,"group1,group2"] with a token and a user')
        token = row[0].strip()
        if token in tokens:
            raise TokenFileError(f"authentication.tokenFile {path} line {lineno}: "
                                 "duplicate token")
        groups = tuple(g.strip() for g in row[3].split(",") if g.strip()) if len(row) > 3 else ()
        tokens[token] = User(row[1].strip(), row[2].strip(), groups)
    return tokens


def user_from_cert(peercert: Mapping[str, Any] | None) -> User | None:
    """User from a verified peer certificate (``ssl.SSLSocket.getpeercert()``): CN and Os."""
    if not peercert:
        return None
    name, groups = "", []
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and not name:
                name = value
            elif key == "organizationName":
                groups.append(value)
    return User(name, groups=tuple(groups)) if name else None


class Authenticator:
    """``webhook``: TokenReview of tokens the token file does not know (None: no webhook)."""

    def __init__(self, tokens: Mapping[str, User], anonymous: bool,
                 webhook: WebhookAuthenticator | None = None) -> None:
        self._tokens = dict(tokens)
        self._anonymous = anonymous
        self._webhook = webhook

    @property
    def token_count(self) -> int:
        """Tokens from the token file."""
        return len(self._tokens)

    @property
    def blocking(self) -> bool:
        """Whether ``authenticate`` may wait on the network (the webhook)."""
        return self._webhook is not None

    def authenticate(self, authorization: str | None,
                     peercert: Mapping[str, Any] | None) -> tuple[User | None, str]:
        """(user, "") or (None, why) for a 401."""
        if authorization:
            scheme, _, token = authorization.partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                return None, "unsupported Authorization header (use Bearer TOKEN)"
            user = self._lookup(token)
            if user is None and self._webhook is not None:
                from podvisor.services.apiserver import ReviewFailed
                try:
                    reviewed = self._webhook.authenticate(token)
                except ReviewFailed as exc:
                    return None, f"the token could not be reviewed by the API server: {exc}"
                if reviewed is not None:
                    user = User(reviewed.name, reviewed.uid, reviewed.groups, reviewed.extra)
            if user is None:
                return None, "invalid bearer token"
            return _authenticated(user), ""
        cert_user = user_from_cert(peercert)
        if cert_user is not None:
            return _authenticated(cert_user), ""
        if self._anonymous:
            return ANONYMOUS, ""
        return None, "no credentials (bearer token or client certificate) and anonymous " \
                     "requests are disabled"

    def _lookup(self, token: str) -> User | None:
        found = None
        for known, user in self._tokens.items():  # constant time in the token's content
            if hmac.compare_digest(known.encode(), token.encode()):
                found = user
        return found


def _authenticated(user: User) -> User:
    if "system:authenticated" in user.groups:
        return user
    return User(user.name, user.uid, (*user.groups, "system:authenticated"), user.extra)


@dataclass(frozen=True)
class Attributes:
    """What a request does, as the kubelet describes it to a SubjectAccessReview."""

    verb: str
    resource: str
    subresource: str
    name: str
    path: str


_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
          "DELETE": "delete"}
# the kubelet's statsPath, metricsPath, logsPath and specPath; every other path is "proxy"
_SUBRESOURCES = (("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log"),
                 ("/spec", "spec"))


def attributes(method: str, path: str, node_name: str) -> Attributes:
    sub = "proxy"
    for prefix, name in _SUBRESOURCES:
        if path == prefix or path.startswith(prefix + "/"):
            sub = name
            break
    return Attributes(_VERBS.get(method.upper(), method.lower()), "nodes", sub, node_name, path)


class Authorizer(Protocol):
    """``authorize`` -> (allowed, reason). An authorizer whose answer may wait on the network
    says so with a true ``blocking`` attribute (then it runs on a thread)."""

    def authorize(self, user: User, attrs: Attributes) -> tuple[bool, str]: ...


class AlwaysAllow:
    blocking = False

    def authorize(self, user: User, attrs: Attributes) -> tuple[bool, str]:
        return True, ""


class WebhookAuthz:
    """``authorization.mode: Webhook``: a SubjectAccessReview per (user, attributes), cached."""

    blocking = True

    def __init__(self, webhook: WebhookAuthorizer) -> None:
        self._webhook = webhook

    def authorize(self, user: User, attrs: Attributes) -> tuple[bool, str]:
        from podvisor.services.apiserver import Attributes as ReviewAttributes
        from podvisor.services.apiserver import ReviewFailed
        from podvisor.services.apiserver import User as ReviewUser
        try:
            decision = self._webhook.authorize(
                ReviewUser(user.name, user.uid, user.groups, user.extra),
                ReviewAttributes(attrs.verb, attrs.resource, attrs.subresource, attrs.name))
        except ReviewFailed as exc:
            return False, f"authorization error: the API server could not be asked: {exc}"
        return decision.allowed, decision.reason


async def authenticate_async(authn: Authenticator, authorization: str | None,
                             peercert: Mapping[str, Any] | None) -> tuple[User | None, str]:
    """``authn.authenticate``, on a thread when it may wait on the API server."""
    if authn.blocking and authorization:
        return await asyncio.to_thread(authn.authenticate, authorization, peercert)
    return authn.authenticate(authorization, peercert)


async def authorize_async(authz: Authorizer, user: User, attrs: Attributes,
                          ) -> tuple[bool, str]:
    """``authz.authorize``, on a thread when it may wait on the API server."""
    if getattr(authz, "blocking", False):
        return await asyncio.to_thread(authz.authorize, user, attrs)
    return authz.authorize(user, attrs)


def build_auth(config: Config, clock: Callable[[], float]) -> tuple[Authenticator, Authorizer]:
    """The main port's authenticator and authorizer from the config (``clock``: monotonic
    seconds, for the webhook caches). Raises ``AuthConfigError`` (a bad token file or
    kubeconfig)."""
    authn_cfg, authz_cfg = config.authentication, config.authorization
    tokens = load_token_file(Path(authn_cfg.token_file)) if authn_cfg.token_file else {}
    webhook_authn: WebhookAuthenticator | None = None
    authz: Authorizer = AlwaysAllow()
    if authn_cfg.webhook_enabled or authz_cfg.mode == "Webhook":
        from podvisor.services.apiserver import (
            ApiConnection,
            WebhookAuthenticator,
            WebhookAuthorizer,
        )
        try:
            conn = ApiConnection(config.kubeconfig)
        except Exception as exc:  # the kubernetes loader raises many kinds; all say the file
            raise AuthConfigError(f"cannot use kubeconfig {config.kubeconfig} for the main "
                                  f"port's webhook: {exc}") from None
        if authn_cfg.webhook_enabled:
            webhook_authn = WebhookAuthenticator(conn, authn_cfg.webhook_cache_ttl, clock)
        if authz_cfg.mode == "Webhook":
            authz = WebhookAuthz(WebhookAuthorizer(
                conn, authz_cfg.webhook_cache_authorized_ttl,
                authz_cfg.webhook_cache_unauthorized_ttl, clock))
    return Authenticator(tokens, authn_cfg.anonymous_enabled, webhook_authn), authz
