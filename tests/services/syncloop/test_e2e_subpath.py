"""End to end, on the embedded runtime and on containerd: ``subPathExpr`` is expanded from the
container's environment (here a downward API ``fieldRef``), so each pod writes under its own
directory of the volume; a ``subPathExpr`` naming a variable with no value keeps the container
waiting with CreateContainerConfigError and the kubelet's message."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.lifecycle import agent_config, free_port, get_pods

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")


def pod(name: str, image: str, expr: str, shared: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                     "volumes": [{"name": "out", "hostPath": {"path": shared}}],
                     "containers": [{
                         "name": "c", "image": image,
                         "command": ["sh", "-c", "echo hi > /out/report; exec sleep 3600"],
                         "env": [{"name": "POD_NAME", "valueFrom": {
                             "fieldRef": {"fieldPath": "metadata.name"}}}],
                         "volumeMounts": [{"name": "out", "mountPath": "/out",
                                           "subPathExpr": expr}]}]}}


@pytest.mark.timeout(170)
def test_sub_path_expr(pod_runtime: dict[str, Any], agent: Any, wait_for: Any) -> None:
    manifests = Path(tempfile.mkdtemp(prefix="pvsub", dir="/tmp"))
    shared = Path(tempfile.mkdtemp(prefix="pvsubvol", dir="/tmp"))
    try:
        for name, expr in (("alpha", "pods/$(POD_NAME)"), ("beta", "pods/$(POD_NAME)"),
                           ("broken", "$(NOPE)")):
            (manifests / f"{name}.yaml").write_text(
                yaml.safe_dump(pod(name, pod_runtime["image"], expr, str(shared))), "utf-8")
        port = free_port()
        agent(config=agent_config(manifests, port, **pod_runtime["config"]))
        for name in ("alpha", "beta"):
            report = shared / "pods" / f"{name}-e2e" / "report"
            # the content, not the file: the shell's `>` makes the file before `echo` writes
            wait_for(lambda r=report: r.exists() and r.read_text() == "hi\n", 120.0, 0.2,
                     f"{name}'s report")
        assert not (shared / "report").exists()

        def waiting() -> dict[str, Any] | None:
            for p in (get_pods(port) or {"items": []})["items"]:
                if p["metadata"]["name"] == "broken-e2e":
                    for c in p["status"].get("containerStatuses", []):
                        w = c.get("state", {}).get("waiting", {})
                        if w.get("reason") == "CreateContainerConfigError":
                            return dict(w)
            return None

        found = wait_for(waiting, 120.0, 0.2, "broken waiting with CreateContainerConfigError")
        assert found["message"] == "missing value for NOPE"
    finally:
        shutil.rmtree(manifests, ignore_errors=True)
        shutil.rmtree(shared, ignore_errors=True)
