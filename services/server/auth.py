"""Authentication and authorization of the main port, as the kubelet does them.

Authentication, in order: a bearer token (``Authorization: Bearer T``) looked up in
``authentication.tokenFile`` (kube-apiserver's static token CSV: ``token,user,uid,"g1,g2"``);
a client certificate verified against ``authentication.x509.clientCAFile`` (user = its CN,
groups = its Os); else ``system:anonymous`` when ``authentication.anonymous.enabled``. A token
that is presented but unknown is a 401 even when anonymous requests are allowed (as the API
server does). Authorization: ``AlwaysAllow`` (``Webhook`` is rejected at config load until the
API server issue lands); the request's attributes are computed as the kubelet's
(``verb`` from the method, resource ``nodes``, subresource ``stats``/``metrics``/``log``/
``proxy`` from the path) so a SubjectAccessReview can use them later.
"""

from __future__ import annotations

import csv
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = ["ANONYMOUS", "AlwaysAllow", "Attributes", "Authenticator", "Authorizer",
           "TokenFileError", "User", "attributes", "load_token_file", "user_from_cert"]


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = field(default_factory=tuple)


ANONYMOUS = User("system:anonymous", groups=("system:unauthenticated",))


class TokenFileError(Exception):
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
    def __init__(self, tokens: Mapping[str, User], anonymous: bool) -> None:
        self._tokens = dict(tokens)
        self._anonymous = anonymous

    def authenticate(self, authorization: str | None,
                     peercert: Mapping[str, Any] | None) -> tuple[User | None, str]:
        """(user, "") or (None, why) for a 401."""
        if authorization:
            scheme, _, token = authorization.partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                return None, "unsupported Authorization header (use Bearer TOKEN)"
            user = self._lookup(token)
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
    return User(user.name, user.uid, (*user.groups, "system:authenticated"))


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
_SUBRESOURCES = (("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log"),
                 ("/containerLogs", "proxy"), ("/configz", "proxy"))


def attributes(method: str, path: str, node_name: str) -> Attributes:
    sub = "proxy"
    for prefix, name in _SUBRESOURCES:
        if path == prefix or path.startswith(prefix + "/"):
            sub = name
            break
    return Attributes(_VERBS.get(method.upper(), method.lower()), "nodes", sub, node_name, path)


class Authorizer(Protocol):
    def authorize(self, user: User, attrs: Attributes) -> tuple[bool, str]: ...


class AlwaysAllow:
    def authorize(self, user: User, attrs: Attributes) -> tuple[bool, str]:
        return True, ""
