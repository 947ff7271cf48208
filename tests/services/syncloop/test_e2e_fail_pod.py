"""End to end: another process fails a pod for good through the bus (``FailPod``), the one way
the sync loop fails a pod with a reason (its own ``activeDeadlineSeconds`` goes the same way;
eviction will send reason ``Evicted``). A real agent on the embedded runtime, a test process
publishing on the agent's bus as any subsystem would: the pod's container gets TERM, is not
restarted (restartPolicy Always), /pods says phase Failed with the reason and message, an Event
says them too, and the pod beside it runs on untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import zmq
from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.bus import Publisher
from podvisor.ipc.messages import FailPod
from podvisor.services.syncloop import labels as L
from tests.cli.test_e2e_logs_events import has_event
from tests.support.kubeapi import KubeApi
from tests.support.lifecycle import (
    agent_config,
    cri_for,
    free_port,
    get_pods,
    marked,
    pod_yaml,
)

MESSAGE = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 90Mi."


def pods(port: int) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in (get_pods(port) or {}).get("items", [])}


@pytest.mark.timeout(180)
def test_a_fail_pod_on_the_bus_fails_the_pod_for_good(agent: Any, wait_for: Any,
                                                      manifests: Path) -> None:
    marks = manifests / "marks"
    marks.mkdir()
    (manifests / "victim.yaml").write_text(pod_yaml("victim", marked(marks, "victim"), grace=5))
    (manifests / "bystander.yaml").write_text(pod_yaml("bystander", marked(marks, "by")))
    port = free_port()
    handle = agent(config={**agent_config(manifests, port), "stopPodsOnExit": True})

    def running(name: str) -> bool:
        st = pods(port).get(f"{name}-e2e", {}).get("status", {})
        cs = st.get("containerStatuses") or [{}]
        return st.get("phase") == "Running" and "running" in cs[0].get("state", {})

    wait_for(lambda: running("victim") and running("bystander"), 60.0, 0.2, "both running")
    by_id = pods(port)["bystander-e2e"]["status"]["containerStatuses"][0]["containerID"]
    uid = pods(port)["victim-e2e"]["metadata"]["uid"]

    zctx = zmq.Context()
    pub = Publisher(zctx, handle.paths, "test-evictor")
    try:
        def failed() -> dict[str, Any] | None:
            # pub/sub may drop a message (a slow joiner): publish until desired took it
            st = pods(port).get("victim-e2e", {}).get("status", {})
            if st.get("phase") == "Failed":
                return st  # type: ignore[no-any-return]
            pub.publish(FailPod(uid=uid, reason="Evicted", message=MESSAGE, grace=5))
            return None

        st = wait_for(failed, 60.0, 0.2, "victim Failed")
    finally:
        pub.socket.close()
        zctx.term()
    assert (st["reason"], st["message"]) == ("Evicted", MESSAGE)
    wait_for(lambda: (marks / "victim.term").exists(), 30.0, 0.1, "victim got TERM")

    def terminated() -> dict[str, Any] | None:
        st = pods(port).get("victim-e2e", {}).get("status", {})
        cs = (st.get("containerStatuses") or [{}])[0]
        return cs if "terminated" in cs.get("state", {}) else None

    cs = wait_for(terminated, 30.0, 0.2, "victim's container terminated")
    assert cs["restartCount"] == 0 and st["phase"] == "Failed"
    wait_for(lambda: has_event(handle, "victim-e2e", "Evicted", "low on resource"), 30.0, 0.2,
             "the Evicted event")
    # after the stop's own sync (the Event came after it): still Failed, not restarted under
    # restartPolicy Always (resyncs: test_podworkers.py); the bystander untouched
    now = pods(port)
    assert now["victim-e2e"]["status"]["phase"] == "Failed"
    assert now["victim-e2e"]["status"]["containerStatuses"][0]["restartCount"] == 0
    assert running("bystander")
    assert now["bystander-e2e"]["status"]["containerStatuses"][0]["containerID"] == by_id


@pytest.mark.timeout(240)
def test_an_evicted_api_pod_stays_down_across_a_sync_loop_restart(
        agent: Any, wait_for: Any, tmp_path: Path) -> None:
    """An API pod failed through ``FailPod`` (reason Evicted) is Failed in the API with the
    reason and an Event; after kill -9 of the sync loop, the new one learns from the API (the
    API source keeps a Failed phase) that the pod is terminal and never starts its container
    again under restartPolicy Always, while a pod created after the restart runs."""
    api = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    api.start()
    try:
        node = "e2e-evict"
        for name in ("victim", "bystander"):
            api.create_pod("default", {"metadata": {"name": name}, "spec": {
                "nodeName": node, "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 2,
                "containers": [{"name": "c", "image": "host", "command": [
                    "sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]}]}})
        kubeconfig = api.kubeconfig(tmp_path / "node.kubeconfig", user=f"system:node:{node}",
                                    groups=("system:nodes",))
        handle = agent(config={
            "nodeName": node, "kubeconfig": str(kubeconfig), "readOnlyPort": free_port(),
            "apiWatchTimeout": "5s", "statusSweepFrequency": "1s", "apiRetryMaxDelay": "1s",
            "stopPodsOnExit": True,
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})

        def phase(name: str) -> str:
            return str(((api.store.get("pods", "default", name) or {}).get("status")
                        or {}).get("phase", ""))

        wait_for(lambda: phase("victim") == phase("bystander") == "Running", 90.0, 0.2,
                 "both Running in the API")
        uid = api.store.get("pods", "default", "victim")["metadata"]["uid"]
        zctx = zmq.Context()
        pub = Publisher(zctx, handle.paths, "test-evictor")
        try:
            def failed() -> bool:
                if phase("victim") == "Failed":
                    return True
                pub.publish(FailPod(uid=uid, reason="Evicted", message=MESSAGE))
                return False

            wait_for(failed, 60.0, 0.2, "victim Failed in the API")
        finally:
            pub.socket.close()
            zctx.term()
        st = api.store.get("pods", "default", "victim")["status"]
        assert (st["reason"], st["message"]) == ("Evicted", MESSAGE)
        wait_for(lambda: any(e.get("reason") == "Evicted" for e in
                             api.store.list("events", "default")[0]), 30.0, 0.2,
                 "the Evicted Event in the API")
        cri = cri_for(handle)

        def running(pod_uid: str) -> list[str]:
            return [c.id for c in cri.list_containers()
                    if c.labels.get(L.POD_UID) == pod_uid and c.state == pb.CONTAINER_RUNNING]

        wait_for(lambda: not running(uid), 30.0, 0.2, "the victim's container stopped")
        log = handle.paths.logs_dir / "syncloop.log"
        old = handle.state("syncloop")
        handle.call("kill", name="syncloop", signal="KILL")
        wait_for(lambda: handle.state("syncloop")["state"] == "RUNNING"
                 and handle.state("syncloop")["pid"] != old["pid"], 30.0)
        wait_for(lambda: log.exists() and "syncloop.pod.failed_in_api" in log.read_text(),
                 60.0, 0.2, "the new sync loop took the victim as Failed from the API")
        api.create_pod("default", {"metadata": {"name": "later"}, "spec": {
            "nodeName": node, "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "host", "command": ["sleep", "3600"]}]}})
        wait_for(lambda: phase("later") == "Running", 90.0, 0.2, "a new pod runs")
        assert running(uid) == [] and phase("victim") == "Failed"
        assert api.store.get("pods", "default", "victim")["status"]["reason"] == "Evicted"
    finally:
        api.stop()
