"""End to end: the downward API, the API defaults, the QoS class and the OOM score adjustment,
with the real agent, on the embedded runtime and on containerd.

A pod whose container prints its environment (fieldRef, resourceFieldRef, ``$(VAR)``
expansion in env and command) and the files of its downwardAPI volume, read back with
``podvisorctl logs``; ``/pods`` shows the defaults, ``qosClass`` and ``lastProbeTime: null``;
the container's ``/proc/<pid>/oom_score_adj`` is the kubelet's value for its class, clamped as
containerd's ``restrict_oom_score_adj`` does where the machine cannot lower it (these VMs lack
CAP_SYS_RESOURCE). On containerd the pods use hostNetwork (the node has no CNI here) and sit in
``<cgroupRoot>/burstable/pod<uid>`` / ``<cgroupRoot>/pod<uid>`` by class. The containerd test
is skipped with the reason when no containerd is available (``containerd_or_skip()``).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.runtime import oom
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.cgroupfs import new_cgroup_fs
from podvisor.services.syncloop.podcgroups import hierarchy_dirs, parse_mountinfo
from tests.support.containerd import ContainerdHandle, containerd_or_skip, remove_pod_cgroup
from tests.support.lifecycle import agent_config, all_running, free_port, get_pods

MEM_LIMIT = 64 * 2**20
# "$$$$": the kubelet's expansion turns "$$" into "$" in a command, so the shell's "$$" is
# written twice (unknown "$(...)" such as the command substitutions below stay verbatim)
SCRIPT = ('echo "PID=$$$$"; echo "ARG=$1"; env | grep "^PV_" | sort; '
          'for f in name labels annotations cpu; do '
          'echo "FILE $f=$(tr "\\n" "|" < "$0/$f")"; done; '
          'echo "MODE=$(stat -L -c %a "$0/cpu") $(stat -L -c %a "$0/name")"; echo DONE; '
          "exec sleep 3600")


def env_var(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def res_var(name: str, resource: str, divisor: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"resourceFieldRef": {"resource": resource,
                                                             "divisor": divisor}}}


def downward_pod(image: str, mount: str, host_network: bool) -> dict[str, Any]:
    env = [env_var("PV_NAME", "metadata.name"), env_var("PV_NS", "metadata.namespace"),
           env_var("PV_UID", "metadata.uid"), env_var("PV_NODE", "spec.nodeName"),
           env_var("PV_LABEL", "metadata.labels['app']"),
           env_var("PV_NOTE", "metadata.annotations['note']"),
           env_var("PV_SA", "spec.serviceAccountName"),
           env_var("PV_HOST_IP", "status.hostIP"), env_var("PV_HOST_IPS", "status.hostIPs"),
           env_var("PV_POD_IP", "status.podIP"), env_var("PV_POD_IPS", "status.podIPs"),
           res_var("PV_CPU_LIMIT", "limits.cpu", "1m"),
           res_var("PV_CPU_REQ", "requests.cpu", "1m"),
           res_var("PV_MEM_LIMIT", "limits.memory", "1Mi"),
           {"name": "PV_GREETING", "value": "hi $(PV_NAME) $$(PV_NAME) $(NOPE)"}]
    items = [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
             {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
             {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
             {"path": "cpu", "mode": 0o600, "resourceFieldRef": {
                 "containerName": "c", "resource": "requests.cpu", "divisor": "1m"}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "downward", "labels": {"app": "web"},
                         "annotations": {"note": "hello"}},
            "spec": {"hostNetwork": host_network, "terminationGracePeriodSeconds": 2,
                     "volumes": [{"name": "info", "downwardAPI": {"items": items}}],
                     "containers": [{
                         "name": "c", "image": image, "imagePullPolicy": "IfNotPresent",
                         "command": ["sh", "-c", SCRIPT, mount, "$(PV_NAME)"],
                         "env": env,
                         "resources": {"limits": {"memory": "64Mi"},
                                       "requests": {"cpu": "250m"}},
                         "volumeMounts": [{"name": "info", "mountPath": mount}]}]}}


def guaranteed_pod(image: str, host_network: bool) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "guaranteed"},
            "spec": {"hostNetwork": host_network, "terminationGracePeriodSeconds": 2,
                     "containers": [{
                         "name": "c", "image": image, "imagePullPolicy": "IfNotPresent",
                         "command": ["sh", "-c",
                                     'echo "PID=$$$$"; echo DONE; exec sleep 3600'],
                         "resources": {"limits": {"cpu": "100m", "memory": "32Mi"}}}]}}


def log_lines(handle: Any, pod: str) -> list[str] | None:
    out = handle.ctl("logs", pod)
    lines = out.stdout.splitlines()
    return lines if out.returncode == 0 and "DONE" in lines else None


def parsed(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines if "=" in line)


def memory_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def runtime_oom_floor(runtime_pid: int) -> tuple[int, bool]:
    """The clamping process's own oom_score_adj and whether it may lower one."""
    return oom.own_state(Path(f"/proc/{runtime_pid}"))


def printed_pid(handle: Any, name: str, uid: str) -> int:
    """The PID the container printed ($$): the host's PID on the embedded runtime."""
    lines = log_lines(handle, name)
    assert lines is not None
    return int(parsed(lines)["PID"])


def host_pid(handle: Any, name: str, uid: str) -> int:
    """The container's `sleep 3600` seen from the host, found by its pod's cgroup (with its
    own PID namespace on containerd, the printed $$ is 1)."""
    for proc in psutil.process_iter(["cmdline"]):
        if proc.info["cmdline"] == ["sleep", "3600"]:
            try:
                if f"pod{uid}/" in Path(f"/proc/{proc.pid}/cgroup").read_text():
                    return int(proc.pid)
            except OSError:
                continue
    raise AssertionError(f"no process of pod {name} ({uid})")


def check_pod(handle: Any, port: int, wait_for: Any, host_ip: str, runtime_pid: int,
              pid_of: Any = printed_pid) -> dict[str, Any]:
    body = wait_for(lambda: (b := get_pods(port)) and all_running(b, {"downward", "guaranteed"})
                    and b, 120.0, 0.2, "both pods Running in /pods")
    items = {p["metadata"]["name"].rsplit("-", 1)[0]: p for p in body["items"]}
    pod = items["downward"]
    uid = pod["metadata"]["uid"]
    lines = wait_for(lambda: log_lines(handle, "downward"), 60.0, 0.2, "the pod's output")
    values = parsed(lines)
    ncpu = os.cpu_count() or 1
    assert {k: v for k, v in values.items() if k.startswith("PV_")} == {
        "PV_NAME": "downward-e2e", "PV_NS": "default", "PV_UID": uid, "PV_NODE": "e2e",
        "PV_LABEL": "web", "PV_NOTE": "hello", "PV_SA": "", "PV_HOST_IP": host_ip,
        "PV_HOST_IPS": host_ip, "PV_POD_IP": host_ip, "PV_POD_IPS": host_ip,
        "PV_CPU_LIMIT": str(ncpu * 1000),   # no CPU limit: the node's allocatable
        "PV_CPU_REQ": "250", "PV_MEM_LIMIT": "64",
        "PV_GREETING": "hi downward-e2e $(PV_NAME) $(NOPE)"}, lines
    assert values["ARG"] == "downward-e2e"          # $(PV_NAME) expanded in the command
    assert values["FILE name"] == "downward-e2e", lines
    assert values["FILE labels"] == 'app="web"'
    annotations = values["FILE annotations"].split("|")
    assert 'note="hello"' in annotations and 'kubernetes.io/config.source="file"' in annotations
    assert values["FILE cpu"] == "250"
    assert values["MODE"] == "600 644"
    # /pods: the API's defaults, qosClass, lastProbeTime null
    spec = pod["spec"]
    assert (spec["dnsPolicy"], spec["schedulerName"], spec["enableServiceLinks"],
            spec["securityContext"], spec["tolerations"]) == (
        "ClusterFirst", "default-scheduler", True, {},
        [{"operator": "Exists", "effect": "NoExecute"}])
    c = spec["containers"][0]
    assert (c["terminationMessagePath"], c["terminationMessagePolicy"]) == (
        "/dev/termination-log", "File")
    assert pod["status"]["qosClass"] == "Burstable"
    assert items["guaranteed"]["status"]["qosClass"] == "Guaranteed"
    assert all(cond["lastProbeTime"] is None for cond in pod["status"]["conditions"])
    # OOM score adjustment: Burstable raised (always allowed); Guaranteed clamped here
    floor, can_lower = runtime_oom_floor(runtime_pid)
    burstable = max(3, 1000 - 1000 * MEM_LIMIT // memory_total())
    pid = pid_of(handle, "downward", uid)
    assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == str(max(burstable, floor))
    wait_for(lambda: log_lines(handle, "guaranteed"), 60.0, 0.2, "guaranteed's output")
    g_pid = pid_of(handle, "guaranteed", items["guaranteed"]["metadata"]["uid"])
    expected = -997 if can_lower else max(-997, floor)
    assert Path(f"/proc/{g_pid}/oom_score_adj").read_text().strip() == str(expected)
    return items


def process_pid(handle: Any, name: str) -> int:
    out = handle.ctl("status", "--json")
    procs = {p["name"]: p for p in json.loads(out.stdout)["processes"]}
    return int(procs[name]["pid"])


@pytest.mark.timeout(200)
@pytest.mark.skipif(os.geteuid() != 0, reason="the embedded runtime's bind mounts need root")
def test_downward_api_defaults_and_qos_on_the_embedded_runtime(
        agent: Any, manifests: Path, wait_for: Any, tmp_path: Path) -> None:
    mount = str(tmp_path / "ctr" / "info")           # seen only in the container's view
    (manifests / "downward.yaml").write_text(yaml.safe_dump(downward_pod("host", mount, False)))
    (manifests / "guaranteed.yaml").write_text(yaml.safe_dump(guaranteed_pod("host", False)))
    port = free_port()
    handle = agent(config=agent_config(manifests, port, stopPodsOnExit=True,
                                       cgroupRoot=""))
    wait_for(lambda: handle.ctl("status", "--json").returncode == 0, 30.0)
    # the embedded runtime clamps by its own oom_score_adj
    check_pod(handle, port, wait_for, "127.0.0.1", process_pid(handle, "runtime"))
    assert not os.path.exists(os.path.join(mount, "name"))  # the files: in its view only
    assert handle.stop() == 0


@pytest.mark.containerd
@pytest.mark.timeout(240)
def test_downward_api_defaults_and_qos_on_containerd(agent: Any, manifests: Path,
                                                    wait_for: Any) -> None:
    containerd: ContainerdHandle = containerd_or_skip()
    (manifests / "downward.yaml").write_text(
        yaml.safe_dump(downward_pod(containerd.image, "/etc/podinfo", True)))
    (manifests / "guaranteed.yaml").write_text(
        yaml.safe_dump(guaranteed_pod(containerd.image, True)))
    port = free_port()
    cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"
    cri = new_runtime_client(containerd.endpoint, timeout=30.0)
    uids: set[str] = set()
    try:
        handle = agent(config=agent_config(manifests, port, runtimeEndpoint=containerd.endpoint,
                                           stopPodsOnExit=True, cgroupRoot=cgroup_root))
        # containerd (restrict_oom_score_adj = true) clamps by its own oom_score_adj
        items = check_pod(handle, port, wait_for, "127.0.0.1", containerd_pid(containerd),
                          host_pid)
        uids = {p["metadata"]["uid"] for p in items.values()}
        for name, folder in (("downward", "burstable/"), ("guaranteed", "")):
            uid = items[name]["metadata"]["uid"]
            pid = host_pid(handle, name, uid)
            paths = [line.split(":", 2)[2]
                     for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
            assert all(p.startswith(f"{cgroup_root}/{folder}pod{uid}/") for p in paths), paths
        assert handle.stop() == 0  # stopPodsOnExit
        wait_for(lambda: not [s for s in cri.list_pod_sandbox()
                              if s.labels.get(L.POD_UID) in uids], 60.0, 0.2, "no sandbox")
        pod_folders = [d for uid in uids for qos in ("", "burstable/")
                       for d in folders(f"{cgroup_root}/{qos}pod{uid}")]
        wait_for(lambda: not any(os.path.exists(d) for d in pod_folders), 30.0, 0.2,
                 "the pods' cgroup folders removed by the agent")
    finally:
        for sandbox in cri.list_pod_sandbox():
            if sandbox.labels.get(L.POD_UID) in uids:
                try:
                    cri.stop_pod_sandbox(sandbox.id)
                    cri.remove_pod_sandbox(sandbox.id)
                except CriError:
                    pass
        cri.close()
        remove_pod_cgroup(cgroup_root)


def folders(cgroup_path: str) -> list[str]:
    return hierarchy_dirs(parse_mountinfo(new_cgroup_fs().mountinfo()), cgroup_path)


def containerd_pid(containerd: ContainerdHandle) -> int:
    """containerd's PID: the process run with its instance's config (deploy/containerd)."""
    instance = str(Path(containerd.socket_path).parent.parent) + "/"
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "containerd" and instance in " ".join(proc.info["cmdline"] or []):
            return int(proc.pid)
    raise AssertionError(f"no containerd process runs the instance in {instance}")
