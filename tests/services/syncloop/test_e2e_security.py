"""End to end, the same pods on the embedded runtime and on containerd (skipped with the reason
when none is available): a pod meeting the "restricted" Pod Security Standard
(``runAsNonRoot``, ``runAsUser: 65534``, ``seccompProfile: RuntimeDefault``,
``capabilities.drop: [ALL]``, ``allowPrivilegeEscalation: false``) with an ``fsGroup`` runs as
uid 65534 with an empty effective set, no_new_privs and a seccomp filter, writing into its
emptyDir as group fsGroup; a pod with
``runAsNonRoot: true`` whose image runs as root is refused with the kubelet's message, visible
in ``/pods``; on the embedded runtime a pod whose security context fails in the monitor's
child (more supplemental groups than NGROUPS_MAX) shows ``security context: setgroups: ...``
in ``/pods``."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from podvisor.services.cri import new_runtime_client
from tests.support.lifecycle import agent_config, free_port, get_pods

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changing users needs root")

REPORT = ("id -u > /out/r.tmp; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status"
          " >> /out/r.tmp; mv /out/r.tmp /out/report; exec sleep 3600")


def pods(image: str) -> dict[str, dict[str, Any]]:
    def pod(name: str, command: str, spec_sc: dict[str, Any], sc: dict[str, Any],
            volumes: bool = False) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "c", "image": image,
                                     "command": ["sh", "-c", command], "securityContext": sc}
        spec: dict[str, Any] = {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                                "securityContext": spec_sc, "containers": [container]}
        if volumes:
            spec["volumes"] = [{"name": "out", "emptyDir": {}}]
            container["volumeMounts"] = [{"name": "out", "mountPath": "/out"}]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}

    return {
        "unprivileged": pod("unprivileged", REPORT, {  # the "restricted" standard
            "runAsUser": 65534, "runAsNonRoot": True, "fsGroup": 2345,
            "seccompProfile": {"type": "RuntimeDefault"}},
                            {"capabilities": {"drop": ["ALL"]},
                             "allowPrivilegeEscalation": False}, volumes=True),
        "nonroot": pod("nonroot", "sleep 3600", {"runAsNonRoot": True}, {}),
        # more groups than NGROUPS_MAX (65536): setgroups(2) fails in the container's child
        "toomanygroups": pod("toomanygroups", "sleep 3600",
                             {"supplementalGroups": list(range(100_000, 165_537))}, {}),
    }


@pytest.mark.timeout(170)
def test_security_context_end_to_end(pod_runtime: dict[str, Any], agent: Any,
                                     wait_for: Any) -> None:
    manifests = Path(tempfile.mkdtemp(prefix="pvsec", dir="/tmp"))
    try:
        for name, doc in pods(pod_runtime["image"]).items():
            (manifests / f"{name}.yaml").write_text(yaml.safe_dump(doc), "utf-8")
        port = free_port()
        handle = agent(config=agent_config(manifests, port, **pod_runtime["config"]))
        root = Path(handle.config["rootDir"])

        def refused() -> dict[str, Any] | None:
            body = get_pods(port) or {"items": []}
            for p in body["items"]:
                if p["metadata"]["name"] == "nonroot-e2e":
                    for c in p["status"].get("containerStatuses", []):
                        waiting = c.get("state", {}).get("waiting", {})
                        if waiting.get("reason") == "CreateContainerConfigError":
                            return {"pod": p, "waiting": waiting}
            return None

        def start_failed() -> dict[str, Any] | None:
            """The start failure, from the status (RunContainerError until the next sync turns
            it into CrashLoopBackOff: a short window a loaded machine can miss) or from the
            pod's Failed event, which keeps it (as `kubectl describe pod` shows it)."""
            body = get_pods(port) or {"items": []}
            for p in body["items"]:
                if p["metadata"]["name"] == "toomanygroups-e2e":
                    for c in p["status"].get("containerStatuses", []):
                        waiting = c.get("state", {}).get("waiting", {})
                        if waiting.get("reason") == "RunContainerError":
                            return dict(waiting)
            for e in handle.call("events", pod="default/toomanygroups-e2e")["items"]:
                if e.get("reason") == "Failed" and "RunContainerError" in e.get("message", ""):
                    return {"message": e["message"]}
            return None

        if "endpoint" not in pod_runtime:  # the embedded runtime's monitors name the failed step
            waiting = wait_for(start_failed, 120.0, 0.2, "toomanygroups failing to start")
            assert "security context: setgroups: Invalid argument (errno 22 EINVAL)" in \
                waiting["message"], waiting

        found = wait_for(refused, 120.0, 0.2, "nonroot refused in /pods")
        uid = found["pod"]["metadata"]["uid"]
        assert found["waiting"]["message"] == (
            "container has runAsNonRoot and image will run as root "
            f'(pod: "nonroot-e2e_default({uid})", container: c)')

        reports = wait_for(lambda: list(root.glob(
            "pods/*/volumes/kubernetes.io~empty-dir/out/report")), 120.0, 0.2,
            "the unprivileged pod's report")
        lines = reports[0].read_text().split()
        assert lines == ["65534", "CapEff:", "0000000000000000", "NoNewPrivs:", "1",
                         "Seccomp:", "2"], lines  # 2: a seccomp filter
        assert reports[0].stat().st_gid == 2345  # fsGroup: the volume's setgid group
        assert reports[0].stat().st_uid == 65534
        if "endpoint" in pod_runtime:
            assert handle.stop() == 0  # stopPodsOnExit: containerd's pods go with the agent
            cri = new_runtime_client(pod_runtime["endpoint"], timeout=30.0)
            try:
                wait_for(lambda: not [s for s in cri.list_pod_sandbox()
                                      if s.metadata.name in ("nonroot-e2e", "unprivileged-e2e",
                                                             "toomanygroups-e2e")
                                      and s.metadata.namespace == "default"
                                      and s.state == 0], 60.0, 0.2, "sandboxes stopped")
            finally:
                cri.close()
    finally:
        shutil.rmtree(manifests, ignore_errors=True)
