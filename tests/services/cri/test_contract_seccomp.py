"""CRI contract: seccomp profiles (what the kubelet sends for ``seccompProfile``).

Both runtimes, the same expectations: RuntimeDefault is containerd's default profile (on the
embedded runtime the same allow-list, seccomp_default.py): a syscall it denies fails with EPERM
inside the container (``unshare -U``: a user namespace needs no capability, so only the filter
stops it), while ordinary commands run; a Localhost profile file is applied as written; a
privileged container runs unconfined; a profile that cannot be loaded fails CreateContainer.
The embedded runtime's C and Python monitors both load the filter (test_embedded_monitors); one
whose monitors have no libseccomp refuses, never runs the container unconfined.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from tests.services.conftest import (
    RuntimeUnderTest,
    only_embedded,
    running_embedded,
    runs_processes,
)
from tests.services.cri.test_contract_io import parse_log

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="loading a seccomp filter without "
                                                         "no_new_privs needs root")

USERNS = "unshare -U true; echo rc=$?"
DENIED = "Operation not permitted"
Secure = Callable[[pb.LinuxContainerSecurityContext], None]


def run_script(rt: RuntimeUnderTest, secure: Secure, script: str,
               privileged: bool = False) -> tuple[int, str]:
    """Run ``script`` with the security context ``secure`` fills in: (exit code, output)."""
    sconfig = rt.sandbox_config(f"scmp-{uuid.uuid4().hex[:6]}")
    sconfig.linux.security_context.privileged = privileged
    sid = rt.client.run_pod_sandbox(sconfig)
    config = rt.container_config("c", ["sh", "-c", script])
    secure(config.linux.security_context)
    cid = rt.client.create_container(sid, config, sconfig)
    rt.client.start_container(cid)
    status = rt.wait_exited(cid, 30.0)
    log = parse_log(status.log_path)  # stdout first: the two pipes' order is not kept
    return status.exit_code, "\n".join([text for s, _t, text in log if s == "stdout"]
                                       + [text for s, _t, text in log if s == "stderr"])


def runtime_default(sc: pb.LinuxContainerSecurityContext) -> None:
    sc.seccomp.profile_type = pb.SecurityProfile.RuntimeDefault


def check_runtime_default(rt: RuntimeUnderTest) -> None:
    """The default profile denies a user namespace (EPERM) and lets a shell do its work; the
    same command runs unconfined; with no_new_privs and as a non-root user too (the filter is
    loaded after no_new_privs, or before the ids change without it)."""
    code, out = run_script(rt, lambda sc: None, USERNS)
    assert (code, "rc=0") == (0, out.splitlines()[0]), out
    code, out = run_script(rt, runtime_default, f"{USERNS}; ls / >/dev/null && echo listed")
    assert code == 0 and DENIED in out and "rc=0" not in out and "listed" in out, out

    def restricted(sc: pb.LinuxContainerSecurityContext) -> None:
        runtime_default(sc)
        sc.no_new_privs = True
        sc.run_as_user.value = 65534
        sc.capabilities.drop_capabilities.append("ALL")
    code, out = run_script(rt, restricted, f"{USERNS}; id -u")
    assert code == 0 and DENIED in out and out.splitlines()[1] == "65534", out

    def nobody(sc: pb.LinuxContainerSecurityContext) -> None:
        runtime_default(sc)
        sc.run_as_user.value = 65534
    code, out = run_script(rt, nobody, USERNS)
    assert code == 0 and DENIED in out, out


def test_runtime_default_denies_with_eperm(cri_runtime: RuntimeUnderTest) -> None:
    runs_processes(cri_runtime, "a syscall's result")
    check_runtime_default(cri_runtime)


def check_exec_is_filtered(rt: RuntimeUnderTest) -> None:
    """ExecSync (exec probes, preStop hooks, kubectl exec) runs under the container's filter,
    as runc applies it to exec'd processes: with and without no_new_privs."""
    for nnp in (False, True):
        sid, sconfig = rt.run(f"scmp-exec-{uuid.uuid4().hex[:6]}")
        config = rt.container_config("c", ["sleep", "1000"])
        runtime_default(config.linux.security_context)
        config.linux.security_context.no_new_privs = nnp
        cid = rt.client.create_container(sid, config, sconfig)
        rt.client.start_container(cid)
        got = rt.client.exec_sync(cid, ["unshare", "-U", "true"], 10)
        assert got.exit_code != 0 and DENIED in got.stderr.decode(), (nnp, got)
        ok = rt.client.exec_sync(cid, ["sh", "-c", "echo fine"], 10)
        assert (ok.exit_code, ok.stdout) == (0, b"fine\n"), (nnp, ok)


def test_exec_runs_under_the_containers_filter(cri_runtime: RuntimeUnderTest) -> None:
    runs_processes(cri_runtime, "a syscall's result")
    check_exec_is_filtered(cri_runtime)


def test_runtime_default_allows_namespaces_with_sys_admin(cri_runtime: RuntimeUnderTest
                                                          ) -> None:
    """The profile follows the bounding set: CAP_SYS_ADMIN allows unshare (containerd's
    ``DefaultProfile``), and a privileged container has no filter at all."""
    runs_processes(cri_runtime, "a syscall's result")

    def admin(sc: pb.LinuxContainerSecurityContext) -> None:
        runtime_default(sc)
        sc.capabilities.add_capabilities.append("SYS_ADMIN")
    _code, out = run_script(cri_runtime, admin, USERNS)
    assert out.splitlines()[0] == "rc=0", out

    def privileged(sc: pb.LinuxContainerSecurityContext) -> None:
        runtime_default(sc)
        sc.privileged = True
    _code, out = run_script(cri_runtime, privileged, USERNS, privileged=True)
    assert out.splitlines()[0] == "rc=0", out


def write_profile(tmp: Path, doc: object) -> str:
    path = tmp / f"profile-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_localhost_profile_is_applied(cri_runtime: RuntimeUnderTest) -> None:
    runs_processes(cri_runtime, "a syscall's result")
    check_localhost(cri_runtime)


def check_localhost(rt: RuntimeUnderTest) -> None:
    """A Localhost profile as written (the OCI form, as the kubelet's seccomp directory holds
    them): everything allowed but mkdir, which fails with EPERM; an errnoRet is returned as
    given."""
    rt.tmp.mkdir(parents=True, exist_ok=True)
    path = write_profile(rt.tmp, {
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"},
                     {"names": ["rmdir"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13}]})

    def localhost(sc: pb.LinuxContainerSecurityContext) -> None:
        sc.seccomp.profile_type = pb.SecurityProfile.Localhost
        sc.seccomp.localhost_ref = path
    code, out = run_script(rt, localhost,
                           "mkdir /tmp/pv-scmp-x; echo mkdir=$?; rmdir /tmp; echo done")
    assert DENIED in out and "mkdir=1" in out and "Permission denied" in out, out
    assert "done" in out and code == 0, out


def test_a_profile_that_cannot_be_loaded_fails_create(cri_runtime: RuntimeUnderTest) -> None:
    runs_processes(cri_runtime, "a profile file")
    sid, sconfig = cri_runtime.run(f"scmp-missing-{uuid.uuid4().hex[:6]}")
    config = cri_runtime.container_config("c", ["true"])
    config.linux.security_context.seccomp.profile_type = pb.SecurityProfile.Localhost
    config.linux.security_context.seccomp.localhost_ref = "/nonexistent/podvisor/profile.json"
    with pytest.raises(CriError, match="cannot load seccomp profile"):
        cri_runtime.client.create_container(sid, config, sconfig)


def test_embedded_refuses_a_bad_profile(cri_runtime: RuntimeUnderTest) -> None:
    only_embedded(cri_runtime, "containerd refuses it at start (runc)")
    path = write_profile(cri_runtime.tmp, {"defaultAction": "SCMP_ACT_FLY"})
    sid, sconfig = cri_runtime.run(f"scmp-bad-{uuid.uuid4().hex[:6]}")
    config = cri_runtime.container_config("c", ["true"])
    config.linux.security_context.seccomp.profile_type = pb.SecurityProfile.Localhost
    config.linux.security_context.seccomp.localhost_ref = path
    with pytest.raises(CriError) as info:
        cri_runtime.client.create_container(sid, config, sconfig)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid action 'SCMP_ACT_FLY'" in info.value.message


def test_embedded_without_libseccomp_refuses_the_container(tmp_path: Path) -> None:
    """A C monitor built without libseccomp (no seccomp.h) cannot load a filter: the container
    is refused at create with the reason, never run unconfined; an unconfined one runs."""
    env = {"PODVISOR_SECCOMP_HEADER_DIRS": "", "PODVISOR_CACHE_DIR": str(tmp_path / "cache")}
    with running_embedded("pvsc", env) as rt:
        under = RuntimeUnderTest("embedded", rt.client, "host", tmp_path, embedded=rt)
        sid, sconfig = under.run("nolib")
        config = under.container_config("c", ["true"])
        runtime_default(config.linux.security_context)
        with pytest.raises(CriError) as info:
            rt.client.create_container(sid, config, sconfig)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "seccomp profile RuntimeDefault cannot be applied" in info.value.message
        assert "libseccomp-dev" in info.value.message
        cid = rt.client.create_container(sid, under.container_config("ok", ["true"]), sconfig)
        rt.client.start_container(cid)
        assert under.wait_exited(cid, 30.0).exit_code == 0
