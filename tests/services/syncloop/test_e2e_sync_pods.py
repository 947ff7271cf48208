"""End to end with the real agent and embedded runtime: the sync loop runs pods from manifests.

Edit a command -> only that container is replaced; delete a manifest -> TERM, then KILL after
the grace; restart policies; CrashLoopBackOff with a small configured cap; init containers in
order; kill -9 of syncloop -> same container IDs, no restarts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import new_runtime_client
from podvisor.services.cri.client import RuntimeClient
from podvisor.services.syncloop import labels as L
from tests.cli.test_e2e_logs_events import has_event

# The file source is not (yet) in the supervisor's builtin list: declare it here.
SOURCES = {"source-file": {"module": "podvisor.services.sources.file_main"}}


def start(agent: Any, manifests: Path, wait_for: Any, **extra: Any) -> tuple[Any, RuntimeClient]:
    handle = agent(config={
        "nodeName": "e2e", "port": 0, "staticPodPath": str(manifests), "fileCheckFrequency": "1s",
        "syncloop": {"crashLoopBackOffInitial": "1s", "crashLoopBackOffMax": "2s"},
        "stopPodsOnExit": True, "opsPort": 0,
        "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s",
                        "processes": SOURCES}, **extra})
    wait_for(lambda: handle.paths.cri_socket.exists(), 30.0)
    cri = new_runtime_client(f"unix://{handle.paths.cri_socket}", timeout=5.0)
    return handle, cri


def pod_yaml(name: str, containers: str, policy: str = "Always", grace: int = 2,
             init: str = "") -> str:
    """A pod with a fixed UID (``uid-<name>``): an edit updates the pod in place (a manifest
    without a UID gets one from its content, so an edit would be a new pod)."""
    out = (f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  uid: uid-{name}\n"
           "spec:\n"
           f"  restartPolicy: {policy}\n  terminationGracePeriodSeconds: {grace}\n")
    if init:
        out += "  initContainers:\n" + init
    return out + "  containers:\n" + containers


def ctr(name: str, cmd: str) -> str:
    return f"  - name: {name}\n    image: host\n    command: [\"sh\", \"-c\", {cmd!r}]\n"


def containers(cri: RuntimeClient, pod_name: str) -> list[pb.Container]:
    return [c for c in cri.list_containers()
            if c.labels.get(L.POD_NAME, "").startswith(pod_name + "-")]


def running(cri: RuntimeClient, pod_name: str) -> dict[str, str]:
    return {c.labels[L.CONTAINER_NAME]: c.id for c in containers(cri, pod_name)
            if c.state == pb.CONTAINER_RUNNING}


def restarts(cri: RuntimeClient, pod_name: str, name: str) -> int:
    counts = [int(c.annotations[L.RESTART_COUNT]) for c in containers(cri, pod_name)
              if c.labels[L.CONTAINER_NAME] == name]
    return max(counts, default=-1)


@pytest.mark.timeout(120)
def test_run_edit_delete(agent: Any, manifests: Path, wait_for: Any) -> None:
    (manifests / "web.yaml").write_text(pod_yaml(
        "web", ctr("a", "sleep 1000") + ctr("b", "trap '' TERM; sleep 1000")), "utf-8")
    _handle, cri = start(agent, manifests, wait_for)
    try:
        first = wait_for(lambda: (r := running(cri, "web")) and len(r) == 2 and r, 60.0)
        (manifests / "web.yaml").write_text(pod_yaml(
            "web", ctr("a", "sleep 1001") + ctr("b", "trap '' TERM; sleep 1000")), "utf-8")
        second = wait_for(lambda: (r := running(cri, "web")) and len(r) == 2
                          and r["a"] != first["a"] and r, 60.0)
        assert second["b"] == first["b"]
        (manifests / "web.yaml").unlink()
        wait_for(lambda: not containers(cri, "web"), 60.0)
    finally:
        cri.close()


@pytest.mark.timeout(150)
def test_policies_crashloop_init_and_kill9_syncloop(agent: Any, manifests: Path,
                                                    wait_for: Any) -> None:
    for policy in ("Always", "OnFailure", "Never"):
        for code in (0, 1):
            name = f"{policy.lower()}{code}"
            (manifests / f"{name}.yaml").write_text(pod_yaml(
                name, ctr("c", f"sleep 0.2; exit {code}"), policy=policy), "utf-8")
    (manifests / "init.yaml").write_text(pod_yaml(
        "init", ctr("main", "sleep 1000"),
        init=ctr("i1", "echo one >> /tmp/$$$$.x; sleep 0.3") + ctr("i2", "sleep 0.1")), "utf-8")
    (manifests / "steady.yaml").write_text(pod_yaml("steady", ctr("s", "sleep 1000")), "utf-8")
    handle, cri = start(agent, manifests, wait_for)
    try:
        # Always restarts on 0 and 1; OnFailure only on 1; Never never.
        wait_for(lambda: restarts(cri, "always0", "c") >= 3 and restarts(cri, "always1", "c") >= 3
                 and restarts(cri, "onfailure1", "c") >= 2, 60.0)
        wait_for(lambda: all(
            c.state == pb.CONTAINER_EXITED for n in ("onfailure0", "never0", "never1")
            for c in containers(cri, n)) and all(containers(cri, n) for n in (
                "onfailure0", "never0", "never1")), 30.0)
        assert restarts(cri, "onfailure0", "c") == 0
        assert restarts(cri, "never0", "c") == 0 and restarts(cri, "never1", "c") == 0
        # init containers ran in order, then main
        main = wait_for(lambda: running(cri, "init").get("main"), 30.0)
        by_name = {c.labels[L.CONTAINER_NAME]: c for c in containers(cri, "init")}
        assert by_name["i1"].created_at < by_name["i2"].created_at < by_name["main"].created_at
        # kill -9 the sync loop: the steady pod keeps its container, no restart
        steady = wait_for(lambda: running(cri, "steady").get("s"), 30.0)
        old = handle.state("syncloop")
        handle.call("kill", name="syncloop", signal="KILL")
        wait_for(lambda: handle.state("syncloop")["state"] == "RUNNING"
                 and handle.state("syncloop")["pid"] != old["pid"], 30.0)
        # the new sync loop has seen the sources again once the always1 pod restarts again
        seen = restarts(cri, "always1", "c")
        wait_for(lambda: restarts(cri, "always1", "c") > seen, 30.0)
        assert running(cri, "steady") == {"s": steady}
        assert running(cri, "init") == {"main": main}
        assert restarts(cri, "steady", "s") == 0
    finally:
        cri.close()


@pytest.mark.timeout(120)
@pytest.mark.skipif(os.geteuid() != 0, reason="the embedded runtime's bind mounts need root")
def test_volumes_are_mounted_for_containers_and_exec_probes(
        agent: Any, manifests: Path, wait_for: Any, tmp_path: Path) -> None:
    """An emptyDir shared by an init container and the main one (read-only there), a hostPath,
    and an exec readiness probe that reads the emptyDir: each sees the pod's volumes at their
    mountPaths, which exist only in the containers' view."""
    work, host = tmp_path / "ctr" / "work", tmp_path / "host"
    mounts = (f"    volumeMounts:\n    - name: work\n      mountPath: {work}\n"
              f"    - name: host\n      mountPath: {tmp_path}/ctr/host\n")
    main = (ctr("main", f"cat {work}/log > {tmp_path}/ctr/host/seen; exec sleep 1000")
            + mounts.replace(f"{work}\n", f"{work}\n      readOnly: true\n")
            + "    readinessProbe:\n      periodSeconds: 1\n      exec:\n        command: "
            f"[sh, -c, 'cat {work}/log >> {tmp_path}/ctr/host/probed']\n")
    spec = pod_yaml("vols", main, init=ctr("fill", f"echo init >> {work}/log") + mounts)
    spec = spec.replace("  initContainers:\n", "  volumes:\n  - name: work\n    emptyDir: {}\n"
                        f"  - name: host\n    hostPath:\n      path: {host}\n"
                        "      type: DirectoryOrCreate\n  initContainers:\n")
    (manifests / "vols.yaml").write_text(spec, "utf-8")
    _handle, cri = start(agent, manifests, wait_for)
    try:
        wait_for(lambda: running(cri, "vols").get("main"), 60.0)
        wait_for(lambda: (host / "seen").exists() and (host / "seen").read_text(), 30.0)
        assert (host / "seen").read_text() == "init\n"
        wait_for(lambda: (host / "probed").exists()
                 and (host / "probed").read_text().startswith("init\n"), 30.0)
        assert not (work / "log").exists()  # the host never sees the container's mounts
        assert restarts(cri, "vols", "main") == 0
    finally:
        cri.close()


@pytest.mark.timeout(120)
def test_a_host_path_that_fails_its_type_check_holds_only_its_pod(
        agent: Any, manifests: Path, wait_for: Any, tmp_path: Path) -> None:
    """hostPath type Directory on a missing path: a FailedMount event, no container for that
    pod while every other pod runs; once the directory exists the pod starts (the worker's
    retry), as with the kubelet's volume manager."""
    data = tmp_path / "data"
    spec = pod_yaml("needsdir", ctr("main", "sleep 1000"))
    spec = spec.replace("  containers:\n", "  volumes:\n  - name: data\n    hostPath:\n"
                        f"      path: {data}\n      type: Directory\n  containers:\n")
    (manifests / "needsdir.yaml").write_text(spec, "utf-8")
    (manifests / "fine.yaml").write_text(pod_yaml("fine", ctr("c", "sleep 1000")), "utf-8")
    handle, cri = start(agent, manifests, wait_for)
    try:
        wait_for(lambda: has_event(handle, "needsdir-e2e", "FailedMount",
                                   f"hostPath type check failed: {data} is not a directory"),
                 60.0, message="the FailedMount event")
        wait_for(lambda: running(cri, "fine").get("c"), 60.0)
        assert containers(cri, "needsdir") == []
        data.mkdir()
        wait_for(lambda: running(cri, "needsdir").get("main"), 60.0)
    finally:
        cri.close()
