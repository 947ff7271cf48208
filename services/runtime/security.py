"""The embedded runtime's security context: what a container's process runs as, and what it
refuses because this host (or the runtime) cannot enforce it.

``container_security(config, host)`` turns CRI's ``LinuxContainerSecurityContext`` into the
``security`` part of the monitor's spec (monitor.c ``apply_security``/``apply_security_mounts``,
monitor.py ``apply_security``), or raises ``Fault`` (INVALID_ARGUMENT) with the reason:

- user: ``run_as_user`` / ``run_as_username``, else the image's user (the ``host`` image runs
  as the runtime's own user, root). Group: ``run_as_group``, else the user's group in the host's
  passwd (0 when the uid has no entry), as containerd takes it from the image's /etc/passwd.
  Groups: the user's groups in the host's /etc/group (policy Merge; none with Strict), then
  ``supplemental_groups`` (fsGroup first, as the kubelet sends them).
- capabilities: containerd's default set when nothing is said (not all of root's); ``ALL`` in
  add/drop first, then the named ones (containerd's order); privileged = every capability the
  runtime itself holds (containerd: the current process's). A capability this runtime does not
  hold is refused, never quietly left out. They are the bounding set, and (root only) the
  effective and permitted sets; a non-root user gets empty effective/permitted sets (runc's
  result without ambient capabilities).
- ``no_new_privs``, ``readonly_rootfs`` (the ``host`` image's root, "/", remounted read-only in
  the container's private mount namespace; volumes and the host's other filesystems keep their
  flags), ``masked_paths`` / ``readonly_paths`` (as runc: /dev/null or a read-only tmpfs over a
  masked path, a read-only bind over a read-only one; none when privileged).
- seccomp: RuntimeDefault (containerd's default profile) and Localhost profiles, as a filter the
  monitor loads right before exec (seccomp.py); refused when the monitors cannot load one.
- refused: a SELinux label, an AppArmor profile other than unconfined (the embedded runtime
  has no LSM support), ambient capabilities, a user namespace.

A runtime not running as root cannot change users or capabilities: it runs the container as
itself (no capabilities), refuses another user, group, added capabilities, privileged and a
read-only root, and skips the default masks (an unprivileged process can neither read the
masked files nor write /proc/sys anyway).
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Any

from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.faults import invalid
from podvisor.services.runtime.seccomp import SeccompSupport, container_filter

# <linux/capability.h>, in bit order.
CAP_NAMES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)
CAP_BITS = {name: bit for bit, name in enumerate(CAP_NAMES)}
# containerd's (and runc's spec) default set.
DEFAULT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID",
                "SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL",
                "AUDIT_WRITE")
CAP_SETPCAP = CAP_BITS["SETPCAP"]
CAP_SYS_ADMIN = CAP_BITS["SYS_ADMIN"]


def mask_of(names: tuple[str, ...] | list[str]) -> int:
    return sum(1 << CAP_BITS[n] for n in set(names))


def names_of(mask: int) -> list[str]:
    return [name for bit, name in enumerate(CAP_NAMES) if mask >> bit & 1]


DEFAULT_MASK = mask_of(DEFAULT_CAPS)
NO_SECCOMP = SeccompSupport(False, "this runtime was not told that its monitors load seccomp "
                                   "filters")


@dataclass(frozen=True)
class HostSecurity:
    """What this runtime process can give: its ids and capabilities (permitted and bounding),
    and the highest capability the kernel knows."""

    euid: int
    egid: int
    permitted: int
    bounding: int
    last_cap: int

    @property
    def available(self) -> int:
        return self.permitted & self.bounding & ((1 << (self.last_cap + 1)) - 1)

    @property
    def root(self) -> bool:
        """Root with what changing users, capabilities and mounts takes."""
        needed = (1 << CAP_SETPCAP) | (1 << CAP_SYS_ADMIN) | (1 << CAP_BITS["SETUID"]) | (
            1 << CAP_BITS["SETGID"])
        return self.euid == 0 and self.available & needed == needed


def read_host() -> HostSecurity:
    caps = {"CapPrm": 0, "CapBnd": 0}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in caps:
                caps[key] = int(value.strip(), 16)
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = len(CAP_NAMES) - 1
    return HostSecurity(os.geteuid(), os.getegid(), caps["CapPrm"], caps["CapBnd"],
                        min(last, len(CAP_NAMES) - 1))


def cap_set(add: list[str], drop: list[str], where: str) -> tuple[int, int]:
    """containerd's arithmetic over the default set: ``ALL`` in add, then ``ALL`` in drop,
    then each named add, then each named drop. Returns (set, the capabilities added by name:
    those must be held by the runtime; ``ALL`` means all it holds, as in containerd). Names
    are case-insensitive, with or without ``CAP_``; an unknown name is refused."""
    full = (1 << len(CAP_NAMES)) - 1

    def bits(names: list[str]) -> int:
        out = 0
        for raw in names:
            name = raw.upper().removeprefix("CAP_")
            if name == "ALL":
                continue
            if name not in CAP_BITS:
                raise invalid(f"{where}: unknown capability {raw!r}")
            out |= 1 << CAP_BITS[name]
        return out

    caps = DEFAULT_MASK
    if any(n.upper() == "ALL" for n in add):
        caps = full
    if any(n.upper() == "ALL" for n in drop):
        caps = 0
    added = bits(add)
    caps = (caps | added) & ~bits(drop)
    return caps, added


def _user(sc: pb.LinuxContainerSecurityContext, host: HostSecurity,
          where: str) -> tuple[int, pwd.struct_passwd | None]:
    if sc.HasField("run_as_user"):
        uid = sc.run_as_user.value
        if not 0 <= uid < 2**32 - 1:
            raise invalid(f"{where}: run_as_user {uid} is out of range")
        try:
            return uid, pwd.getpwuid(uid)
        except KeyError:
            return uid, None
    if sc.run_as_username:
        try:
            entry = pwd.getpwnam(sc.run_as_username)
        except KeyError:
            raise invalid(f"{where}: no user {sc.run_as_username!r} in the host image's "
                          "/etc/passwd") from None
        return entry.pw_uid, entry
    try:  # the host image's user: the runtime's own
        return host.euid, pwd.getpwuid(host.euid)
    except KeyError:
        return host.euid, None


def _own_userns(ns: pb.NamespaceOption) -> bool:
    """A user namespace of the pod's own (unset: the node's)."""
    return ns.HasField("userns_options") and ns.userns_options.mode == pb.POD


def _refuse_unenforceable(sc: pb.LinuxContainerSecurityContext, where: str) -> None:
    se = sc.selinux_options
    if se.user or se.role or se.type or se.level:
        raise invalid(f"{where}: SELinux labels are not supported by the embedded runtime")
    unconfined = pb.SecurityProfile.Unconfined
    if sc.HasField("apparmor") and sc.apparmor.profile_type != unconfined:
        kind = pb.SecurityProfile.ProfileType.Name(sc.apparmor.profile_type)
        raise invalid(f"{where}: AppArmor profile {kind} is not supported by the embedded "
                      "runtime (use Unconfined or containerd)")
    if sc.apparmor_profile not in ("", "unconfined"):
        raise invalid(f"{where}: AppArmor profile {sc.apparmor_profile!r} is not supported by "
                      "the embedded runtime")
    if sc.capabilities.add_ambient_capabilities:
        raise invalid(f"{where}: ambient capabilities are not supported by the embedded runtime")
    if _own_userns(sc.namespace_options):
        raise invalid(f"{where}: user namespaces are not supported by the embedded runtime")


def container_security(config: pb.ContainerConfig, host: HostSecurity,
                       seccomp: SeccompSupport = NO_SECCOMP) -> dict[str, Any]:
    """The monitor's ``security`` spec for ``config``; raises ``Fault`` when it cannot be
    enforced here. ``seccomp``: whether the monitors can load a seccomp filter (seccomp.py);
    the filter, when there is one, is the spec's ``seccomp``."""
    sc = config.linux.security_context
    where = f"container {config.metadata.name!r}"
    _refuse_unenforceable(sc, where)
    uid, entry = _user(sc, host, where)
    gid = sc.run_as_group.value if sc.HasField("run_as_group") else (
        entry.pw_gid if entry is not None else (host.egid if uid == host.euid else 0))
    groups: list[int] = []
    if entry is not None and sc.supplemental_groups_policy != pb.SupplementalGroupsPolicy.Strict:
        groups += os.getgrouplist(entry.pw_name, gid)
    groups += [int(g) for g in sc.supplemental_groups]
    groups = list(dict.fromkeys(groups))
    if sc.privileged:
        caps, asked = host.available, 0
    else:
        caps, asked = cap_set(list(sc.capabilities.add_capabilities),
                              list(sc.capabilities.drop_capabilities), where)
    missing = asked & ~host.available & ((1 << (host.last_cap + 1)) - 1)
    if missing:
        raise invalid(f"{where}: cannot grant capabilities {', '.join(names_of(missing))}: "
                      "the embedded runtime does not hold them (its bounding set lacks them)")
    caps &= host.available
    privileged = bool(sc.privileged)
    for path in [*sc.masked_paths, *sc.readonly_paths]:
        if not os.path.isabs(path) or "\0" in path:
            raise invalid(f"{where}: masked and read-only paths must be absolute: {path[:200]!r}")
    doc: dict[str, Any] = {
        "uid": uid, "gid": gid, "groups": groups, "caps": caps,
        "nnp": bool(sc.no_new_privs), "ro_root": bool(sc.readonly_rootfs),
        "masked": [] if privileged else list(sc.masked_paths),
        "readonly": [] if privileged else list(sc.readonly_paths),
        "manage": host.root,
    }
    if not host.root:
        _unprivileged(doc, host, sc, where)
    filt = container_filter(sc, set(names_of(doc["caps"])), where, seccomp)
    if filt is not None:
        if not host.root and not doc["nnp"]:
            raise invalid(f"{where}: a seccomp filter without no_new_privs needs CAP_SYS_ADMIN; "
                          f"the embedded runtime runs as uid {host.euid}, not root (set "
                          "allowPrivilegeEscalation: false, or run podvisor as root)")
        doc["seccomp"] = filt
    return doc


def _unprivileged(doc: dict[str, Any], host: HostSecurity,
                  sc: pb.LinuxContainerSecurityContext, where: str) -> None:
    """Without root, only what needs no privilege: the runtime's own ids, no capabilities."""
    why = f"the embedded runtime runs as uid {host.euid}, not root"
    if doc["uid"] != host.euid or doc["gid"] != host.egid:
        raise invalid(f"{where}: cannot run as uid {doc['uid']} gid {doc['gid']}: {why}")
    if sc.supplemental_groups:
        raise invalid(f"{where}: cannot set supplemental groups: {why}")
    if sc.privileged or sc.capabilities.add_capabilities:
        raise invalid(f"{where}: cannot grant capabilities: {why}")
    if sc.readonly_rootfs:
        raise invalid(f"{where}: cannot make the root filesystem read-only: {why}")
    doc.update(groups=[], caps=0, masked=[], readonly=[])


def sandbox_security(config: pb.PodSandboxConfig, own_network: bool = False) -> None:
    """Refuse what a sandbox asks that the embedded runtime cannot do: its pods share the node's
    IPC namespace (and, unless ``own_network``: a CNI network namespace, its network), so a
    namespaced sysctl would change the node's; a port mapped to another port or bound to one
    address needs a network of the pod's own (CNI's portmap); no SELinux, no user namespaces.
    (Seccomp/AppArmor/privileged/ids of the sandbox apply to a pause process, which the
    embedded runtime does not have.)"""
    linux = config.linux
    if linux.sysctls:
        names = ", ".join(sorted(linux.sysctls))
        raise invalid(f"sysctls ({names}) are not supported by the embedded runtime: its pods run "
                      "in the node's network and IPC namespaces, so setting them would change "
                      "the node's (use containerd for pods that need sysctls)")
    se = linux.security_context.selinux_options
    if se.user or se.role or se.type or se.level:
        raise invalid("SELinux labels are not supported by the embedded runtime")
    for m in () if own_network else config.port_mappings:
        if m.host_ip not in ("", "0.0.0.0", "::") or (m.host_port and
                                                      m.host_port != m.container_port):
            where = (f"port mapping {m.host_ip or '*'}:{m.host_port} -> {m.container_port}")
            raise invalid(f"{where}: the embedded runtime maps no ports in networkPlugin: host: "
                          "its pods use the node's network, so a container's port is the node's "
                          "port on every address (hostPort must equal containerPort, without "
                          "hostIP; use networkPlugin: cni or containerd for a port mapped or "
                          "bound to one address)")
    if _own_userns(linux.security_context.namespace_options):
        raise invalid("user namespaces are not supported by the embedded runtime")


__all__ = ["CAP_NAMES", "DEFAULT_CAPS", "HostSecurity", "cap_set",
           "container_security", "read_host", "sandbox_security"]
