"""Readers for ``spec.securityContext`` and ``containers[].securityContext`` (part of ``parse``),
with the API server's validation and the kubelet's sysctl admission.

Sysctls: as a kubelet without ``--allowed-unsafe-sysctls``, only the safe (namespaced) set is
allowed, and none of the ``net.*`` ones with hostNetwork ("not allowed with host net enabled"),
nor the IPC ones with hostIPC ("not allowed with host ipc enabled").
Whether a runtime can set them is its own check (the embedded runtime refuses every sysctl: its
pods share the node's namespaces).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from podvisor.services.pod import policy
from podvisor.services.pod.fields import (
    Findings,
    as_map,
    check_fields,
    get_enum,
    get_list,
    get_str,
    get_str_list,
    join,
)
from podvisor.services.pod.security import (
    MAX_ID,
    Capabilities,
    FSGroupChangePolicy,
    PodSecurityContext,
    ProcMountType,
    Profile,
    ProfileType,
    SecurityContext,
    SELinuxChangePolicy,
    SELinuxOptions,
    SupplementalGroupsPolicy,
    Sysctl,
)

# The kubelet's SafeSysctlAllowlist (pkg/kubelet/sysctl/safe_sysctls.go), with the namespace
# each lives in.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced": "ipc",
    "net.ipv4.ip_local_port_range": "net",
    "net.ipv4.tcp_syncookies": "net",
    "net.ipv4.ping_group_range": "net",
    "net.ipv4.ip_unprivileged_port_start": "net",
    "net.ipv4.ip_local_reserved_ports": "net",
    "net.ipv4.tcp_keepalive_time": "net",
    "net.ipv4.tcp_fin_timeout": "net",
    "net.ipv4.tcp_keepalive_intvl": "net",
    "net.ipv4.tcp_keepalive_probes": "net",
    "net.ipv4.tcp_rmem": "net",
    "net.ipv4.tcp_wmem": "net",
}
_SYSCTL_NAME = re.compile(r"^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$")
_SYSCTL_MAX = 253


def parse_pod_security(f: Findings, raw: Any, path: str,
                       host_network: bool, host_ipc: bool = False
                       ) -> PodSecurityContext | None:
    if raw is None:
        return None
    m = as_map(f, raw, path)
    if m is None:
        return None
    check_fields(f, m, path, policy.POD_SECURITY_KNOWN, policy.POD_SECURITY_UNSUPPORTED)
    groups: list[int] = []
    for where, item in get_list(f, m, "supplementalGroups", path):
        if isinstance(item, bool) or not isinstance(item, int):
            f.error(where, "must be an integer")
        elif not 0 <= item <= MAX_ID:
            f.error(where, f"must be between 0 and {MAX_ID}, inclusive")
        else:
            groups.append(item)
    sc = PodSecurityContext(
        run_as_user=_id(f, m, "runAsUser", path),
        run_as_group=_id(f, m, "runAsGroup", path),
        run_as_non_root=_opt_bool(f, m, "runAsNonRoot", path),
        supplemental_groups=tuple(groups),
        supplemental_groups_policy=_opt_enum(f, m, "supplementalGroupsPolicy", path,
                                             SupplementalGroupsPolicy),
        fs_group=_id(f, m, "fsGroup", path),
        fs_group_change_policy=_opt_enum(f, m, "fsGroupChangePolicy", path, FSGroupChangePolicy),
        se_linux_change_policy=_opt_enum(f, m, "seLinuxChangePolicy", path, SELinuxChangePolicy),
        sysctls=_sysctls(f, m, path, host_network, host_ipc),
        seccomp_profile=_profile(f, m, "seccompProfile", path),
        app_armor_profile=_profile(f, m, "appArmorProfile", path),
        se_linux_options=_selinux(f, m, path),
    )
    return None if sc == PodSecurityContext() else sc  # {} is "not set": the wire form agrees


def parse_container_security(f: Findings, raw: Any, path: str) -> SecurityContext | None:
    if raw is None:
        return None
    m = as_map(f, raw, path)
    if m is None:
        return None
    check_fields(f, m, path, policy.SECURITY_KNOWN, policy.SECURITY_UNSUPPORTED)
    caps = None
    if m.get("capabilities") is not None:
        where = join(path, "capabilities")
        cm = as_map(f, m["capabilities"], where)
        if cm is not None:
            check_fields(f, cm, where, ("add", "drop"), {})
            caps = Capabilities(get_str_list(f, cm, "add", where),
                                get_str_list(f, cm, "drop", where))
    sc = SecurityContext(
        run_as_user=_id(f, m, "runAsUser", path),
        run_as_group=_id(f, m, "runAsGroup", path),
        run_as_non_root=_opt_bool(f, m, "runAsNonRoot", path),
        capabilities=caps,
        privileged=_opt_bool(f, m, "privileged", path),
        allow_privilege_escalation=_opt_bool(f, m, "allowPrivilegeEscalation", path),
        read_only_root_filesystem=_opt_bool(f, m, "readOnlyRootFilesystem", path),
        proc_mount=_opt_enum(f, m, "procMount", path, ProcMountType),
        seccomp_profile=_profile(f, m, "seccompProfile", path),
        app_armor_profile=_profile(f, m, "appArmorProfile", path),
        se_linux_options=_selinux(f, m, path),
    )
    # The API server's cross-field rules (ValidateSecurityContext).
    if sc.allow_privilege_escalation is False and sc.privileged:
        f.error(join(path, "allowPrivilegeEscalation"),
                "cannot set `allowPrivilegeEscalation` to false and `privileged` to true")
    if sc.allow_privilege_escalation is False and caps is not None and any(
            c.upper() in ("SYS_ADMIN", "CAP_SYS_ADMIN") for c in caps.add):
        f.error(join(path, "allowPrivilegeEscalation"),
                "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` "
                "CAP_SYS_ADMIN")
    if sc.proc_mount is ProcMountType.UNMASKED:
        # The API asks for hostUsers: false (a user namespace), which podvisor does not support.
        f.error(join(path, "procMount"), "`hostUsers` must be false to use `Unmasked`; user "
                                         "namespaces are not supported by podvisor")
    return None if sc == SecurityContext() else sc


def _id(f: Findings, m: Mapping[str, Any], key: str, path: str) -> int | None:
    value = m.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        f.error(join(path, key), "must be an integer")
        return None
    if not 0 <= value <= MAX_ID:
        f.error(join(path, key), f"must be between 0 and {MAX_ID}, inclusive")
        return None
    return value


def _opt_bool(f: Findings, m: Mapping[str, Any], key: str, path: str) -> bool | None:
    value = m.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        f.error(join(path, key), "must be true or false")
        return None
    return value


def _opt_enum(f: Findings, m: Mapping[str, Any], key: str, path: str, kind: Any) -> Any:
    if m.get(key) is None:
        return None
    first = next(iter(kind))
    value = get_enum(f, m, key, path, kind, first)
    return value if get_str(f, m, key, path) == str(value) else None


def _profile(f: Findings, m: Mapping[str, Any], key: str, path: str) -> Profile | None:
    if m.get(key) is None:
        return None
    where = join(path, key)
    pm = as_map(f, m[key], where)
    if pm is None:
        return None
    check_fields(f, pm, where, ("type", "localhostProfile"), {})
    kind = _opt_enum(f, pm, "type", where, ProfileType)
    if kind is None:
        if pm.get("type") is None:
            f.error(join(where, "type"), "required")
        return None
    local = get_str(f, pm, "localhostProfile", where)
    if kind is ProfileType.LOCALHOST and not local:
        f.error(join(where, "localhostProfile"), "must be set when type is Localhost")
    elif kind is not ProfileType.LOCALHOST and local:
        f.error(join(where, "localhostProfile"), "can only be set when type is Localhost")
    return Profile(kind, local)


def _selinux(f: Findings, m: Mapping[str, Any], path: str) -> SELinuxOptions | None:
    if m.get("seLinuxOptions") is None:
        return None
    where = join(path, "seLinuxOptions")
    sm = as_map(f, m["seLinuxOptions"], where)
    if sm is None:
        return None
    check_fields(f, sm, where, ("user", "role", "type", "level"), {})
    return SELinuxOptions(*(get_str(f, sm, k, where) for k in ("user", "role", "type", "level")))


def _sysctls(f: Findings, m: Mapping[str, Any], path: str,
             host_network: bool, host_ipc: bool) -> tuple[Sysctl, ...]:
    out: list[Sysctl] = []
    seen: set[str] = set()
    for where, item in get_list(f, m, "sysctls", path):
        s = as_map(f, item, where)
        if s is None:
            continue
        check_fields(f, s, where, ("name", "value"), {})
        name = get_str(f, s, "name", where, required=True)
        value = get_str(f, s, "value", where)
        if not name:
            continue
        normal = name.replace("/", ".")
        if len(name) > _SYSCTL_MAX or not _SYSCTL_NAME.match(name):
            f.error(join(where, "name"), f"{name!r} is not a valid sysctl name")
        elif normal in seen:
            f.error(join(where, "name"), f"duplicate sysctl {name!r}")
        elif normal not in SAFE_SYSCTLS:
            f.error(join(where, "name"), f"forbidden sysctl: {normal!r} not allowlisted "
                                         "(podvisor allows the kubelet's safe sysctls)")
        elif SAFE_SYSCTLS[normal] == "net" and host_network:
            f.error(join(where, "name"),
                    f"forbidden sysctl: {normal!r} not allowed with host net enabled")
        elif SAFE_SYSCTLS[normal] == "ipc" and host_ipc:
            f.error(join(where, "name"),
                    f"forbidden sysctl: {normal!r} not allowed with host ipc enabled")
        seen.add(normal)
        out.append(Sysctl(name, value))
    return tuple(out)
