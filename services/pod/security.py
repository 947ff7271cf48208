"""Pod and container security contexts (frozen dataclasses) and the kubelet's merge of the two.

``effective_security_context(pod_sc, container_sc)`` is the kubelet's
``securitycontext.DetermineEffectiveSecurityContext``: the pod level gives runAsUser,
runAsGroup, runAsNonRoot, seccompProfile, appArmorProfile and seLinuxOptions; every field the
container sets wins. ``None`` means "not set" throughout (the API's nil pointers): the runtime's
default then applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

MAX_ID = 2**31 - 1  # validation.IsValidUserID / IsValidGroupID: 0..MaxInt32

# The kubelet's masked and read-only /proc and /sys paths for procMount Default
# (pkg/securitycontext/util.go defaultMaskedPaths / defaultReadonlyPaths).
DEFAULT_MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/sys/firmware", "/sys/devices/virtual/powercap",
)
DEFAULT_READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


class ProfileType(StrEnum):
    RUNTIME_DEFAULT = "RuntimeDefault"
    UNCONFINED = "Unconfined"
    LOCALHOST = "Localhost"


class ProcMountType(StrEnum):
    DEFAULT = "Default"
    UNMASKED = "Unmasked"


class FSGroupChangePolicy(StrEnum):
    ALWAYS = "Always"
    ON_ROOT_MISMATCH = "OnRootMismatch"


class SELinuxChangePolicy(StrEnum):
    """``spec.securityContext.seLinuxChangePolicy`` (SELinuxChangePolicy, beta and on by
    default in 1.33): how the kubelet would relabel volumes for SELinux."""

    RECURSIVE = "Recursive"
    MOUNT_OPTION = "MountOption"


class SupplementalGroupsPolicy(StrEnum):
    MERGE = "Merge"
    STRICT = "Strict"


@dataclass(frozen=True)
class Profile:
    """A seccompProfile or appArmorProfile."""

    type: ProfileType
    localhost_profile: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": str(self.type)}
        if self.localhost_profile:
            out["localhostProfile"] = self.localhost_profile
        return out


@dataclass(frozen=True)
class SELinuxOptions:
    user: str = ""
    role: str = ""
    type: str = ""
    level: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("user", self.user), ("role", self.role),
                                  ("type", self.type), ("level", self.level)) if v}


@dataclass(frozen=True)
class Capabilities:
    """Names as written in the manifest (``NET_ADMIN``, ``ALL``); the runtime checks them."""

    add: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.add:
            out["add"] = list(self.add)
        if self.drop:
            out["drop"] = list(self.drop)
        return out


@dataclass(frozen=True)
class Sysctl:
    name: str
    value: str


def _opt(out: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        return
    out[key] = value.to_dict() if hasattr(value, "to_dict") else (
        str(value) if isinstance(value, StrEnum) else value)


@dataclass(frozen=True)
class SecurityContext:
    """A container's ``securityContext`` (and the merged, effective one)."""

    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool | None = None
    capabilities: Capabilities | None = None
    privileged: bool | None = None
    allow_privilege_escalation: bool | None = None
    read_only_root_filesystem: bool | None = None
    proc_mount: ProcMountType | None = None
    seccomp_profile: Profile | None = None
    app_armor_profile: Profile | None = None
    se_linux_options: SELinuxOptions | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        _opt(out, "runAsUser", self.run_as_user)
        _opt(out, "runAsGroup", self.run_as_group)
        _opt(out, "runAsNonRoot", self.run_as_non_root)
        _opt(out, "capabilities", self.capabilities)
        _opt(out, "privileged", self.privileged)
        _opt(out, "allowPrivilegeEscalation", self.allow_privilege_escalation)
        _opt(out, "readOnlyRootFilesystem", self.read_only_root_filesystem)
        _opt(out, "procMount", self.proc_mount)
        _opt(out, "seccompProfile", self.seccomp_profile)
        _opt(out, "appArmorProfile", self.app_armor_profile)
        _opt(out, "seLinuxOptions", self.se_linux_options)
        return out


@dataclass(frozen=True)
class PodSecurityContext:
    """``spec.securityContext``."""

    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool | None = None
    supplemental_groups: tuple[int, ...] = ()
    supplemental_groups_policy: SupplementalGroupsPolicy | None = None
    fs_group: int | None = None
    fs_group_change_policy: FSGroupChangePolicy | None = None
    se_linux_change_policy: SELinuxChangePolicy | None = None
    sysctls: tuple[Sysctl, ...] = ()
    seccomp_profile: Profile | None = None
    app_armor_profile: Profile | None = None
    se_linux_options: SELinuxOptions | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        _opt(out, "runAsUser", self.run_as_user)
        _opt(out, "runAsGroup", self.run_as_group)
        _opt(out, "runAsNonRoot", self.run_as_non_root)
        if self.supplemental_groups:
            out["supplementalGroups"] = list(self.supplemental_groups)
        _opt(out, "supplementalGroupsPolicy", self.supplemental_groups_policy)
        _opt(out, "fsGroup", self.fs_group)
        _opt(out, "fsGroupChangePolicy", self.fs_group_change_policy)
        _opt(out, "seLinuxChangePolicy", self.se_linux_change_policy)
        if self.sysctls:
            out["sysctls"] = [{"name": s.name, "value": s.value} for s in self.sysctls]
        _opt(out, "seccompProfile", self.seccomp_profile)
        _opt(out, "appArmorProfile", self.app_armor_profile)
        _opt(out, "seLinuxOptions", self.se_linux_options)
        return out


def effective_security_context(pod_sc: PodSecurityContext | None,
                               container_sc: SecurityContext | None) -> SecurityContext:
    """The kubelet's ``DetermineEffectiveSecurityContext``: container fields over pod ones."""
    base = SecurityContext()
    if pod_sc is not None:
        base = SecurityContext(
            run_as_user=pod_sc.run_as_user, run_as_group=pod_sc.run_as_group,
            run_as_non_root=pod_sc.run_as_non_root, seccomp_profile=pod_sc.seccomp_profile,
            app_armor_profile=pod_sc.app_armor_profile, se_linux_options=pod_sc.se_linux_options)
    if container_sc is None:
        return base
    merged = {name: getattr(container_sc, name) if getattr(container_sc, name) is not None
              else getattr(base, name) for name in SecurityContext.__dataclass_fields__}
    return SecurityContext(**merged)


def no_new_privs(sc: SecurityContext) -> bool:
    """``securitycontext.AddNoNewPrivileges``: only an explicit ``false`` sets no_new_privs."""
    return sc.allow_privilege_escalation is False


def masked_paths(sc: SecurityContext) -> tuple[str, ...]:
    """``ConvertToRuntimeMaskedPaths``: none for Unmasked, the defaults otherwise."""
    return () if sc.proc_mount is ProcMountType.UNMASKED else DEFAULT_MASKED_PATHS


def readonly_paths(sc: SecurityContext) -> tuple[str, ...]:
    return () if sc.proc_mount is ProcMountType.UNMASKED else DEFAULT_READONLY_PATHS
