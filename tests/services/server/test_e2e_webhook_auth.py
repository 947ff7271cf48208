"""The main port of a real agent with ``authentication.webhook.enabled`` and
``authorization.mode: Webhook`` against the stand-in API server (real HTTPS both ways): a token
the API server accepts -> 200; an unknown token -> 401 (asked every time: kube-apiserver
reports it as an error, which the kubelet's cache does not keep); a denied SubjectAccessReview
-> 403; the reviews are cached (counted at the stand-in); with the API server away a token or
a request it has no cached answer for is refused (401/403), never a 500, and cached answers
keep serving. The cache TTLs on the injected clock are covered by test_webhook.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.kubeapi import KubeApi
from tests.support.lifecycle import free_port

NODE = "e2e-webhook"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi")
    server.start()
    yield server
    server.stop()


def test_main_port_webhook_authn_authz(api: KubeApi, agent: Any,
                                       wait_for: Callable[..., Any], tmp_path: Path) -> None:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    api.tokens["viewer-token"] = ("viewer", ["devs"])
    api.tokens["intruder-token"] = ("intruder", [])
    api.tokens["late-token"] = ("viewer", ["devs"])
    seen: list[dict[str, Any]] = []

    def policy(spec: dict[str, Any]) -> bool:
        seen.append(spec)
        return spec["user"] == "viewer" and spec["resourceAttributes"]["verb"] == "get"

    api.authorize = policy
    port = free_port()
    handle = agent(config={
        "nodeName": NODE, "kubeconfig": str(kubeconfig), "port": port,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True}},
        "authorization": {"mode": "Webhook"},
        "supervision": {"builtins": False, "heartbeatInterval": "200ms",
                        "processes": {"server": {"module": "podvisor.services.server.main"}}}})
    ca = str(handle.paths.root / "pki" / "kubelet.crt")

    def get(path: str, token: str | None) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.get(f"https://127.0.0.1:{port}{path}", headers=headers, verify=ca,
                            timeout=30)

    def serving() -> bool:
        try:
            return get("/configz", "viewer-token").status_code == 200
        except (requests.ConnectionError, OSError):
            return False

    wait_for(serving, timeout=60, message="the main port, with the webhook")
    assert seen[-1]["user"] == "viewer"
    assert "system:authenticated" in seen[-1]["groups"]
    assert seen[-1]["resourceAttributes"] == {"verb": "get", "resource": "nodes",
                                              "subresource": "proxy", "name": NODE,
                                              "group": "", "version": "v1"}
    # the kubelet's subresources by path
    # (past authorization: whatever the handler says without the other processes' maps)
    assert get("/metrics", "viewer-token").status_code not in (401, 403, 500)
    assert seen[-1]["resourceAttributes"]["subresource"] == "metrics"
    assert get("/stats/summary", "intruder-token").status_code == 403
    assert seen[-1]["resourceAttributes"]["subresource"] == "stats"

    # cached: no new review for answers already had
    token_reviews = api.count("POST", "/tokenreviews")
    access_reviews = api.count("POST", "/subjectaccessreviews")
    for _ in range(5):
        assert get("/configz", "viewer-token").status_code == 200
        assert get("/metrics", "viewer-token").status_code not in (401, 403, 500)
    assert api.count("POST", "/tokenreviews") == token_reviews
    assert api.count("POST", "/subjectaccessreviews") == access_reviews

    # unknown token: 401, reviewed each time (an error answer is not cached)
    for _ in range(2):
        r = get("/configz", "no-such-token")
        assert r.status_code == 401 and r.json()["reason"] == "Unauthorized"
    assert api.count("POST", "/tokenreviews") == token_reviews + 2
    assert get("/configz", None).status_code == 401  # no credentials, anonymous off

    # a denied review: 403 with the attributes; a denial is cached too (30 s)
    r = get("/configz", "intruder-token")
    assert r.status_code == 403 and r.json()["reason"] == "Forbidden"
    assert "user=intruder, verb=get, resource=nodes, subresource=proxy" in r.json()["message"]
    reviews = api.count("POST", "/subjectaccessreviews")
    assert get("/configz", "intruder-token").status_code == 403
    assert api.count("POST", "/subjectaccessreviews") == reviews

    # the API server away: cached answers serve; a token or request without one is refused
    api.stop()
    assert get("/configz", "viewer-token").status_code == 200
    r = get("/configz", "late-token")
    assert r.status_code == 401 and "could not be reviewed" in r.json()["message"]
    r = get("/stats/summary", "viewer-token")  # attributes never reviewed for this user
    assert r.status_code == 403 and "authorization error" in r.json()["message"]
    api.start()
    assert get("/configz", "late-token").status_code == 200  # the failure was not cached
