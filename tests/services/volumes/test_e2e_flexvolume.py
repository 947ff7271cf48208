"""FlexVolume end to end (root: the driver makes real bind mounts), static pods on the embedded
runtime, no API server: a real driver (a shell script the test writes into a temp
``volumePluginDir``, logging every call) is probed and ``init``-ed, asked to ``mount`` the pod's
volume folder with the kubelet's JSON options (it bind-mounts a temp directory there), and the
container reads what the directory holds. A driver that fails its mount keeps its pod
ContainerCreating with the kubelet's FailedMount event, retried, while the other pod runs.
kill -9 of the volumes process leaves the one mount as it was (reconstructed, not mounted
again); the manifest removed, the driver's ``unmount`` is called once and the folder goes."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.services.volumes.claimpods import kill9, log_lines, mounts_under, read
from tests.support.lifecycle import agent_config, free_port, get_pods

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")

DRIVER = """#!/bin/sh
echo "$*" >> {log}
case "$1" in
  init) echo '{{"status": "Success", "capabilities": {{"attach": false}}}}' ;;
  mount)
    if [ "{name}" = broken ]; then
      echo '{{"status": "Failure", "message": "the array is offline"}}'; exit 1
    fi
    mkdir -p "$2" && mount --bind {source} "$2" \\
      && echo '{{"status": "Success"}}' || echo '{{"status": "Failure", "message": "bind"}}' ;;
  unmount) umount "$2"; echo '{{"status": "Success"}}' ;;
  *) echo '{{"status": "Not supported"}}' ;;
esac
"""


def _driver(plugins: Path, vendor: str, name: str, source: Path, log: Path) -> None:
    folder = plugins / f"{vendor}~{name}"
    folder.mkdir(parents=True)
    exe = folder / name
    exe.write_text(DRIVER.format(log=log, name=name, source=source))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


def _pod(name: str, driver: str, mount: Path, marks: Path) -> dict[str, Any]:
    script = f"cat {mount}/hello > {marks}/{name}; while true; do sleep 1; done"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "data", "flexVolume": {"driver": driver, "fsType": "ext4",
                                                    "options": {"volumeID": "vol-1"}}},
                    {"name": "marks", "hostPath": {"path": str(marks)}}],
        "containers": [{"name": "c", "image": "host", "command": ["sh", "-c", script],
                        "volumeMounts": [{"name": "data", "mountPath": str(mount)},
                                         {"name": "marks", "mountPath": str(marks)}]}]}}


def _calls(log: Path, command: str) -> list[list[str]]:
    return [line.split(" ", 2) for line in read(log).splitlines()
            if line.split(" ", 1)[0] == command]


def _waiting(port: int, name: str) -> str:
    for pod in (get_pods(port) or {}).get("items", []):
        if pod["metadata"]["name"] == name:
            for c in pod.get("status", {}).get("containerStatuses", []):
                return str(c.get("state", {}).get("waiting", {}).get("reason", ""))
    return ""


def _events(handle: Any, reason: str) -> list[dict[str, Any]]:
    out = handle.ctl("events", "--json")
    return [e for e in json.loads(out.stdout)["items"] if e["reason"] == reason]


def test_flexvolume_mount_failure_kill9_and_unmount(agent: Any, wait_for: Callable[..., Any],
                                                     tmp_path: Path) -> None:
    plugins, source, marks, manifests = (tmp_path / "exec", tmp_path / "disk",
                                         tmp_path / "marks", tmp_path / "manifests")
    for d in (source, marks, manifests):
        d.mkdir()
    (source / "hello").write_text("from the driver\n")
    log = tmp_path / "driver.log"
    _driver(plugins, "example.com", "lvm", source, log)
    _driver(plugins, "example.com", "broken", source, log)
    mount = tmp_path / "c" / "data"
    (manifests / "good.json").write_text(json.dumps(_pod("good", "example.com/lvm", mount,
                                                         marks)))
    (manifests / "bad.json").write_text(json.dumps(_pod("bad", "example.com/broken",
                                                        tmp_path / "c" / "bad", marks)))
    port = free_port()
    handle = agent(config=agent_config(manifests, port, volumePluginDir=str(plugins),
                                      stopPodsOnExit=True))
    try:
        wait_for(lambda: read(marks / "good") == "from the driver", timeout=90,
                 message="the good pod reading its FlexVolume")
        uid = wait_for(lambda: next((p["metadata"]["uid"] for p in (get_pods(port) or {})
                                     .get("items", []) if p["metadata"]["name"] == "good-e2e"),
                                    None), timeout=30, message="the good pod in /pods")
        folder = handle.paths.pods_dir / uid / "volumes" / "example.com~lvm" / "data"
        assert mounts_under(folder) == [str(folder.resolve())]
        assert len(_calls(log, "init")) == 2  # once per driver
        (call,) = [c for c in _calls(log, "mount") if c[1] == str(folder)]
        options = json.loads(call[2])
        assert options == {
            "kubernetes.io/fsType": "ext4", "kubernetes.io/readwrite": "rw",
            "kubernetes.io/pvOrVolumeName": "data", "kubernetes.io/pod.name": "good-e2e",
            "kubernetes.io/pod.namespace": "default", "kubernetes.io/pod.uid": uid,
            "kubernetes.io/serviceAccount.name": "default", "volumeID": "vol-1"}
        # the failing driver: the kubelet's event, the pod waiting, retried with back-off
        message = ('MountVolume.SetUp failed for volume "data" : mount command failed, '
                   "status: Failure, reason: the array is offline")
        wait_for(lambda: any(e["message"] == message for e in _events(handle, "FailedMount")),
                 timeout=30, message="the FailedMount event of the broken driver")
        wait_for(lambda: _waiting(port, "bad-e2e") == "ContainerCreating", timeout=30,
                 message="the broken driver's pod ContainerCreating in /pods")
        wait_for(lambda: len([c for c in _calls(log, "mount") if "/example.com~broken/" in c[1]])
                 >= 2, timeout=30, message="the failed mount retried")
        # a failed mount leaves no folder behind (one exists while a retry is in flight: the
        # back-off between retries, 0.5 s doubling, leaves it gone most of the time)
        wait_for(lambda: not list(handle.paths.pods_dir.glob("*/volumes/example.com~broken/data")),
                 timeout=30, message="the failed mount's folder removed")
        # kill -9 of volumes: the mount is found again, not made twice
        kill9(handle, "volumes", wait_for)
        wait_for(lambda: sum(1 for line in log_lines(handle) if line.get("event") ==
                             "volumes.mount" and line.get("pod_uid") == uid) >= 2,
                 timeout=30, message="the restarted volumes process taking the mount again")
        assert len([c for c in _calls(log, "mount") if c[1] == str(folder)]) == 1
        assert mounts_under(folder) == [str(folder.resolve())]
        # the pod removed: its volume unmounted by the driver, once, and the folder gone
        (manifests / "good.json").unlink()
        wait_for(lambda: [c[1] for c in _calls(log, "unmount")] == [str(folder)], timeout=60,
                 message="the driver's unmount")
        wait_for(lambda: not folder.exists() and not mounts_under(folder), timeout=30,
                 message="the volume's folder removed")
    finally:
        handle.stop()
        for point in reversed(mounts_under(tmp_path)):
            subprocess.run(["umount", "-l", point], check=False)


def test_an_api_pods_flexvolume_gets_its_secret_and_read_only(
        agent: Any, wait_for: Callable[..., Any], tmp_path: Path) -> None:
    """An API pod: the secretRef's data read from the API server and passed as
    ``kubernetes.io/secret/<key>`` (base64), ``readOnly`` as ``kubernetes.io/readwrite: ro``."""
    from tests.services.volumes.claimpods import agent_config as api_config
    from tests.support.kubeapi import KubeApi
    plugins, source, marks = tmp_path / "exec", tmp_path / "disk", tmp_path / "marks"
    for d in (source, marks):
        d.mkdir()
    (source / "hello").write_text("secret volume\n")
    log = tmp_path / "driver.log"
    _driver(plugins, "example.com", "lvm", source, log)
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    handle = None
    try:
        server.store.create("secrets", "default", {"metadata": {"name": "creds"}, "data": {
            "password": base64.b64encode(b"s3cret").decode()}})
        pod = _pod("db", "example.com/lvm", tmp_path / "c" / "data", marks)
        pod["spec"]["volumes"][0]["flexVolume"].update(secretRef={"name": "creds"},
                                                       readOnly=True)
        pod["spec"].update(nodeName="e2e-flex", automountServiceAccountToken=False)
        uid = server.create_pod("default", pod)["metadata"]["uid"]
        handle = agent(config=api_config(server, tmp_path, "e2e-flex",
                                         volumePluginDir=str(plugins)))
        wait_for(lambda: read(marks / "db") == "secret volume", timeout=90,
                 message="the API pod reading its FlexVolume")
        folder = handle.paths.pods_dir / uid / "volumes" / "example.com~lvm" / "data"
        (call,) = [c for c in _calls(log, "mount") if c[1] == str(folder)]
        options = json.loads(call[2])
        assert options["kubernetes.io/secret/password"] == base64.b64encode(b"s3cret").decode()
        assert options["kubernetes.io/readwrite"] == "ro"
        assert options["kubernetes.io/pod.name"] == "db"
    finally:
        if handle is not None:
            handle.stop()
        server.stop()
        for point in reversed(mounts_under(tmp_path)):
            subprocess.run(["umount", "-l", point], check=False)
