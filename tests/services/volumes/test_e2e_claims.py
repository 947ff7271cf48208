"""PersistentVolumeClaims end to end (embedded runtime, the stand-in API server with its
volume controllers, the real agent): a StatefulSet-style pod waits in ContainerCreating with
the kubelet's FailedMount event while its claim is unbound, runs once the claim is bound to a
hostPath PV, counts its start in the volume, is deleted and made again under the same name
(a new UID) and finds what it wrote; ``/stats/summary`` reports the claim's usage (a ``volume``
entry with ``pvcRef``). An ``api`` fault on the volumes process holds a pod's claim until it
ends."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.services.volumes.claimpods import (
    agent_config,
    claim,
    counting_pod,
    events,
    gone,
    host_path_pv,
    log_lines,
    phase,
    pod_volumes,
    read,
    summary_auth,
    waiting_reason,
)
from tests.support.kubeapi import KubeApi
from tests.support.lifecycle import free_port

NODE = "e2e-claims"


def test_statefulset_style_pod_keeps_its_data(api: KubeApi, agent: Any,
                                              wait_for: Callable[..., Any],
                                              tmp_path: Path) -> None:
    disk, marks, mount = tmp_path / "disk", tmp_path / "marks", tmp_path / "c" / "data"
    disk.mkdir()
    marks.mkdir()
    api.store.create("persistentvolumeclaims", "default", claim("data-web-0"))
    volume = {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}
    api.create_pod("default", counting_pod("web-0", NODE, volume, mount, marks))
    port = free_port()
    handle = agent(config=agent_config(api, tmp_path, NODE, port=port,
                                       authentication=summary_auth(tmp_path)))
    # no PV yet: the claim stays Pending and the pod waits, as the kubelet's would
    wait_for(lambda: waiting_reason(api, "web-0") == "ContainerCreating", timeout=60,
             message="the pod waiting in ContainerCreating")
    wait_for(lambda: any("PVC is not bound" in e["message"] for e in events(api, "FailedMount")),
             timeout=30, message="a FailedMount event saying the claim is not bound")
    assert not read(marks / "seen")
    api.store.create("persistentvolumes", "", host_path_pv("pv-web-0", disk))
    wait_for(lambda: phase(api, "persistentvolumeclaims", "data-web-0") == "Bound", timeout=30)
    wait_for(lambda: read(marks / "seen") == "0", timeout=60, message="the first start")
    assert read(disk / "count") == "1"
    wait_for(lambda: phase(api, "pods", "web-0") == "Running", timeout=30)
    api.store.delete("pods", "default", "web-0", grace=1)
    wait_for(gone(api, "pods", "web-0"), timeout=60, message="the pod deleted")
    (marks / "seen").unlink()
    api.create_pod("default", counting_pod("web-0", NODE, volume, mount, marks))
    wait_for(lambda: read(marks / "seen") == "1", timeout=60,
             message="the new pod reading what the first one wrote")
    assert read(disk / "count") == "2"
    # the claim's usage: the count file in the PV's folder
    entries = wait_for(lambda: [v for v in pod_volumes(port, "web-0") if v["name"] == "data"
                                and v["usedBytes"] > 0], timeout=30,
                       message="the claim's usage in /stats/summary")
    assert entries[0]["pvcRef"] == {"name": "data-web-0", "namespace": "default"}
    assert entries[0]["capacityBytes"] > 0 and entries[0]["inodesUsed"] >= 2
    # hostPath PVs are used in place: nothing was mounted under the pods' folders
    assert not list(handle.paths.pods_dir.glob("*/volumes/kubernetes.io~csi"))


def test_an_api_fault_on_volumes_holds_the_pod_until_it_ends(api: KubeApi, agent: Any,
                                                             wait_for: Callable[..., Any],
                                                             tmp_path: Path) -> None:
    """The volume manager's API connection takes the injected ``api`` faults (issue 28): while
    its requests are answered 503 the pod's claim cannot be read, the pod waits with a
    FailedMount event that says why; the fault cleared, the claim resolves and the pod runs."""
    disk, marks, mount = tmp_path / "disk", tmp_path / "marks", tmp_path / "c" / "data"
    disk.mkdir()
    marks.mkdir()
    api.store.create("persistentvolumes", "", host_path_pv("pv-db-0", disk))
    api.store.create("persistentvolumeclaims", "default", claim("data-db-0"))
    wait_for(lambda: phase(api, "persistentvolumeclaims", "data-db-0") == "Bound", timeout=30)
    handle = agent(config=agent_config(api, tmp_path, NODE))
    wait_for(lambda: handle.state("volumes")["state"] == "RUNNING", timeout=30)
    fault = handle.call("fault-inject", kind="api", target="volumes", action="error",
                        status=503)
    wait_for(lambda: any(line.get("event") == "faults.in_force" and fault["id"] in
                         (line.get("faults") or []) for line in log_lines(handle)),
             timeout=30, message="the volumes process applying the fault")
    volume = {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}
    api.create_pod("default", counting_pod("db-0", NODE, volume, mount, marks))
    wait_for(lambda: any("error processing volume" in e["message"] and "503" in e["message"]
                         for e in events(api, "FailedMount")), timeout=60,
             message="a FailedMount event naming the injected 503")
    wait_for(lambda: waiting_reason(api, "db-0") == "ContainerCreating", timeout=30,
             message="the pod waiting in ContainerCreating")
    assert not read(marks / "seen")
    handle.call("fault-clear", id=fault["id"])
    wait_for(lambda: read(marks / "seen") == "0", timeout=60, message="the pod running")
