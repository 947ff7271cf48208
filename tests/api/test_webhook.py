"""Webhook authentication/authorization (TokenReview, SubjectAccessReview) against the stand-in
API server through the real client: the kubelet's caching (answers per TTL on the injected
clock; an unknown token, which kube-apiserver reports with ``status.error``, is not cached),
``ReviewFailed`` (nothing cached) when the server is away, and the stand-in's validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from podvisor.services.apiserver import (
    ApiConnection,
    ApiError,
    Attributes,
    ReviewFailed,
    User,
    WebhookAuthenticator,
    WebhookAuthorizer,
)
from tests.kubeapi import KubeApi


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_token_review_and_access_review_cached_and_failing(tmp_path: Path) -> None:
    api = KubeApi(tmp_path / "kubeapi")
    api.start()
    try:
        conn = ApiConnection(str(api.kubeconfig(tmp_path / "kc", user="system:node:n1",
                                                groups=("system:nodes",))))
        api.tokens["alice-token"] = ("alice", ["devs"])
        clock = Clock()
        authn = WebhookAuthenticator(conn, cache_ttl=120, clock=clock)
        assert authn.authenticate("alice-token") == User(
            "alice", "", ("devs", "system:authenticated"))
        reviews = api.count("POST", "/tokenreviews")
        assert authn.authenticate("alice-token") is not None
        assert api.count("POST", "/tokenreviews") == reviews  # cached
        assert authn.authenticate("nope") is None
        assert authn.authenticate("nope") is None
        assert api.count("POST", "/tokenreviews") == reviews + 2  # an error answer: not cached
        clock.now += 121
        authn.authenticate("alice-token")
        assert api.count("POST", "/tokenreviews") == reviews + 3  # expired after cacheTTL

        seen: list[dict[str, Any]] = []

        def policy(spec: dict[str, Any]) -> bool:
            seen.append(spec)
            return spec["user"] == "alice" and spec["resourceAttributes"]["subresource"] == \
                "log"

        api.authorize = policy
        authz = WebhookAuthorizer(conn, authorized_ttl=300, unauthorized_ttl=30, clock=clock)
        alice = User("alice", groups=("devs",))
        logs = Attributes("get", "nodes", "log", "n1")
        assert authz.authorize(alice, logs).allowed
        exec_ = Attributes("create", "nodes", "proxy", "n1")
        denied = authz.authorize(alice, exec_)
        assert not denied.allowed and denied.reason
        assert seen[-1]["resourceAttributes"] == {
            "verb": "create", "resource": "nodes", "subresource": "proxy", "name": "n1",
            "group": "", "version": "v1"}
        n = len(seen)
        authz.authorize(alice, logs)
        authz.authorize(alice, exec_)
        assert len(seen) == n  # both cached
        clock.now += 31
        authz.authorize(alice, logs)
        authz.authorize(alice, exec_)
        assert len(seen) == n + 1  # the denial expired (30 s), the allowance did not (5 min)
        api.stop()
        clock.now += 400
        with pytest.raises(ReviewFailed):
            authn.authenticate("alice-token")
        with pytest.raises(ReviewFailed):
            authz.authorize(alice, logs)
        api.start()
        assert authz.authorize(alice, logs).allowed  # the failure was not cached

        # the stand-in validates reviews as kube-apiserver does
        with pytest.raises(ApiError) as err:
            conn.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                         body={"spec": {}})
        assert err.value.status == 400
        with pytest.raises(ApiError) as err:
            conn.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                         body={"spec": {"user": "a"}})
        assert err.value.status == 422
    finally:
        api.stop()
