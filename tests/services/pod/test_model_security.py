"""Security contexts: parsing with the API's validation, the kubelet's merge, the CRI form the
sync loop sends, the runAsNonRoot check, fsGroup volume ownership; the embedded runtime's
capability arithmetic and refusals (pure functions)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.pod import PodValidationError, pod_from_dict
from podvisor.services.pod.security import (
    DEFAULT_MASKED_PATHS,
    ProfileType,
    effective_security_context,
)
from podvisor.services.runtime.faults import Fault
from podvisor.services.runtime.security import (
    DEFAULT_CAPS,
    HostSecurity,
    cap_set,
    container_security,
    mask_of,
    names_of,
    sandbox_security,
)
from podvisor.services.syncloop import cri_config
from podvisor.services.syncloop.volumes import set_volume_ownership


def pod(spec_sc: dict[str, Any] | None = None, sc: dict[str, Any] | None = None,
        host_network: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "host", "command": ["true"]}
    if sc is not None:
        container["securityContext"] = sc
    spec: dict[str, Any] = {"containers": [container], "hostNetwork": host_network}
    if spec_sc is not None:
        spec["securityContext"] = spec_sc
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "uid": "u1"},
            "spec": spec}


def errors(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(PodValidationError) as info:
        pod_from_dict(doc)
    return [str(e) for e in info.value.errors]


def test_round_trip_and_merge() -> None:
    doc = pod({"runAsUser": 1000, "runAsGroup": 3000, "runAsNonRoot": True, "fsGroup": 2000,
               "supplementalGroups": [5, 6], "fsGroupChangePolicy": "OnRootMismatch",
               "seLinuxChangePolicy": "MountOption", "seccompProfile": {"type": "RuntimeDefault"},
               "sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}]},
              {"runAsUser": 1001, "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]},
               "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
               "procMount": "Default"})
    p = pod_from_dict(doc).pod
    assert pod_from_dict(p.to_dict()).pod == p
    sc = effective_security_context(p.spec.security_context, p.spec.containers[0].security_context)
    assert (sc.run_as_user, sc.run_as_group, sc.run_as_non_root) == (1001, 3000, True)
    assert sc.seccomp_profile is not None and sc.seccomp_profile.type is ProfileType.RUNTIME_DEFAULT
    # {} is "not set", in the model and on the wire
    assert pod_from_dict(pod({}, {})).pod.spec.security_context is None


@pytest.mark.parametrize("spec_sc, sc, host_net, expect", [
    ({"runAsUser": -1}, None, False, "spec.securityContext.runAsUser: must be between 0 and"),
    (None, {"runAsGroup": 2**31}, False, "securityContext.runAsGroup: must be between 0 and"),
    ({"supplementalGroups": ["x"]}, None, False, "supplementalGroups[0]: must be an integer"),
    (None, {"privileged": True, "allowPrivilegeEscalation": False}, False,
     "cannot set `allowPrivilegeEscalation` to false and `privileged` to true"),
    (None, {"allowPrivilegeEscalation": False, "capabilities": {"add": ["SYS_ADMIN"]}}, False,
     "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN"),
    (None, {"procMount": "Unmasked"}, False, "`hostUsers` must be false to use `Unmasked`"),
    (None, {"procMount": "Weird"}, False, "unsupported value 'Weird'"),
    (None, {"seccompProfile": {"type": "Localhost"}}, False,
     "localhostProfile: must be set when type is Localhost"),
    (None, {"appArmorProfile": {"type": "Unconfined", "localhostProfile": "x"}}, False,
     "localhostProfile: can only be set when type is Localhost"),
    ({"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}, None, False,
     "forbidden sysctl: 'kernel.msgmax' not allowlisted"),
    ({"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]}, None, True,
     "forbidden sysctl: 'net.ipv4.tcp_syncookies' not allowed with host net enabled"),
    ({"sysctls": [{"name": "Bad Name", "value": "1"}]}, None, False, "not a valid sysctl name"),
    ({"seLinuxChangePolicy": "Relabel"}, None, False, "unsupported value 'Relabel'"),
])
def test_api_validation(spec_sc: Any, sc: Any, host_net: bool, expect: str) -> None:
    found = errors(pod(spec_sc, sc, host_net))
    assert any(expect in e for e in found), found


def test_host_users_false_is_refused() -> None:
    doc = pod()
    doc["spec"]["hostUsers"] = False
    assert any("user namespaces are not supported" in e for e in errors(doc))
    doc["spec"]["hostUsers"] = True  # the default: fine
    pod_from_dict(doc)


def test_cri_form_is_the_kubelets() -> None:
    p = pod_from_dict(pod(
        {"runAsUser": 1000, "fsGroup": 2000, "supplementalGroups": [7],
         "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]},
        {"capabilities": {"add": ["NET_ADMIN"], "drop": ["MKNOD"]}, "privileged": False,
         "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
         "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}})).pod
    c = p.spec.containers[0]
    config = cri_config.container_config(p, c, 0, {}, Path("/var/lib/pv/seccomp"))
    sc = config.linux.security_context
    assert sc.run_as_user.value == 1000 and not sc.HasField("run_as_group")
    assert list(sc.supplemental_groups) == [2000, 7]  # fsGroup first
    assert list(sc.capabilities.add_capabilities) == ["NET_ADMIN"]
    assert list(sc.capabilities.drop_capabilities) == ["MKNOD"]
    assert sc.no_new_privs and sc.readonly_rootfs and not sc.privileged
    assert list(sc.masked_paths) == list(DEFAULT_MASKED_PATHS)
    assert sc.seccomp.profile_type == pb.SecurityProfile.Localhost
    assert sc.seccomp.localhost_ref == "/var/lib/pv/seccomp/p.json"
    sandbox = cri_config.sandbox_config(p, 0, Path("/tmp/logs"))
    ssc = sandbox.linux.security_context
    assert ssc.run_as_user.value == 1000 and list(ssc.supplemental_groups) == [2000, 7]
    assert ssc.seccomp.profile_type == pb.SecurityProfile.RuntimeDefault
    assert dict(sandbox.linux.sysctls) == {"net.ipv4.ip_unprivileged_port_start": "0"}
    # nothing said: unconfined seccomp, no no_new_privs, the default masks
    plain = pod_from_dict(pod()).pod
    psc = cri_config.container_config(plain, plain.spec.containers[0], 0, {}).linux
    assert psc.security_context.seccomp.profile_type == pb.SecurityProfile.Unconfined
    assert not psc.security_context.no_new_privs and not psc.security_context.HasField(
        "run_as_user")


def test_run_as_non_root_messages_are_the_kubelets() -> None:
    p = pod_from_dict(pod(None, {"runAsNonRoot": True})).pod
    c = p.spec.containers[0]
    assert cri_config.needs_image_user(p, c)
    assert cri_config.run_as_non_root_error(p, c, 0, "") == (
        'container has runAsNonRoot and image will run as root (pod: "p_(u1)", container: c)')
    assert cri_config.run_as_non_root_error(p, c, None, "") is not None  # unknown: root
    assert cri_config.run_as_non_root_error(p, c, 1000, "") is None
    assert "image has non-numeric user (app)" in str(
        cri_config.run_as_non_root_error(p, c, None, "app"))
    root = pod_from_dict(pod({"runAsNonRoot": True}, {"runAsUser": 0})).pod
    assert cri_config.run_as_non_root_error(root, root.spec.containers[0], None, "") == (
        "container's runAsUser breaks non-root policy (pod: \"p_(u1)\", container: c)")


def test_capability_arithmetic_is_containerds() -> None:
    default = mask_of(DEFAULT_CAPS)
    assert default == 0xA80425FB  # what containerd/runc give (CapEff of a busybox container)
    assert cap_set([], [], "") == (default, 0)
    assert cap_set([], ["ALL"], "")[0] == 0
    assert cap_set(["NET_ADMIN"], ["ALL"], "")[0] == mask_of(["NET_ADMIN"])  # ALL first
    caps, asked = cap_set(["ALL"], ["CHOWN"], "")
    assert "CHOWN" not in names_of(caps) and "SYS_ADMIN" in names_of(caps) and asked == 0
    assert cap_set(["cap_net_admin"], ["kill"], "")[0] == (
        default | mask_of(["NET_ADMIN"])) & ~mask_of(["KILL"])
    with pytest.raises(Fault, match="unknown capability 'FLY'"):
        cap_set(["FLY"], [], "container 'c'")


ROOT = HostSecurity(euid=0, egid=0, permitted=(1 << 41) - 1 - (1 << 24),
                    bounding=(1 << 41) - 1 - (1 << 24), last_cap=40)


def config_with(fill: Any) -> pb.ContainerConfig:
    config = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"))
    fill(config.linux.security_context)
    return config


def test_runtime_security_spec_and_refusals() -> None:
    def nobody(sc: pb.LinuxContainerSecurityContext) -> None:
        sc.run_as_user.value = 65534
        sc.supplemental_groups.extend([5, 5, 6])
        sc.no_new_privs = True
    doc = container_security(config_with(nobody), ROOT)
    assert doc["uid"] == 65534 and doc["caps"] == mask_of(DEFAULT_CAPS) and doc["nnp"]
    assert doc["groups"][-2:] == [5, 6] and doc["manage"]
    priv = container_security(config_with(lambda sc: setattr(sc, "privileged", True)), ROOT)
    assert priv["caps"] == ROOT.available and priv["masked"] == []

    def add_missing(sc: pb.LinuxContainerSecurityContext) -> None:
        sc.capabilities.add_capabilities.append("SYS_RESOURCE")
    with pytest.raises(Fault, match="cannot grant capabilities SYS_RESOURCE"):
        container_security(config_with(add_missing), ROOT)
    user = HostSecurity(euid=1000, egid=1000, permitted=0, bounding=ROOT.bounding, last_cap=40)
    plain = container_security(config_with(lambda sc: None), user)
    assert (plain["uid"], plain["caps"], plain["manage"], plain["masked"]) == (1000, 0, False, [])
    with pytest.raises(Fault, match="runs as uid 1000, not root"):
        container_security(config_with(nobody), user)
    sandbox = pb.PodSandboxConfig()
    sandbox.linux.sysctls["net.ipv4.tcp_syncookies"] = "1"
    with pytest.raises(Fault, match=r"sysctls .* are not supported by the embedded runtime"):
        sandbox_security(sandbox)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another group needs root")
def test_fs_group_volume_ownership(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "d" / "f").write_text("x")
    os.chmod(tmp_path / "d" / "f", 0o600)
    target = tmp_path.parent / f"{tmp_path.name}-target"
    target.write_text("t")
    os.symlink(target, tmp_path / "link")
    os.chmod(tmp_path, 0o777)
    set_volume_ownership(tmp_path, 2000, on_root_mismatch=False)
    for path, mode in ((tmp_path, 0o777 | stat.S_ISGID), (tmp_path / "d", 0o770 | stat.S_ISGID),
                       (tmp_path / "d" / "f", 0o660)):
        st = os.lstat(path)
        assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (2000, mode), path
    assert os.lstat(tmp_path / "link").st_gid == 2000
    assert os.stat(target).st_gid != 2000  # the link's target is left alone
    (tmp_path / "new").write_text("y")
    os.chmod(tmp_path / "new", 0o600)
    set_volume_ownership(tmp_path, 2000, on_root_mismatch=True)  # root matches: skipped
    assert stat.S_IMODE(os.lstat(tmp_path / "new").st_mode) == 0o600
    set_volume_ownership(tmp_path, 2000, on_root_mismatch=False)  # Always: every time
    assert stat.S_IMODE(os.lstat(tmp_path / "new").st_mode) == 0o660


def test_probe_level_grace_is_kept_and_not_warned() -> None:
    """Applied when the probe's failure kills the container (test_syncloop_probe_grace)."""
    doc = pod()
    doc["spec"]["containers"][0]["livenessProbe"] = {
        "exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 5}
    parsed = pod_from_dict(doc)
    assert not parsed.warnings, parsed.warnings
    probe = parsed.pod.spec.containers[0].liveness_probe
    assert probe is not None and probe.termination_grace_period_seconds == 5


@pytest.mark.parametrize("fields, pid, ipc", [
    ({}, pb.CONTAINER, pb.POD),
    ({"hostPID": True}, pb.NODE, pb.POD),
    ({"hostIPC": True}, pb.CONTAINER, pb.NODE),
    ({"shareProcessNamespace": True}, pb.POD, pb.POD),
    ({"hostPID": True, "hostIPC": True, "hostNetwork": True}, pb.NODE, pb.NODE),
])
def test_namespaces_are_the_kubelets(fields: dict[str, Any], pid: int, ipc: int) -> None:
    """hostPID/hostIPC/shareProcessNamespace are honoured, not warned away: the CRI namespace
    options of the sandbox and of every container are the kubelet's ``namespacesForPod``, kept
    in the wire form (and so in the static pod's UID) only when set."""
    doc = pod()
    doc["spec"].update(fields)
    parsed = pod_from_dict(doc)
    assert not parsed.warnings, parsed.warnings
    p = parsed.pod
    want = pb.NamespaceOption(network=pb.NODE if fields.get("hostNetwork") else pb.POD,
                              pid=pid, ipc=ipc)
    sandbox = cri_config.sandbox_config(p, 0, Path("/tmp/logs"))
    assert sandbox.linux.security_context.namespace_options == want
    config = cri_config.container_config(p, p.spec.containers[0], 0, {})
    assert config.linux.security_context.namespace_options == want
    spec = p.spec.to_dict()
    for key in ("hostPID", "hostIPC", "shareProcessNamespace"):
        assert spec.get(key) == fields.get(key)
    # the embedded runtime accepts them: its containers are processes of the node
    sandbox_security(sandbox)


def test_namespace_conflicts_are_refused_as_the_api_server_does() -> None:
    doc = pod({"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}]})
    doc["spec"].update(hostPID=True, shareProcessNamespace=True, hostIPC=True)
    found = errors(doc)
    assert any("spec.shareProcessNamespace: ShareProcessNamespace and HostPID cannot both be "
               "enabled" in e for e in found), found
    assert any("forbidden sysctl: 'kernel.shm_rmid_forced' not allowed with host ipc enabled"
               in e for e in found), found
    doc["spec"]["hostPID"] = "yes"
    assert any("hostPID" in e for e in errors(doc))
