"""CRI contract: the container's security context (what the sync loop sends, as the kubelet does).

Both runtimes, the same expectations: the user, group and groups asked for; containerd's
default capability set when nothing is said (not all of root's); add/drop with ALL; a non-root
user without effective capabilities; no_new_privs; privileged = every capability the runtime
holds; a read-only root with writable volumes; the kubelet's masked and read-only /proc paths;
ExecSync (exec probes, preStop hooks) with the container's user and capabilities. The embedded
runtime's refusals (what it cannot enforce) are checked at CreateContainer / RunPodSandbox.
The C and the Python monitor both run ``check_identity`` (test_embedded_monitors).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from podvisor.services.pod.security import DEFAULT_MASKED_PATHS, DEFAULT_READONLY_PATHS
from podvisor.services.runtime.security import CAP_NAMES, DEFAULT_CAPS, cap_set, mask_of
from tests.services.conftest import RuntimeUnderTest, only_embedded, runs_processes
from tests.services.cri.test_contract_io import parse_log

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changing users and capabilities "
                                                         "needs a runtime running as root")

REPORT = ("echo uid=$(id -u) gid=$(id -g) groups=$(id -G | tr ' ' ,); "
          "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs):' /proc/self/status | tr -d '\\t'")
Secure = Callable[[pb.LinuxContainerSecurityContext], None]


def own_bounding() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapBnd:"):
                return int(line.split()[1], 16)
    raise AssertionError("no CapBnd")


def run_report(rt: RuntimeUnderTest, name: str, secure: Secure,
               script: str = REPORT, privileged: bool = False) -> dict[str, str]:
    """Run ``script`` in a container whose security context ``secure`` fills in; its
    ``key=value`` / ``Key:value`` output as a dict."""
    sconfig = rt.sandbox_config(name)
    sconfig.linux.security_context.privileged = privileged
    sid = rt.client.run_pod_sandbox(sconfig)
    config = rt.container_config("c", ["sh", "-c", script])
    secure(config.linux.security_context)
    cid = rt.client.create_container(sid, config, sconfig)
    rt.client.start_container(cid)
    status = rt.wait_exited(cid, 30.0)
    lines = [text for stream, _tag, text in parse_log(status.log_path) if stream == "stdout"]
    assert status.exit_code == 0, lines
    out: dict[str, str] = {}
    for line in lines:
        for word in line.split():
            key, sep, value = word.partition("=") if "=" in word else word.partition(":")
            if sep:
                out[key] = value
    return out


def caps(report: dict[str, str], key: str) -> int:
    return int(report[key], 16)


def check_identity(rt: RuntimeUnderTest) -> None:
    """Users, groups, capabilities and no_new_privs, as both runtimes apply them."""
    default = run_report(rt, "default", lambda sc: None)
    assert (default["uid"], default["gid"]) == ("0", "0")
    assert caps(default, "CapEff") == caps(default, "CapBnd") == mask_of(DEFAULT_CAPS)
    assert default["NoNewPrivs"] == "0"

    def nobody(sc: pb.LinuxContainerSecurityContext) -> None:
        sc.run_as_user.value = 65534
        sc.run_as_group.value = 65534
        sc.supplemental_groups.extend([1234, 5678])
    user = run_report(rt, "nobody", nobody)
    assert (user["uid"], user["gid"]) == ("65534", "65534")
    assert {"1234", "5678"} <= set(user["groups"].split(","))
    assert caps(user, "CapEff") == caps(user, "CapPrm") == 0  # non-root: no effective caps
    assert caps(user, "CapBnd") == mask_of(DEFAULT_CAPS)

    def drop_all(sc: pb.LinuxContainerSecurityContext) -> None:
        sc.capabilities.drop_capabilities.append("ALL")
        sc.no_new_privs = True
    dropped = run_report(rt, "dropall", drop_all)
    assert caps(dropped, "CapEff") == caps(dropped, "CapBnd") == 0
    assert dropped["NoNewPrivs"] == "1"

    def add_drop(sc: pb.LinuxContainerSecurityContext) -> None:
        sc.capabilities.add_capabilities.append("NET_ADMIN")
        sc.capabilities.drop_capabilities.extend(["CHOWN", "MKNOD"])
    changed = run_report(rt, "adddrop", add_drop)
    assert caps(changed, "CapEff") == cap_set(["NET_ADMIN"], ["CHOWN", "MKNOD"], "")[0]


def test_identity_and_capabilities(cri_runtime: RuntimeUnderTest) -> None:
    runs_processes(cri_runtime, "a process's identity, capabilities and mounts")
    check_identity(cri_runtime)


def test_privileged_gets_every_capability_the_runtime_holds(cri_runtime: RuntimeUnderTest
                                                            ) -> None:
    runs_processes(cri_runtime, "a process's identity, capabilities and mounts")
    def privileged(sc: pb.LinuxContainerSecurityContext) -> None:
        sc.privileged = True
    report = run_report(cri_runtime, "priv", privileged, privileged=True)
    assert caps(report, "CapEff") == own_bounding()
    # A privileged container needs a privileged sandbox (containerd's rule, the sync loop's
    # sandbox config follows the kubelet's: privileged when any container is).
    sid, sconfig = cri_runtime.run("unpriv")
    config = cri_runtime.container_config("c", ["true"])
    config.linux.security_context.privileged = True
    with pytest.raises(CriError, match="no privileged container allowed in sandbox"):
        cri_runtime.client.create_container(sid, config, sconfig)


def test_exec_runs_as_the_container(cri_runtime: RuntimeUnderTest) -> None:
    """ExecSync (exec probes, preStop hooks) with the container's user, groups and caps."""
    runs_processes(cri_runtime, "a process's identity, capabilities and mounts")
    sid, sconfig = cri_runtime.run("exec")
    config = cri_runtime.container_config("c", ["sleep", "1000"])
    sc = config.linux.security_context
    sc.run_as_user.value = 65534
    sc.run_as_group.value = 65534
    sc.supplemental_groups.append(4321)
    sc.no_new_privs = True
    cid = cri_runtime.client.create_container(sid, config, sconfig)
    cri_runtime.client.start_container(cid)
    resp = cri_runtime.client.exec_sync(cid, ["sh", "-c", REPORT], 10)
    assert resp.exit_code == 0, resp.stderr
    text = resp.stdout.decode()
    assert "uid=65534 gid=65534" in text and "4321" in text, text
    assert "CapEff:0000000000000000" in text and "NoNewPrivs:1" in text, text


def test_read_only_root_with_writable_volume(cri_runtime: RuntimeUnderTest) -> None:
    runs_processes(cri_runtime, "a process's identity, capabilities and mounts")
    check_read_only_root(cri_runtime)


def check_read_only_root(rt: RuntimeUnderTest) -> None:
    vol = rt.tmp / "vol"
    vol.mkdir()
    probe = f"/pv-ro-{uuid.uuid4().hex[:8]}"
    script = (f"if touch {probe} 2>/dev/null; then echo root=writable; rm -f {probe}; "
              "else echo root=readonly; fi; echo ok > /data/out && echo volume=writable")
    sid, sconfig = rt.run("ro")
    config = rt.container_config("c", ["sh", "-c", script])
    config.linux.security_context.readonly_rootfs = True
    config.mounts.append(pb.Mount(host_path=str(vol), container_path="/data"))
    cid = rt.client.create_container(sid, config, sconfig)
    rt.client.start_container(cid)
    status = rt.wait_exited(cid, 30.0)
    out = [t for s, _tag, t in parse_log(status.log_path) if s == "stdout"]
    assert not Path(probe).exists()
    assert out == ["root=readonly", "volume=writable"], out
    assert (vol / "out").read_text() == "ok\n"


def test_masked_and_read_only_proc_paths(cri_runtime: RuntimeUnderTest) -> None:
    runs_processes(cri_runtime, "a process's identity, capabilities and mounts")
    check_masked_paths(cri_runtime)


def check_masked_paths(rt: RuntimeUnderTest) -> None:
    """The kubelet's defaults: /proc/kcore reads as empty, /proc/sys is mounted read-only."""
    script = ("echo kcore=$(head -c 16 /proc/kcore | wc -c); "
              "awk '$5==\"/proc/sys\"{split($6,o,\",\"); print \"procsys=\" o[1]}' "
              "/proc/self/mountinfo")

    def defaults(sc: pb.LinuxContainerSecurityContext) -> None:
        sc.masked_paths.extend(DEFAULT_MASKED_PATHS)
        sc.readonly_paths.extend(DEFAULT_READONLY_PATHS)
    report = run_report(rt, "masked", defaults, script)
    assert report == {"kcore": "0", "procsys": "ro"}


# --- what the embedded runtime refuses ----------------------------------------------------------

def _refused(rt: RuntimeUnderTest, secure: Secure) -> str:
    sid, sconfig = rt.run(f"refused-{uuid.uuid4().hex[:6]}")
    config = rt.container_config("c", ["true"])
    secure(config.linux.security_context)
    with pytest.raises(CriError) as info:
        rt.client.create_container(sid, config, sconfig)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return info.value.message


def test_embedded_refuses_what_it_cannot_enforce(cri_runtime: RuntimeUnderTest) -> None:
    only_embedded(cri_runtime, "containerd enforces these")
    rt = cri_runtime

    def apparmor(sc: pb.LinuxContainerSecurityContext) -> None:
        sc.apparmor.profile_type = pb.SecurityProfile.Localhost
        sc.apparmor.localhost_ref = "k8s-deny-write"
    assert "AppArmor profile Localhost is not supported" in _refused(rt, apparmor)

    def selinux(sc: pb.LinuxContainerSecurityContext) -> None:
        sc.selinux_options.level = "s0:c123,c456"
    assert "SELinux labels are not supported" in _refused(rt, selinux)

    def unknown(sc: pb.LinuxContainerSecurityContext) -> None:
        sc.capabilities.add_capabilities.append("FLY")
    assert "unknown capability 'FLY'" in _refused(rt, unknown)

    missing = [name for bit, name in enumerate(CAP_NAMES) if not own_bounding() >> bit & 1]
    if missing:  # a capability this runtime does not hold is refused, never left out
        def add(sc: pb.LinuxContainerSecurityContext) -> None:
            sc.capabilities.add_capabilities.append(missing[0])
        assert f"cannot grant capabilities {missing[0]}" in _refused(rt, add)


def test_embedded_refuses_sysctls(cri_runtime: RuntimeUnderTest) -> None:
    only_embedded(cri_runtime, "containerd sets them in the pod's own namespaces")
    config = cri_runtime.sandbox_config("sysctl")
    config.linux.sysctls["kernel.shm_rmid_forced"] = "1"
    with pytest.raises(CriError) as info:
        cri_runtime.client.run_pod_sandbox(config)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "sysctls (kernel.shm_rmid_forced) are not supported by the embedded runtime" in (
        info.value.message)


def test_embedded_refuses_port_mappings_it_cannot_make(cri_runtime: RuntimeUnderTest) -> None:
    """In networkPlugin: host (the default) the embedded runtime's pods use the node's network:
    a port is the node's port on every address, so a hostPort other than the containerPort, or
    a hostIP, is refused with the reason (containerd and networkPlugin: cni map them with CNI
    portmap: test_embedded_network test_host_ip_binds_the_host_port_to_that_address)."""
    only_embedded(cri_runtime, "containerd maps ports (CNI portmap)")
    for mapping in (pb.PortMapping(container_port=80, host_port=8080),
                    pb.PortMapping(container_port=80, host_port=80, host_ip="127.0.0.1")):
        config = cri_runtime.sandbox_config(f"ports-{uuid.uuid4().hex[:6]}")
        config.port_mappings.append(mapping)
        with pytest.raises(CriError) as info:
            cri_runtime.client.run_pod_sandbox(config)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "the embedded runtime maps no ports" in info.value.message
    same = cri_runtime.sandbox_config("ports-same")
    same.port_mappings.append(pb.PortMapping(container_port=80, host_port=80))
    cri_runtime.client.run_pod_sandbox(same)
