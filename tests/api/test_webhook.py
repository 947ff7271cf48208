"""Webhook authentication/authorization (TokenReview, SubjectAccessReview) against the stand-in
API server through the real client; caching per TTL, failing closed when the server is away."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from podvisor.services.apiserver import (
    ApiConnection,
    User,
    WebhookAuthenticator,
    WebhookAuthorizer,
    request_attributes,
)
from tests.kubeapi import KubeApi


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_token_review_and_access_review_cached_and_fail_closed(tmp_path: Path) -> None:
    api = KubeApi(tmp_path / "kubeapi")
    api.start()
    try:
        conn = ApiConnection(str(api.kubeconfig(tmp_path / "kc", user="system:node:n1",
                                                groups=("system:nodes",))))
        api.tokens["alice-token"] = ("alice", ["devs"])
        clock = Clock()
        authn = WebhookAuthenticator(conn, cache_ttl=120, clock=clock)
        assert authn.authenticate("alice-token") == User("alice", "", ("devs",))
        assert authn.authenticate("nope") is None
        reviews = api.count("POST", "/tokenreviews")
        assert authn.authenticate("alice-token") is not None
        assert authn.authenticate("nope") is None
        assert api.count("POST", "/tokenreviews") == reviews  # both answers cached
        clock.now += 121
        authn.authenticate("alice-token")
        assert api.count("POST", "/tokenreviews") == reviews + 1

        seen: list[dict[str, Any]] = []

        def policy(spec: dict[str, Any]) -> bool:
            seen.append(spec)
            return spec["user"] == "alice" and spec["resourceAttributes"]["subresource"] == \
                "log"

        api.authorize = policy
        authz = WebhookAuthorizer(conn, authorized_ttl=300, unauthorized_ttl=30, clock=clock)
        alice = User("alice", groups=("devs",))
        attrs = request_attributes("GET", "/logs/x", "n1")
        assert attrs.verb == "get" and attrs.subresource == "log" and attrs.name == "n1"
        assert authz.authorize(alice, attrs).allowed
        denied = authz.authorize(alice, request_attributes("POST", "/exec/ns/p/c", "n1"))
        assert not denied.allowed and denied.reason
        assert seen[-1]["resourceAttributes"] == {
            "verb": "create", "resource": "nodes", "subresource": "proxy", "name": "n1",
            "group": "", "version": "v1"}
        n = len(seen)
        authz.authorize(alice, attrs)
        assert len(seen) == n  # allowed: cached 5 min
        api.stop()
        clock.now += 400
        assert authn.authenticate("alice-token") is None  # unreachable: fail closed
        assert not authz.authorize(alice, attrs).allowed
    finally:
        api.stop()
