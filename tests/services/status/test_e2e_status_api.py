"""Pod status, mirror pods and deletion to the stand-in API server, end to end (embedded
runtime): an API pod's status reaches Running with its conditions and container IDs; deleting it
with a 5 s grace stops it and removes it from the API; a static pod gets a mirror pod whose
status follows it, replaced when the manifest changes; kill -9 of status-api and the API
server away for a while lose no status."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kubeapi import ApiError, KubeApi
from tests.support.lifecycle import free_port, get_pods

NODE = "e2e-st"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    yield server
    server.stop()


def api_pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "nodeName": NODE, "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "c", "image": "host",
                        "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]}]}}


def static_yaml(name: str, value: str) -> str:
    return (f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{v: '{value}'}}\n"
            f"spec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n"
            f"    image: host\n    command: [sh, -c, 'sleep 3600']\n")


def get(api: KubeApi, name: str) -> dict[str, Any] | None:
    try:
        return api.store.get("pods", "default", name)
    except ApiError:
        return None


def api_running(api: KubeApi, name: str) -> dict[str, Any] | None:
    pod = get(api, name)
    if pod is None:
        return None
    st = pod.get("status", {})
    cs = st.get("containerStatuses") or []
    ok = st.get("phase") == "Running" and cs and all("running" in c["state"] for c in cs)
    return pod if ok else None


def test_status_mirror_deletion_and_outage(api: KubeApi, agent: Any,
                                           wait_for: Callable[..., Any],
                                           tmp_path: Path) -> None:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "st.yaml").write_text(static_yaml("st", "1"))
    port = free_port()
    api.store.create("pods", "default", api_pod("web"))
    handle = agent(config={
        "nodeName": NODE, "kubeconfig": str(kubeconfig), "readOnlyPort": port,
        "staticPodPath": str(manifests), "fileCheckFrequency": "1s",
        "apiWatchTimeout": "5s", "statusSweepFrequency": "1s", "apiRetryMaxDelay": "1s",
        "nodeLeaseRenewInterval": "1s", "stopPodsOnExit": True,
        "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})
    pod = wait_for(lambda: api_running(api, "web"), timeout=60, message="web Running in API")
    st = pod["status"]
    conds = {c["type"]: c["status"] for c in st["conditions"]}
    assert conds["Ready"] == "True" and conds["ContainersReady"] == "True"
    assert conds["Initialized"] == "True" and conds["PodScheduled"] == "True"
    cid = st["containerStatuses"][0]["containerID"]
    assert cid.startswith("embedded://")
    # the static pod's mirror pod: created, owned by the Node, status following the pod
    mirror_name = f"st-{NODE}"
    mirror = wait_for(lambda: api_running(api, mirror_name), timeout=60,
                      message="the mirror pod Running")
    assert "kubernetes.io/config.mirror" in mirror["metadata"]["annotations"]
    assert mirror["metadata"]["ownerReferences"][0]["kind"] == "Node"
    first_uid = mirror["metadata"]["uid"]
    # editing the manifest replaces the mirror pod
    (manifests / "st.yaml").write_text(static_yaml("st", "2"))
    wait_for(lambda: (m := api_running(api, mirror_name)) and
             m["metadata"]["uid"] != first_uid and m["metadata"]["labels"]["v"] == "2",
             timeout=60, message="a new mirror pod for the new manifest")
    # kill -9 of status-api: nothing regresses, it goes on
    pid = handle.wait_state("status-api", "RUNNING")["pid"]
    os.kill(pid, signal.SIGKILL)
    handle.wait_state("status-api", "RUNNING", where=lambda r: r["pid"] != pid)
    assert api_running(api, "web")["status"]["containerStatuses"][0]["containerID"] == cid
    # the API server away: pods keep running; the status made meanwhile arrives afterwards
    api.stop()
    (manifests / "st.yaml").unlink()  # the static pod goes while the API is away
    wait_for(lambda: all(p["metadata"]["name"] != mirror_name
                         for p in (get_pods(port) or {"items": [
                             {"metadata": {"name": mirror_name}}]})["items"]), timeout=60)
    assert any(p["metadata"]["name"] == "web" for p in get_pods(port)["items"])
    api.start()
    wait_for(lambda: get(api, mirror_name) is None, timeout=60,
             message="the mirror pod deleted once the API is back")
    # graceful deletion: kill within the grace, then DELETE grace 0 with the UID precondition
    api.store.delete("pods", "default", "web", grace=5)
    try:
        wait_for(lambda: get(api, "web") is None, timeout=30, message="web removed from the API")
    except AssertionError:
        for n in ("status-api", "syncloop", "source-api"):
            print(n, (handle.paths.logs_dir / f"{n}.log").read_text()[-3000:])
        print(get(api, "web"))
        raise
    assert api.count("DELETE", "/pods/web", code=200) >= 1
    wait_for(lambda: all(p["metadata"]["name"] != "web"
                         or "running" not in str(p.get("status", {}).get("containerStatuses"))
                         for p in (get_pods(port) or {}).get("items", [])), timeout=30)
