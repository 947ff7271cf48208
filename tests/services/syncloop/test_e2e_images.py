"""A real agent (embedded runtime) and a real registry: a static pod of a registry image is
pulled (Pulling/Pulled events), runs inside the image's root filesystem, `podvisorctl images`
lists it with its size; a missing tag shows ErrImagePull then ImagePullBackOff; `images pull`
and `images rm` work on the same runtime."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.registry import registries

POD = """apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {image}
    args: ["sh", "-c", "readlink /bin/sh; cat /etc/hostname; exec sleep 3600"]
"""


def _pod(handle: Any, name: str) -> dict[str, Any] | None:
    out = handle.ctl("pods", "--json")
    if out.returncode != 0:
        return None
    for item in json.loads(out.stdout)["items"]:
        if item["metadata"]["name"].startswith(name + "-"):
            return item  # type: ignore[no-any-return]
    return None


def _waiting(handle: Any, name: str) -> str:
    pod = _pod(handle, name)
    for c in (pod or {}).get("status", {}).get("containerStatuses", []):
        return str(c.get("state", {}).get("waiting", {}).get("reason", ""))
    return ""


def _running(handle: Any, name: str) -> bool:
    pod = _pod(handle, name)
    return bool(pod) and pod["status"].get("phase") == "Running"  # type: ignore[index]


@pytest.mark.timeout(170)
def test_registry_pod_images_and_pull_errors(agent: Any, wait_for: Any) -> None:
    base = Path(tempfile.mkdtemp(prefix="pvimg", dir="/tmp"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        anon, _ = stack.enter_context(registries(base / "reg"))
        manifests = base / "manifests"
        manifests.mkdir()
        ref = f"{anon.host}/podvisor/busybox:1"
        (manifests / "img.yaml").write_text(POD.format(name="img", image=ref))
        (manifests / "missing.yaml").write_text(
            POD.format(name="missing", image=f"{anon.host}/podvisor/busybox:nope"))
        handle = agent(config={
            "nodeName": "e2e", "staticPodPath": str(manifests), "stopPodsOnExit": True,
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})
        wait_for(lambda: _running(handle, "img"), 60.0, message="the image pod running")
        log = wait_for(lambda: (r := handle.ctl("logs", "img")).returncode == 0
                       and "e2e" in r.stdout and r.stdout, 30.0)
        assert "busybox" in log  # the image's /bin/sh
        out = handle.ctl("images")
        assert out.returncode == 0, out.stderr
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith(ref.rsplit(":", 1)[0]))
        assert "MB" in line.split()[-1] or "kB" in line.split()[-1], line
        listed = json.loads(handle.ctl("images", "--json").stdout)
        assert any(ref in i["repoTags"] and i["size"] > 500_000 for i in listed)
        # the missing tag: ErrImagePull, then ImagePullBackOff, with the registry's reason
        wait_for(lambda: _waiting(handle, "missing") == "ErrImagePull", 60.0)
        wait_for(lambda: _waiting(handle, "missing") == "ImagePullBackOff", 60.0)
        ev = json.loads(handle.ctl("events", "--json").stdout)["items"]
        reasons = {(e["involvedObject"].get("name", "").split("-")[0], e["reason"]) for e in ev}
        assert {("img", "Pulling"), ("img", "Pulled"), ("missing", "Failed"),
                ("missing", "BackOff")} <= reasons, reasons
        failed = [e["message"] for e in ev if e["reason"] == "Failed"]
        assert any("manifest unknown" in m for m in failed), failed
        # images pull / rm on the agent's runtime (a second tag of the same image)
        out = handle.ctl("images", "pull", ref)
        assert out.returncode == 0 and "pulled sha256:" in out.stdout, out.stderr
        out = handle.ctl("images", "rm", "busybox:nope")
        assert out.returncode == 1 and "no such image" in out.stderr
        out = handle.ctl("images", "pull", f"{anon.host}/podvisor/busybox:nope")
        assert out.returncode == 1 and "manifest unknown" in out.stderr
        # removed while its container runs: the layers under the container stay
        out = handle.ctl("images", "rm", ref)
        assert out.returncode == 0 and out.stdout.strip() == f"Deleted: {ref}", out.stderr
        assert ref not in handle.ctl("images").stdout
        assert _running(handle, "img")
        # images load: an OCI archive and a docker-archive, then a pod that never pulls
        oci = base / "reg" / "busybox.tar"  # built by the registry helper (OCI layout)
        docker = base / "docker.tar"
        subprocess.run(["skopeo", "copy", f"oci-archive:{oci}",
                        f"docker-archive:{docker}:localhost/podvisor/dockerarch:1"],
                       check=True, capture_output=True, timeout=120)
        out = handle.ctl("images", "load", str(oci))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "Loaded image: localhost/podvisor/busybox:1"
        out = handle.ctl("images", "load", str(docker))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "Loaded image: localhost/podvisor/dockerarch:1"
        tags = {t for i in json.loads(handle.ctl("images", "--json").stdout)
                for t in i["repoTags"]}
        assert {"localhost/podvisor/busybox:1", "localhost/podvisor/dockerarch:1"} <= tags
        (manifests / "loaded.yaml").write_text(POD.format(
            name="loaded", image="localhost/podvisor/dockerarch:1").replace(
            "    args:", "    imagePullPolicy: Never\n    args:"))
        wait_for(lambda: _running(handle, "loaded"), 60.0, message="the loaded image's pod")
        out = handle.ctl("images", "load", str(manifests / "img.yaml"))
        assert out.returncode == 1 and "images load" in out.stderr
