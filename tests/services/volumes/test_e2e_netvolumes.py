"""nfs, iscsi and fc volumes end to end, static pods on the embedded runtime: accepted (no
admission refusal), mounted by the volumes process with the real commands, and, on a node that
cannot mount them (this machine's kernel has no nfs file system, no iSCSI initiator, no FC
HBA), kept ContainerCreating with the kubelet's FailedMount event carrying the real error
(``mount``'s own output for nfs), retried, while the node's other pod runs."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.services.volumes.claimpods import log_lines, read
from tests.support.lifecycle import agent_config, free_port, get_pods

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mount(8) needs root")
KERNEL_NFS = any(line.split()[-1] == "nfs" for line in Path("/proc/filesystems").read_text()
                 .splitlines() if line.strip())


def _pod(name: str, volume: dict[str, Any], marks: Path) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "disk", **volume}, {"name": "marks", "hostPath": {
            "path": str(marks)}}],
        "containers": [{"name": "c", "image": "host", "command": [
            "sh", "-c", f"echo ok > {marks}/{name}; while true; do sleep 1; done"],
            "volumeMounts": [{"name": "disk", "mountPath": f"/mnt/{name}"},
                             {"name": "marks", "mountPath": str(marks)}]}]}}


def _statuses(port: int) -> dict[str, tuple[str, str]]:
    """pod name -> (phase, its container's waiting reason)."""
    out = {}
    for pod in (get_pods(port) or {}).get("items", []):
        status = pod.get("status", {})
        waiting = [c.get("state", {}).get("waiting", {}).get("reason", "")
                   for c in status.get("containerStatuses", [])]
        out[pod["metadata"]["name"]] = (status.get("phase", ""), (waiting or [""])[0])
    return out


def _failed_mounts(handle: Any) -> dict[str, str]:
    out = handle.ctl("events", "--json")
    return {e["involvedObject"]["name"]: e["message"] for e in json.loads(out.stdout)["items"]
            if e["reason"] == "FailedMount"}


@pytest.mark.skipif(KERNEL_NFS, reason="the kernel has nfs: a mount would be tried for real")
def test_network_volumes_wait_with_failed_mount_and_other_pods_run(
        agent: Any, wait_for: Callable[..., Any], tmp_path: Path) -> None:
    marks, manifests = tmp_path / "marks", tmp_path / "manifests"
    marks.mkdir()
    manifests.mkdir()
    volumes = {
        "nfs": {"nfs": {"server": "127.0.0.1", "path": "/exports/data", "readOnly": True}},
        "iscsi": {"iscsi": {"targetPortal": "127.0.0.1", "iqn": "iqn.2001-04.com.example:d1",
                            "lun": 0, "fsType": "ext4"}},
        "fc": {"fc": {"targetWWNs": ["500a0982991b8dc5"], "lun": 2, "fsType": "ext4"}},
    }
    for name, volume in volumes.items():
        (manifests / f"{name}.json").write_text(json.dumps(_pod(name, volume, marks)))
    (manifests / "plain.json").write_text(json.dumps(_pod("plain", {"emptyDir": {}}, marks)))
    port = free_port()
    handle = agent(config=agent_config(manifests, port, stopPodsOnExit=True))
    wait_for(lambda: read(marks / "plain") == "ok", timeout=90, message="the other pod running")
    events = wait_for(lambda: (e := _failed_mounts(handle)).keys() >= {
        "nfs-e2e", "iscsi-e2e", "fc-e2e"} and e, timeout=60,
        message="a FailedMount event for each network volume")
    uid = wait_for(lambda: (u := {p["metadata"]["name"]: p["metadata"]["uid"]
                                  for p in (get_pods(port) or {}).get("items", [])})
                   .keys() >= {"nfs-e2e"} and u, timeout=30, message="the pods in /pods")
    folder = handle.paths.pods_dir / uid["nfs-e2e"] / "volumes" / "kubernetes.io~nfs" / "disk"
    # the kubelet's message: mount-utils' doMount error with mount(8)'s own output
    assert events["nfs-e2e"].startswith(
        'MountVolume.SetUp failed for volume "disk" : mount failed: exit status 32\n'
        "Mounting command: mount\nMounting arguments: -t nfs -o ro 127.0.0.1:/exports/data "
        f"{folder}\nOutput: mount: "), events["nfs-e2e"]
    assert "unknown filesystem type 'nfs'" in events["nfs-e2e"]
    assert events["iscsi-e2e"].startswith(
        'MountVolume.WaitForAttach failed for volume "disk" : '), events["iscsi-e2e"]
    assert "iscsi" in events["iscsi-e2e"]
    assert events["fc-e2e"] == ('MountVolume.WaitForAttach failed for volume "disk" : '
                                "no fc disk found")
    waiting = ("Pending", "ContainerCreating")
    statuses = wait_for(lambda: (s := _statuses(port)) and all(
        s.get(n) == waiting for n in ("nfs-e2e", "iscsi-e2e", "fc-e2e")) and s, timeout=30,
        message="the three pods Pending, ContainerCreating in /pods")
    for name in ("nfs", "iscsi", "fc"):
        assert not (marks / name).exists()
    assert statuses["plain-e2e"][0] == "Running"
    assert not folder.exists()  # a failed SetUp removes the folder, as the kubelet's
    wait_for(lambda: sum(1 for line in log_lines(handle)
                         if line.get("event") == "volumes.operation.failed"
                         and line.get("pod_uid") == uid["nfs-e2e"]) >= 2, timeout=30,
             message="the nfs mount retried (with back-off)")
