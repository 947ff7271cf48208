"""The embedded runtime's seccomp: which filter a container gets, in the form its monitor loads.

``container_filter(sc, caps, where, support)`` turns CRI's ``seccomp`` (and the deprecated
``seccomp_profile_path``) into the ``seccomp`` part of the monitor's spec, or None (no filter),
or raises ``Fault`` (INVALID_ARGUMENT) with the reason, as containerd 1.6 + runc decide:

- Unconfined, or a privileged container: no filter (containerd sets none for privileged).
- RuntimeDefault: containerd's default profile for the container's bounding set
  (seccomp_default.py).
- Localhost: the profile file ``localhost_ref`` (the kubelet's ``<rootDir>/seccomp/<name>``),
  read here once at CreateContainer (containerd bakes it into the OCI spec at create too), in
  the OCI runtime spec's form: ``defaultAction``, ``defaultErrnoRet``, ``architectures``,
  ``flags``, ``syscalls[].names/action/errnoRet/args[].index/value/valueTwo/op``; keys match
  case-insensitively and others are ignored, as Go's ``encoding/json`` reads it (so Docker's
  format works, its ``archMap`` and ``includes``/``excludes`` ignored, as with containerd).

The spec is runc's ``InitSeccomp`` made data, so the monitors (monitor.c ``load_seccomp``,
monitor.py ``SeccompFilter``) only call libseccomp: ``default`` (the action number),
``arches`` (libseccomp's names), ``attrs`` ([attribute, value]: no_new_privs left to the
container's own setting, as runc does, and runc's optimisation level and flags), ``rules``
([name, action, [[index, op, value, value_two]...]]: one libseccomp rule each; a rule whose
action is the default is left out, and a rule with two conditions on one argument becomes one
rule per condition, as runc does). Names the kernel does not know are skipped by the monitor,
as runc skips them. ERRNO and TRACE without ``errnoRet`` return EPERM (runc's default).

The monitor loads the filter in the container's child right before exec: after no_new_privs
when the container sets it, else before the ids and capabilities change (without no_new_privs
loading a filter needs CAP_SYS_ADMIN), as runc orders it. A monitor that cannot load it fails
the start; one that has no libseccomp (``support``) makes CreateContainer refuse the container:
a profile asked for is never silently left out.
"""

from __future__ import annotations

import errno
import json
import os
import platform
from dataclasses import dataclass
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.faults import invalid
from podvisor.services.runtime.seccomp_default import default_profile

# <seccomp.h>
_ACTIONS = {"SCMP_ACT_KILL": 0x0, "SCMP_ACT_KILL_THREAD": 0x0,
            "SCMP_ACT_KILL_PROCESS": 0x80000000, "SCMP_ACT_TRAP": 0x00030000,
            "SCMP_ACT_ERRNO": 0x00050000, "SCMP_ACT_TRACE": 0x7FF00000,
            "SCMP_ACT_LOG": 0x7FFC0000, "SCMP_ACT_ALLOW": 0x7FFF0000}
_WITH_ERRNO = ("SCMP_ACT_ERRNO", "SCMP_ACT_TRACE")
_OPS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4,
        "SCMP_CMP_GE": 5, "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}
ATTR_CTL_NNP, ATTR_CTL_TSYNC, ATTR_CTL_LOG, ATTR_CTL_SSB, ATTR_CTL_OPTIMIZE = 3, 4, 6, 7, 8
_FLAGS = {"SECCOMP_FILTER_FLAG_TSYNC": ATTR_CTL_TSYNC, "SECCOMP_FILTER_FLAG_LOG": ATTR_CTL_LOG,
          "SECCOMP_FILTER_FLAG_SPEC_ALLOW": ATTR_CTL_SSB}
MAX_ARGS = 6  # a syscall's arguments
MAX_PROFILE = 1 << 20


@dataclass(frozen=True)
class SeccompSupport:
    """Whether the monitors this runtime runs can load a filter; ``why`` says why not."""

    ok: bool
    why: str = ""


def python_seccomp() -> SeccompSupport:
    """Whether the Python monitor can load filters: libseccomp's Python binding, ``pyseccomp``
    (ctypes over the system's libseccomp.so.2; Debian's python3-seccomp is built for Debian's
    own Python, not the one podvisor runs on)."""
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, RuntimeError, OSError) as err:
        return SeccompSupport(False, f"the Python monitor cannot load libseccomp's binding "
                                     f"pyseccomp: {err}")
    return SeccompSupport(True)


def _action(name: Any, errno_ret: Any, where: str) -> int:
    if not isinstance(name, str) or name not in _ACTIONS:
        raise invalid(f"{where}: invalid action {name!r} (one of {', '.join(_ACTIONS)}; "
                      "SCMP_ACT_NOTIFY needs a listener, which the embedded runtime has not)")
    value = _ACTIONS[name]
    if name in _WITH_ERRNO:
        ret = errno.EPERM if errno_ret is None else errno_ret
        if not isinstance(ret, int) or not 0 <= ret <= 0xFFFF:
            raise invalid(f"{where}: invalid errnoRet {ret!r}")
        value |= ret
    elif errno_ret is not None:
        raise invalid(f"{where}: errnoRet is only valid with SCMP_ACT_ERRNO and SCMP_ACT_TRACE")
    return value


def _lower(doc: Any, where: str) -> dict[str, Any]:
    """Go's encoding/json matches keys case-insensitively."""
    if not isinstance(doc, dict):
        raise invalid(f"{where}: not a JSON object")
    return {str(k).lower(): v for k, v in doc.items()}


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(f"{where}: not a list")
    return value


def _condition(arg: Any, where: str) -> list[int]:
    a = _lower(arg, where)
    index, op = a.get("index", 0), a.get("op")
    if not isinstance(index, int) or not 0 <= index < MAX_ARGS:
        raise invalid(f"{where}: argument index {index!r} is out of range (0..5)")
    if op not in _OPS:
        raise invalid(f"{where}: invalid operator {op!r}")
    values = [a.get("value", 0), a.get("valuetwo", 0)]
    if not all(isinstance(v, int) and 0 <= v < 1 << 64 for v in values):
        raise invalid(f"{where}: argument values must be unsigned 64-bit numbers")
    return [index, _OPS[op], *values]


def compile_profile(profile: Any, where: str) -> dict[str, Any]:
    """An OCI ``LinuxSeccomp`` document -> the monitor's filter (see the module's doc)."""
    doc = _lower(profile, where)
    default = _action(doc.get("defaultaction"), doc.get("defaulterrnoret"), where)
    arches = []
    for arch in _list(doc.get("architectures"), f"{where}: architectures"):
        if not isinstance(arch, str) or not arch.startswith("SCMP_ARCH_"):
            raise invalid(f"{where}: invalid architecture {arch!r}")
        arches.append(arch.removeprefix("SCMP_ARCH_").lower())
    attrs = [[ATTR_CTL_NNP, 0], [ATTR_CTL_OPTIMIZE, 2]]
    for flag in _list(doc.get("flags"), f"{where}: flags"):
        if flag not in _FLAGS:
            raise invalid(f"{where}: flag {flag!r} is not supported (supported: "
                          f"{', '.join(_FLAGS)})")
        attrs.append([_FLAGS[flag], 1])
    if doc.get("listenerpath"):
        raise invalid(f"{where}: a seccomp notify listener is not supported by the embedded "
                      "runtime")
    rules: list[list[Any]] = []
    for i, raw in enumerate(_list(doc.get("syscalls"), f"{where}: syscalls")):
        at = f"{where}: syscalls[{i}]"
        call = _lower(raw, at)
        action = _action(call.get("action"), call.get("errnoret"), at)
        conditions = [_condition(a, f"{at}.args") for a in _list(call.get("args"), at)]
        names = _list(call.get("names"), f"{at}.names")
        if not all(isinstance(n, str) and n and "\0" not in n for n in names):
            raise invalid(f"{at}: syscall names must be non-empty strings")
        if action == default:
            continue  # runc: a rule that does what the default does is not added
        indexes = [c[0] for c in conditions]
        groups = ([[c] for c in conditions] if len(set(indexes)) < len(indexes)
                  else [conditions])
        rules += [[name, action, group] for name in names for group in groups]
    return {"default": default, "arches": arches, "attrs": attrs, "rules": rules}


def _load_localhost(path: str, where: str) -> Any:
    if not os.path.isabs(path):
        raise invalid(f"{where}: seccomp localhost profile {path[:200]!r} must be an absolute "
                      "path")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PROFILE + 1)
    except OSError as err:
        raise invalid(f"{where}: cannot load seccomp profile {path!r}: {err.strerror}") from None
    if len(data) > MAX_PROFILE:
        raise invalid(f"{where}: seccomp profile {path!r} is larger than 1 MiB")
    try:
        return json.loads(data)
    except ValueError as err:
        raise invalid(f"{where}: decoding seccomp profile {path!r} failed: {err}") from None


def _requested(sc: pb.LinuxContainerSecurityContext) -> tuple[int, str]:
    """(profile type, localhost path), from ``seccomp`` or the deprecated path string
    (containerd's ``generateSeccompSecurityProfile``)."""
    if sc.HasField("seccomp"):
        return sc.seccomp.profile_type, sc.seccomp.localhost_ref
    path = sc.seccomp_profile_path
    if path in ("", "unconfined"):
        return pb.SecurityProfile.Unconfined, ""
    if path in ("runtime/default", "docker/default"):
        return pb.SecurityProfile.RuntimeDefault, ""
    if path.startswith("localhost/"):
        return pb.SecurityProfile.Localhost, path.removeprefix("localhost/")
    raise invalid(f"invalid seccomp profile {path[:200]!r}")


def container_filter(sc: pb.LinuxContainerSecurityContext, caps: set[str], where: str,
                     support: SeccompSupport) -> dict[str, Any] | None:
    """The monitor's filter for a container whose bounding set is ``caps`` (names), or None."""
    kind, ref = _requested(sc)
    if sc.privileged or kind == pb.SecurityProfile.Unconfined:
        return None
    if ref and kind != pb.SecurityProfile.Localhost:
        raise invalid(f"{where}: seccomp config invalid LocalhostRef must only be set if "
                      "ProfileType is Localhost")
    name = pb.SecurityProfile.ProfileType.Name(kind)
    if not support.ok:
        raise invalid(f"{where}: seccomp profile {name} cannot be applied: {support.why} (the "
                      "embedded runtime never runs a container unconfined when a profile was "
                      "asked for)")
    if kind == pb.SecurityProfile.RuntimeDefault:
        return compile_profile(default_profile(caps, platform.machine()),
                               f"{where}: the default seccomp profile")
    return compile_profile(_load_localhost(ref, where), f"{where}: seccomp profile {ref!r}")


__all__ = ["SeccompSupport", "compile_profile", "container_filter", "python_seccomp"]
