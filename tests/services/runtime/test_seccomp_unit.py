"""seccomp.py and seccomp_default.py as pure functions: the profile -> the monitor's filter
(runc's ``InitSeccomp`` rules made data) and containerd's default profile per bounding set."""

from __future__ import annotations

import errno
import sys

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.faults import Fault
from podvisor.services.runtime.seccomp import (
    SeccompSupport,
    compile_profile,
    container_filter,
    python_seccomp,
)
from podvisor.services.runtime.seccomp_default import CLONE_NAMESPACES, default_profile

ALLOW, ERRNO, LOG = 0x7FFF0000, 0x00050000, 0x7FFC0000
OK = SeccompSupport(True)


def test_rules_as_runc_adds_them() -> None:
    filt = compile_profile({
        "DefaultAction": "SCMP_ACT_ERRNO",  # keys match case-insensitively, as Go's json
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86"],
        "flags": ["SECCOMP_FILTER_FLAG_LOG"],
        "syscalls": [
            {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["kill"], "action": "SCMP_ACT_ERRNO"},  # = the default: left out
            {"names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": 97},
            {"names": ["personality"], "action": "SCMP_ACT_LOG",
             "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"},
                      {"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}]},  # one index twice
            {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": 1, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"},
                      {"index": 1, "value": 2, "op": "SCMP_CMP_NE"}]},
        ]}, "p")
    assert filt["default"] == ERRNO | errno.EPERM
    assert filt["arches"] == ["x86_64", "x86"]
    assert filt["attrs"] == [[3, 0], [8, 2], [6, 1]]  # no_new_privs off, optimize 2, log
    assert filt["rules"] == [
        ["read", ALLOW, []], ["write", ALLOW, []],
        ["socket", ERRNO | 97, []],
        ["personality", LOG, [[0, 4, 8, 0]]], ["personality", LOG, [[0, 4, 0, 0]]],
        ["clone", ALLOW, [[0, 7, 1, 0], [1, 1, 2, 0]]],
    ]


@pytest.mark.parametrize(("profile", "message"), [
    ({"defaultAction": "SCMP_ACT_NOTIFY"}, "invalid action 'SCMP_ACT_NOTIFY'"),
    ({}, "invalid action None"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["read"], "action": "SCMP_ACT_ERRNO",
         "args": [{"index": 6, "value": 0, "op": "SCMP_CMP_EQ"}]}]}, "out of range"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["read"], "action": "SCMP_ACT_ERRNO",
         "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_ABOUT"}]}]}, "invalid operator"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_NEW"]}, "flag"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/x.sock"}, "listener"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "errnoRet": 1, "syscalls": [
        {"names": ["read"], "action": "SCMP_ACT_KILL", "errnoRet": 1}]}, "errnoRet is only"),
    ([], "not a JSON object"),
])
def test_bad_profiles_are_refused(profile: object, message: str) -> None:
    with pytest.raises(Fault, match=message):
        compile_profile(profile, "p")


def test_the_default_profile_follows_the_bounding_set() -> None:
    plain = default_profile({"CHOWN", "KILL"}, "x86_64")
    names = {n for r in plain["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and not r["args"]
             for n in r["names"]}
    assert {"read", "execve", "arch_prctl", "ptrace"} <= names
    assert not {"unshare", "mount", "keyctl", "add_key", "chroot", "reboot"} & names
    clone = [r for r in plain["syscalls"] if r["names"] == ["clone"]]
    assert clone[0]["args"] == [{"index": 0, "value": CLONE_NAMESPACES, "valueTwo": 0,
                                 "op": "SCMP_CMP_MASKED_EQ"}]
    assert next(r for r in plain["syscalls"] if r["names"] == ["clone3"])["errnoRet"] == \
        errno.ENOSYS
    assert plain["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    admin = default_profile({"SYS_ADMIN", "SYS_CHROOT"}, "aarch64")
    names = {n for r in admin["syscalls"] for n in r["names"]}
    assert {"unshare", "mount", "chroot", "set_tls"} <= names and "arch_prctl" not in names
    assert not [r for r in admin["syscalls"] if r["args"] and r["names"] == ["clone"]]
    assert default_profile(set(), "s390x")["syscalls"][-2]["args"][0]["index"] == 1


def _context(kind: int, ref: str = "", privileged: bool = False
             ) -> pb.LinuxContainerSecurityContext:
    sc = pb.LinuxContainerSecurityContext(privileged=privileged)
    sc.seccomp.profile_type = kind  # type: ignore[assignment]
    sc.seccomp.localhost_ref = ref
    return sc


def test_which_containers_get_a_filter() -> None:
    sp = pb.SecurityProfile
    assert container_filter(pb.LinuxContainerSecurityContext(), set(), "c", OK) is None
    assert container_filter(_context(sp.Unconfined), set(), "c", OK) is None
    assert container_filter(_context(sp.RuntimeDefault, privileged=True), set(), "c",
                            OK) is None  # containerd: privileged containers run unconfined
    assert container_filter(_context(sp.RuntimeDefault), set(), "c", OK) is not None
    old = pb.LinuxContainerSecurityContext(seccomp_profile_path="runtime/default")
    assert container_filter(old, set(), "c", OK) is not None
    with pytest.raises(Fault, match="LocalhostRef must only be set if ProfileType is Localhost"):
        container_filter(_context(sp.RuntimeDefault, "/x.json"), set(), "c", OK)
    with pytest.raises(Fault, match="must be an absolute path"):
        container_filter(_context(sp.Localhost, "x.json"), set(), "c", OK)
    with pytest.raises(Fault, match="cannot be applied: no libseccomp"):
        container_filter(_context(sp.RuntimeDefault), set(), "c",
                         SeccompSupport(False, "no libseccomp"))


def test_python_monitor_support_needs_the_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    assert python_seccomp().ok
    monkeypatch.setitem(sys.modules, "pyseccomp", None)
    got = python_seccomp()
    assert not got.ok and "pyseccomp" in got.why


def test_the_exec_loaders_file_round_trips() -> None:
    """engine.py writes the filter as monitor.c's SECCOMP fields; the Python loader reads the
    same filter back (the C one parses them with parse_seccomp)."""
    from podvisor.services.runtime.seccomp_exec import read_filter
    from podvisor.services.runtime.zygote import seccomp_fields

    filt = compile_profile(default_profile({"CHOWN"}, "x86_64"), "p")
    data = b"\0".join(f.encode() for f in seccomp_fields(filt)) + b"\0"
    assert read_filter(data) == filt
