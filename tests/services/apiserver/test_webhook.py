"""Webhook authentication/authorization (TokenReview, SubjectAccessReview) against the stand-in
API server through the real client: the kubelet's caching (answers per TTL on the injected
clock; an unknown token, which kube-apiserver reports with ``status.error``, is not cached),
``ReviewFailed`` (nothing cached) when the server is away, and the stand-in's validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from podvisor.common import FakeClock
from podvisor.services.apiserver import (
    ApiConnection,
    ApiError,
    Attributes,
    ReviewFailed,
    User,
    WebhookAuthenticator,
    WebhookAuthorizer,
)
from tests.support.kubeapi import KubeApi


def test_token_review_and_access_review_cached_and_failing(tmp_path: Path) -> None:
    api = KubeApi(tmp_path / "kubeapi")
    api.start()
    try:
        conn = ApiConnection(str(api.kubeconfig(tmp_path / "kc", user="system:node:n1",
                                                groups=("system:nodes",))))
        api.tokens["alice-token"] = ("alice", ["devs"])
        clock = FakeClock(1000.0)
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

        # a bound service account token: its user.extra reaches the SubjectAccessReview
        pod = api.create_pod("default", {"metadata": {"name": "p"}, "spec": {
            "nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}})
        issued = conn.request("POST", "/api/v1/namespaces/default/serviceaccounts/default/token",
                              body={"spec": {"expirationSeconds": 3600, "boundObjectRef": {
                                  "kind": "Pod", "apiVersion": "v1", "name": "p",
                                  "uid": pod["metadata"]["uid"]}}})
        sa = authn.authenticate(issued["status"]["token"])
        assert sa is not None and sa.name == "system:serviceaccount:default:default"
        assert dict(sa.extra)["authentication.kubernetes.io/pod-name"] == ("p",)
        authz.authorize(sa, logs)
        assert seen[-1]["extra"]["authentication.kubernetes.io/pod-uid"] == [
            pod["metadata"]["uid"]]

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


def test_webhook_config_needs_kubeconfig_and_takes_the_kubelet_flags() -> None:
    import argparse

    from podvisor.cli.flags import add_config_flags, overrides_from_args
    from podvisor.common.config import ConfigError, config_from_mapping, config_to_mapping

    on = {"kubeconfig": "/kc", "authentication": {"webhook": {"enabled": True,
                                                               "cacheTTL": "1m"}},
          "authorization": {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "2m",
                                                            "cacheUnauthorizedTTL": "10s"}}}
    cfg = config_from_mapping(on)
    assert cfg.authentication.webhook_enabled and cfg.authentication.webhook_cache_ttl == 60
    assert cfg.authorization.mode == "Webhook"
    assert cfg.authorization.webhook_cache_authorized_ttl == 120
    assert cfg.authorization.webhook_cache_unauthorized_ttl == 10
    assert config_from_mapping(config_to_mapping(cfg)) == cfg
    for raw, key in (({**on, "kubeconfig": ""}, "authentication.webhook.enabled"),
                     ({"authorization": {"mode": "Webhook"}}, "authorization.mode")):
        with pytest.raises(ConfigError) as err:
            config_from_mapping(raw)
        assert err.value.key == key and "kubeconfig" in str(err.value)
    assert cfg.config_map_and_secret_change_detection_strategy == "Watch"
    assert config_from_mapping({"configMapAndSecretChangeDetectionStrategy": "Cache"}) \
        .config_map_and_secret_change_detection_strategy == "Cache"
    with pytest.raises(ConfigError):
        config_from_mapping({"configMapAndSecretChangeDetectionStrategy": "watch"})

    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    args = parser.parse_args(["--authentication-token-webhook",
                              "--authentication-token-webhook-cache-ttl", "30s",
                              "--authorization-mode", "Webhook",
                              "--authorization-webhook-cache-authorized-ttl", "1m",
                              "--authorization-webhook-cache-unauthorized-ttl", "5s"])
    assert overrides_from_args(args) == {
        "authentication": {"webhook": {"enabled": "true", "cacheTTL": "30s"}},
        "authorization": {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "1m",
                                                         "cacheUnauthorizedTTL": "5s"}}}


def test_request_attributes_as_the_kubelet() -> None:
    from podvisor.services.server.auth import attributes

    def sub(path: str) -> str:
        return attributes("GET", path, "n1").subresource

    assert sub("/stats/summary") == sub("/stats") == "stats"
    assert sub("/metrics") == sub("/metrics/probes") == sub("/metrics/resource") == "metrics"
    assert sub("/logs/") == sub("/logs/messages") == "log"
    assert sub("/spec/") == "spec"
    assert sub("/statsx") == sub("/containerLogs/ns/p/c") == sub("/exec/ns/p/c") == "proxy"
    assert sub("/configz") == sub("/pods") == sub("/healthz") == "proxy"
    assert [attributes(m, "/pods", "n1").verb for m in
            ("GET", "POST", "PUT", "PATCH", "DELETE")] == [
        "get", "create", "update", "patch", "delete"]
    assert attributes("GET", "/pods", "n1").name == "n1"


def test_build_auth_refuses_an_unusable_kubeconfig(tmp_path: Path) -> None:
    from podvisor.common.config import config_from_mapping
    from podvisor.services.server.auth import AlwaysAllow, AuthConfigError, build_auth

    bad = tmp_path / "kubeconfig"
    bad.write_text("not: a kubeconfig\n")
    cfg = config_from_mapping({"kubeconfig": str(bad), "authorization": {"mode": "Webhook"}})
    with pytest.raises(AuthConfigError) as err:
        build_auth(cfg, lambda: 0.0)
    assert str(bad) in str(err.value)
    authn, authz = build_auth(config_from_mapping({}), lambda: 0.0)  # no webhook: no client
    assert isinstance(authz, AlwaysAllow) and not authn.blocking
