"""HTTP handlers with the replica view faked; PodList/table helpers."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from podvisor.common.podlist import (
    PodListJson,
    check_health,
    pod_list,
    running_pods,
    table_rows,
)
from podvisor.ipc.maps import DesiredPod, PodRef, RuntimeNetwork
from podvisor.services.server.app import make_app
from podvisor.services.server.replicas import View
from tests.support.mapvalues import status_value
from tests.support.plegs import pleg_map

WALL = 1_700_000_000.0


def pod(uid: str, name: str) -> DesiredPod:
    return DesiredPod(pod={"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": "default", "uid": uid},
                           "spec": {"containers": [{"name": "app", "image": "host"}]},
                           "status": {}, "podvisor": {"source": "file"}},
                      worker="syncing")


STATUS = status_value({"phase": "Running",
                         "containerStatuses": [{"name": "app", "ready": True, "restartCount": 2,
                                                "state": {"running": {}}}],
                         "startTime": "2023-11-14T22:13:20Z"}, 3, PodRef("b"))
PLEG = pleg_map({
    "_health": {"last_relist_ok": WALL - 1, "events_mode": "stream"},
    "u1": {"name": "b", "namespace": "default", "containers": [
        {"id": "c1", "name": "app", "image": "host", "state": "CONTAINER_RUNNING"},
        {"id": "c0", "name": "old", "image": "host", "state": "CONTAINER_EXITED"}]},
    "u9": {"name": "dead", "namespace": "default", "containers": [
        {"id": "c9", "name": "x", "image": "host", "state": "CONTAINER_EXITED"}]},
})


def healthy_view() -> View:
    return View(desired={"u1": pod("u1", "b"), "u2": pod("u2", "a"), "_meta": {}},
                statuses={"u1": STATUS}, pleg=PLEG, desired_synced=True, statuses_synced=True,
                pleg_synced=True, desired_heard=99.0)


def call(view: View, method: str, path: str, now: float = 100.0) -> tuple[int, Any, str]:
    async def go() -> tuple[int, Any, str]:
        app = make_app(lambda: view, clock=lambda: now, wall=lambda: WALL)
        async with TestClient(TestServer(app)) as client:
            resp = await client.request(method, path)
            text = await resp.text()
            body = await resp.json() if resp.content_type == "application/json" else None
            return resp.status, body, text
    return asyncio.run(go())


def test_pods_is_a_podlist_with_statuses() -> None:
    code, body, _ = call(healthy_view(), "GET", "/pods")
    assert code == 200 and body["kind"] == "PodList" and body["apiVersion"] == "v1"
    names = [p["metadata"]["name"] for p in body["items"]]
    assert names == ["a", "b"]  # sorted, reserved keys skipped
    b = body["items"][1]
    assert b["status"]["phase"] == "Running" and "_version" not in b["status"]
    assert "podvisor" not in b and b["spec"]["containers"][0]["name"] == "app"
    assert body["items"][0]["status"] == {"phase": "Pending"}  # no status yet


def test_runningpods_lists_only_running_containers() -> None:
    code, body, _ = call(healthy_view(), "GET", "/runningpods/")
    assert code == 200 and body["kind"] == "PodList"
    assert [p["metadata"]["uid"] for p in body["items"]] == ["u1"]
    assert body["items"][0]["spec"]["containers"] == [
        {"name": "app", "image": "host", "resources": {}}]
    assert call(healthy_view(), "GET", "/runningpods")[1] == body


def test_healthz_ok() -> None:
    assert call(healthy_view(), "GET", "/healthz")[::2] == (200, "ok")


def test_healthz_says_pods_share_the_node_network_in_host_mode() -> None:
    """networkPlugin: host (the embedded runtime's NetworkReady reason ``HostNetwork``):
    healthy, and the detail says that pods share the node's network."""
    view = healthy_view()
    host = View(desired={**view.desired, "_runtime": RuntimeNetwork(
        True, "HostNetwork", "networkPlugin: host: pods share the node's network",
        "container runtime network is ready")}, statuses=view.statuses, pleg=PLEG,
        desired_synced=True, statuses_synced=True, pleg_synced=True, desired_heard=99.0)
    code, _, text = call(host, "GET", "/healthz")
    assert code == 200
    assert text.splitlines() == [
        "[+]pleg ok", "[+]syncloop ok",
        "[!]runtime-network host network mode: networkPlugin: host: pods share the node's "
        "network", "healthz check passed"]


def test_healthz_says_the_runtime_network_is_not_ready_but_stays_ok() -> None:
    """The kubelet's /healthz stays ok while its node condition says the network is not
    ready; podvisor's answers 200 too, with the sync loop's ``_runtime`` reading as detail."""
    cond = ("container runtime network not ready: NetworkReady=false "
            "reason:NetworkPluginNotReady message:cni plugin not initialized")
    view = healthy_view()
    not_ready = View(desired={**view.desired, "_runtime": RuntimeNetwork(
        False, "NetworkPluginNotReady", "x", cond)}, statuses=view.statuses, pleg=PLEG,
        desired_synced=True, statuses_synced=True, pleg_synced=True, desired_heard=99.0)
    code, _, text = call(not_ready, "GET", "/healthz")
    assert code == 200
    assert text.splitlines() == [
        "[+]pleg ok", "[+]syncloop ok",
        f"[!]runtime-network {cond} (pods without hostNetwork wait for it)",
        "healthz check passed"]
    ready = View(desired={**view.desired, "_runtime": RuntimeNetwork(True)},
                 statuses=view.statuses, pleg=PLEG, desired_synced=True, statuses_synced=True,
                 pleg_synced=True, desired_heard=99.0)
    assert call(ready, "GET", "/healthz")[::2] == (200, "ok")
    assert [p["metadata"]["name"] for p in call(not_ready, "GET", "/pods")[1]["items"]] \
        == ["a", "b"]  # the entry is no pod


def test_healthz_fails_on_stale_pleg() -> None:
    stale = pleg_map({"_health": {"last_relist_ok": WALL - 400}})
    view = View(desired={}, statuses={}, pleg=stale, desired_synced=True, desired_heard=99.0)
    code, _, text = call(view, "GET", "/healthz")
    assert code == 500 and "[-]pleg failed: PLEG last relisted 400s ago" in text
    assert "[+]syncloop ok" in text


def test_healthz_fails_without_syncloop() -> None:
    view = View(pleg=PLEG)
    code, _, text = call(view, "GET", "/healthz")
    assert code == 500 and "[-]syncloop failed" in text
    code, _, text = call(View(pleg=PLEG, desired_synced=True, desired_heard=10.0), "GET",
                         "/healthz", now=100.0)
    assert code == 500 and "silent for 90s" in text


def test_bad_requests_are_json_4xx() -> None:
    code, body, _ = call(healthy_view(), "GET", "/nope")
    assert code == 404 and body["kind"] == "Status" and body["reason"] == "NotFound"
    code, body, _ = call(healthy_view(), "POST", "/pods")
    assert code == 405 and body["reason"] == "MethodNotAllowed" and "GET" in body["message"]
    code, body, _ = call(healthy_view(), "GET", "/pods?x=1")
    assert code == 400 and "x" in body["message"]


def test_check_health_before_first_relist() -> None:
    h = check_health(None, WALL, True, 1.0)
    assert not h.ok and "not relisted" in h.text()


def test_table_rows() -> None:
    crash = {"metadata": {"name": "c"}, "status": {"phase": "Running", "containerStatuses": [
        {"ready": False, "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
    rejected = {"metadata": {"name": "r"}, "status": {"phase": "Failed", "reason": "Rejected"}}
    podlist = {"items": [{"metadata": {"name": "b"}, "status": STATUS.status.to_dict()}, crash,
                         rejected]}
    def age(start: Any) -> str:
        return "5m" if start else "<unknown>"
    assert table_rows(podlist, age) == [
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        ["b", "1/1", "Running", "2", "5m"],
        ["c", "0/1", "CrashLoopBackOff", "4", "<unknown>"],
        ["r", "0/0", "Rejected", "0", "<unknown>"],
    ]
    podlist["items"][0]["status"] = {**STATUS.status.to_dict(), "podIP": "10.205.1.2"}
    assert [r[-1] for r in table_rows(podlist, age, wide=True)] == [
        "IP", "10.205.1.2", "<none>", "<none>"]


def test_running_pods_empty() -> None:
    assert running_pods({})["items"] == []


def test_unsynced_replicas_are_503_not_an_empty_list() -> None:
    code, body, _ = call(View(), "GET", "/pods")
    assert code == 503 and body["reason"] == "ServiceUnavailable"
    assert call(View(), "GET", "/runningpods/")[0] == 503


def test_pods_body_cached_per_pod_matches_a_fresh_render() -> None:
    renderer = PodListJson()
    view = healthy_view()

    def fresh(desired: Any, statuses: Any) -> bytes:
        return json.dumps(pod_list(desired, statuses), separators=(",", ":")).encode()

    assert renderer.render(view.desired, view.statuses) == fresh(view.desired, view.statuses)
    statuses = {**view.statuses, "u2": status_value({"phase": "Failed"}, 1)}
    desired = {**view.desired, "u3": pod("u3", "c")}
    again = renderer.render(desired, statuses)
    assert again == fresh(desired, statuses)
    assert json.loads(again)["items"][0]["status"] == statuses["u2"].status.to_dict()
    assert json.loads(again)["items"][0]["status"]["phase"] == "Failed"
    # the sync loop's own keys change: same text; a rename re-sorts; a pod leaves
    desired = {**desired, "u1": dataclasses.replace(desired["u1"], sandbox_id="s1")}
    assert renderer.render(desired, statuses) == fresh(desired, statuses)
    desired = {**desired, "u3": pod("u3", "0first")}
    assert renderer.render(desired, statuses) == fresh(desired, statuses)
    assert json.loads(renderer.render(desired, statuses))["items"][0]["metadata"]["uid"] == "u3"
    statuses = {**statuses, "u3": status_value({"phase": "Running"})}
    del desired["u2"]
    assert renderer.render(desired, statuses) == fresh(desired, statuses)
    assert renderer.render({"_meta": {}, "bad": {"pod": 1}}, {}) == fresh({"bad": {"pod": 1}}, {})


def test_pods_content_type() -> None:
    async def go() -> str:
        app = make_app(healthy_view, clock=lambda: 100.0, wall=lambda: WALL)
        async with TestClient(TestServer(app)) as client:
            return (await client.get("/pods")).headers["Content-Type"]

    assert asyncio.run(go()) == "application/json; charset=utf-8"


def test_handlers_ask_for_a_fresh_view_when_they_can() -> None:
    asked: list[str] = []

    async def refresh() -> View:
        asked.append("x")
        return healthy_view()

    async def go() -> list[int]:
        app = make_app(View, clock=lambda: 100.0, wall=lambda: WALL, refresh=refresh)
        async with TestClient(TestServer(app)) as client:
            return [(await client.get(path)).status
                    for path in ("/pods", "/runningpods/", "/healthz")]

    assert asyncio.run(go()) == [200, 200, 200]  # the stale (empty) view was never read
    assert len(asked) == 3
