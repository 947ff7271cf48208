"""Pure builders of the CRI configs for a pod: ``PodSandboxConfig`` and ``ContainerConfig``.

hostNetwork pods get the node's network namespace and an empty hostname; the PID namespace mode
is CONTAINER for the sandbox and every container (what containerd needs here); the sandbox's
``cgroup_parent`` is the pod's cgroup under ``cgroupRoot`` (``podcgroups``). Labels,
annotations and log paths follow ``labels``. Volume host paths: emptyDir under
``<rootDir>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>``, hostPath as given,
downwardAPI under ``.../kubernetes.io~downward-api/<name>`` (always mounted read-only).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from cri_api.v1 import api_pb2 as pb

from podvisor.common.quantity import memory_bytes
from podvisor.services.pod import (
    ApiVolume,
    Container,
    DownwardAPIVolume,
    EmptyDirVolume,
    HostPathVolume,
    Pod,
    PortProtocol,
    Profile,
    ProfileType,
    SecurityContext,
    SELinuxOptions,
    SupplementalGroupsPolicy,
    VolumeMount,
    effective_security_context,
    expand,
    expand_command,
    masked_paths,
    no_new_privs,
    readonly_paths,
)
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.spec import container_hash

_PROTOCOLS = {PortProtocol.TCP: pb.TCP, PortProtocol.UDP: pb.UDP, PortProtocol.SCTP: pb.SCTP}
CPU_PERIOD_US = 100_000


def empty_dir_path(pods_dir: Path, uid: str, volume: str) -> Path:
    return pods_dir / uid / "volumes" / "kubernetes.io~empty-dir" / volume


def downward_api_path(pods_dir: Path, uid: str, volume: str) -> Path:
    return pods_dir / uid / "volumes" / "kubernetes.io~downward-api" / volume


_API_PLUGINS = {"configMap": "kubernetes.io~configmap", "secret": "kubernetes.io~secret",
                "projected": "kubernetes.io~projected"}


def api_volume_path(pods_dir: Path, uid: str, kind: str, volume: str) -> Path:
    return pods_dir / uid / "volumes" / _API_PLUGINS[kind] / volume


def volume_paths(pod: Pod, pods_dir: Path,
                 mounted: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Volume name -> host path. ``mounted``: the volume manager's host paths of the volumes
    it mounts (claims, ephemeral and csi volumes), by volume name."""
    out: dict[str, Path] = {name: Path(path) for name, path in (mounted or {}).items()}
    for v in pod.spec.volumes:
        if isinstance(v.source, EmptyDirVolume):
            out[v.name] = empty_dir_path(pods_dir, pod.uid, v.name)
        elif isinstance(v.source, HostPathVolume):
            out[v.name] = Path(v.source.path)
        elif isinstance(v.source, DownwardAPIVolume):
            out[v.name] = downward_api_path(pods_dir, pod.uid, v.name)
        elif isinstance(v.source, ApiVolume):
            out[v.name] = api_volume_path(pods_dir, pod.uid, v.source.kind, v.name)
    return out


def read_only_volumes(pod: Pod) -> set[str]:
    """Volumes the kubelet always mounts read-only (downwardAPI, like secret and configMap)."""
    return {v.name for v in pod.spec.volumes
            if isinstance(v.source, DownwardAPIVolume | ApiVolume)}


def host_ports(pod: Pod) -> list[tuple[str, int, str]]:
    """(protocol, host port, host IP) the pod claims on the node ("0.0.0.0": every address,
    as the scheduler's HostPortInfo keys them)."""
    out: list[tuple[str, int, str]] = []
    for c in pod.all_containers():
        for p in c.ports:
            port = p.host_port or (p.container_port if pod.spec.host_network else 0)
            if port:
                out.append((str(p.protocol), port, p.host_ip or "0.0.0.0"))
    return out


def namespace_options(pod: Pod) -> pb.NamespaceOption:
    """The kubelet's ``namespacesForPod``: the node's network/IPC/PID namespace for
    hostNetwork/hostIPC/hostPID, one PID namespace for the pod with shareProcessNamespace, else
    the container's own PID namespace and the pod's network and IPC ones."""
    spec = pod.spec
    pid = (pb.NODE if spec.host_pid else pb.POD if spec.share_process_namespace
           else pb.CONTAINER)
    return pb.NamespaceOption(network=pb.NODE if spec.host_network else pb.POD, pid=pid,
                              ipc=pb.NODE if spec.host_ipc else pb.POD)


def sandbox_config(pod: Pod, attempt: int, pod_logs_dir: Path,
                   cgroup_parent: str = "", hostname: str | None = None,
                   dns: pb.DNSConfig | None = None) -> pb.PodSandboxConfig:
    """``cgroup_parent``: the pod's cgroup (``<cgroupRoot>/pod<uid>``), "" = the runtime's.
    ``hostname``: the pod's (syncloop/dns.py ``kernel_hostname``; None: its name), none on the
    host network; ``dns``: its resolver configuration (``pod_dns``; None: the runtime's)."""
    host_net = pod.spec.host_network
    psc = pod.spec.security_context
    ns = namespace_options(pod)
    mappings = [
        pb.PortMapping(protocol=_PROTOCOLS[p.protocol], container_port=p.container_port,
                       host_port=p.host_port or (p.container_port if host_net else 0),
                       host_ip=p.host_ip)
        for c in pod.all_containers() for p in c.ports
        if p.host_port or host_net
    ]
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace,
                                       attempt=attempt),
        hostname="" if host_net else (pod.name[:63] if hostname is None else hostname),
        dns_config=dns,
        log_directory=str(L.pod_log_dir(pod_logs_dir, pod.name, pod.namespace, pod.uid)),
        port_mappings=mappings,
        labels={**pod.metadata.labels, **L.pod_labels(pod.name, pod.namespace, pod.uid)},
        annotations=dict(pod.metadata.annotations),
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent, security_context=_sandbox_security(pod, ns),
            sysctls={s.name: s.value for s in psc.sysctls} if psc else {}),
    )


def _sandbox_security(pod: Pod, ns: pb.NamespaceOption) -> pb.LinuxSandboxSecurityContext:
    """The kubelet's ``generatePodSandboxLinuxConfig``: privileged when any container is, the
    runtime's default seccomp profile for the sandbox, the pod's user, group and groups."""
    psc = pod.spec.security_context
    out = pb.LinuxSandboxSecurityContext(
        namespace_options=ns,
        privileged=any(c.security_context is not None and bool(c.security_context.privileged)
                       for c in pod.all_containers()),
        seccomp=pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault))
    if psc is None:
        return out
    if psc.run_as_user is not None:
        out.run_as_user.value = psc.run_as_user
    if psc.run_as_group is not None:
        out.run_as_group.value = psc.run_as_group
    out.supplemental_groups.extend(_pod_groups(pod))
    if psc.se_linux_options is not None:
        out.selinux_options.CopyFrom(_selinux(psc.se_linux_options))
    return out


def _pod_groups(pod: Pod) -> list[int]:
    """fsGroup first, then supplementalGroups (the kubelet's order)."""
    psc = pod.spec.security_context
    if psc is None:
        return []
    return ([psc.fs_group] if psc.fs_group is not None else []) + list(psc.supplemental_groups)


def _selinux(o: SELinuxOptions) -> pb.SELinuxOption:
    return pb.SELinuxOption(user=o.user, role=o.role, type=o.type, level=o.level)


_PROFILE_TYPES = {ProfileType.RUNTIME_DEFAULT: pb.SecurityProfile.RuntimeDefault,
                  ProfileType.UNCONFINED: pb.SecurityProfile.Unconfined,
                  ProfileType.LOCALHOST: pb.SecurityProfile.Localhost}


def _seccomp(sc: SecurityContext, seccomp_root: Path) -> pb.SecurityProfile:
    """The kubelet's ``getSeccompProfile`` (without --seccomp-default): Unconfined unless the
    pod or container names a profile; Localhost profiles under ``<rootDir>/seccomp``."""
    p = sc.seccomp_profile
    if p is None:
        return pb.SecurityProfile(profile_type=pb.SecurityProfile.Unconfined)
    ref = str(seccomp_root / p.localhost_profile) if p.type is ProfileType.LOCALHOST else ""
    return pb.SecurityProfile(profile_type=_PROFILE_TYPES[p.type], localhost_ref=ref)


def _apparmor(p: Profile | None) -> pb.SecurityProfile | None:
    """``getAppArmorProfile``: none (the runtime's default) unless the pod or container names
    one; a Localhost profile is referenced by its name."""
    if p is None:
        return None
    return pb.SecurityProfile(profile_type=_PROFILE_TYPES[p.type],
                              localhost_ref=p.localhost_profile)


def container_security(pod: Pod, c: Container, ns: pb.NamespaceOption,
                       seccomp_root: Path) -> pb.LinuxContainerSecurityContext:
    """The kubelet's ``determineEffectiveSecurityContext``: the merged security context in
    CRI form. (The image's user is left to the runtime, which applies it itself; the kubelet
    reads it only to check runAsNonRoot, done before this in ``run_as_non_root_error``.)"""
    sc = effective_security_context(pod.spec.security_context, c.security_context)
    out = pb.LinuxContainerSecurityContext(
        namespace_options=ns, privileged=bool(sc.privileged),
        readonly_rootfs=bool(sc.read_only_root_filesystem), no_new_privs=no_new_privs(sc),
        masked_paths=list(masked_paths(sc)), readonly_paths=list(readonly_paths(sc)),
        seccomp=_seccomp(sc, seccomp_root), supplemental_groups=_pod_groups(pod))
    if sc.capabilities is not None:
        out.capabilities.add_capabilities.extend(sc.capabilities.add)
        out.capabilities.drop_capabilities.extend(sc.capabilities.drop)
    if sc.se_linux_options is not None:
        out.selinux_options.CopyFrom(_selinux(sc.se_linux_options))
    if sc.run_as_user is not None:
        out.run_as_user.value = sc.run_as_user
    if sc.run_as_group is not None:
        out.run_as_group.value = sc.run_as_group
    apparmor = _apparmor(sc.app_armor_profile)
    if apparmor is not None:
        out.apparmor.CopyFrom(apparmor)
    psc = pod.spec.security_context
    if psc is not None and psc.supplemental_groups_policy is SupplementalGroupsPolicy.STRICT:
        out.supplemental_groups_policy = pb.SupplementalGroupsPolicy.Strict
    return out


def run_as_non_root_error(pod: Pod, c: Container, image_uid: int | None,
                          image_user: str) -> str | None:
    """The kubelet's ``verifyRunAsNonRoot`` (its messages, word for word): ``image_uid`` /
    ``image_user`` from ImageStatus (no uid and no user name: root)."""
    sc = effective_security_context(pod.spec.security_context, c.security_context)
    if not sc.run_as_non_root:
        return None
    where = f"(pod: \"{pod.full_name}({pod.uid})\", container: {c.name})"
    if sc.run_as_user is not None:
        if sc.run_as_user == 0:
            return f"container's runAsUser breaks non-root policy {where}"
        return None
    if image_uid is None and image_user:
        return (f"container has runAsNonRoot and image has non-numeric user ({image_user}), "
                f"cannot verify user is non-root {where}")
    if not image_uid:
        return f"container has runAsNonRoot and image will run as root {where}"
    return None


def needs_image_user(pod: Pod, c: Container) -> bool:
    """Whether ``run_as_non_root_error`` needs the image's user (ImageStatus)."""
    sc = effective_security_context(pod.spec.security_context, c.security_context)
    return bool(sc.run_as_non_root) and sc.run_as_user is None


MIN_SHARES, MAX_SHARES, SHARES_PER_CPU = 2, 262_144, 1024
MIN_QUOTA_US = 1000


def milli_cpu_to_shares(milli: int) -> int:
    """The kubelet's ``MilliCPUToShares``: 1024 per CPU, within [2, 262144]."""
    if milli <= 0:
        return MIN_SHARES
    return max(MIN_SHARES, min(MAX_SHARES, milli * SHARES_PER_CPU // 1000))


def milli_cpu_to_quota(milli: int, period: int = CPU_PERIOD_US) -> int:
    """The kubelet's ``milliCPUToQuota``: 0 (no quota) for 0, else at least 1000 us."""
    if milli <= 0:
        return 0
    return max(MIN_QUOTA_US, milli * period // 1000)


def _resources(c: Container, oom_score_adj: int | None) -> pb.LinuxContainerResources:
    """The kubelet's arithmetic (``calculateLinuxResources``): shares from the CPU request
    (which defaults to the limit), quota from the CPU limit over a 100 ms period, the memory
    limit as is. One deliberate difference: a container with no CPU request and no limit gets
    no shares field (runtime default) where the kubelet sends the minimum, 2, so that a
    BestEffort container needs no cgroup of its own on the embedded runtime (which then runs
    without root); its weight against other pods comes from the pod's cgroup."""
    res = pb.LinuxContainerResources()
    if oom_score_adj is not None:
        res.oom_score_adj = oom_score_adj
    limits, requests = c.resources.limits, c.resources.requests
    if limits.memory_bytes:
        res.memory_limit_in_bytes = limits.memory_bytes
    if limits.cpu_millis:
        res.cpu_period = CPU_PERIOD_US
        res.cpu_quota = milli_cpu_to_quota(limits.cpu_millis)
    if requests.cpu_millis is not None:
        res.cpu_shares = milli_cpu_to_shares(requests.cpu_millis)
    for size, amount in limits.hugepages:
        res.hugepage_limits.append(pb.HugepageLimit(
            page_size=hugepage_size_name(memory_bytes(size)), limit=amount))
    return res


def linux_resources(c: Container) -> pb.LinuxContainerResources:
    """What UpdateContainerResources sends for an in-place resize: the CPU and memory of
    ``c`` as at create (its OOM score adjustment is left as it is)."""
    res = _resources(c, None)
    del res.hugepage_limits[:]
    return res


def hugepage_size_name(size: int) -> str:
    """The CRI's page size name, as the kubelet writes it (2Mi -> "2MB", 1Gi -> "1GB")."""
    value, unit = float(size), 0
    units = ("B", "KB", "MB", "GB", "TB", "PB")
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    return f"{value:g}{units[unit]}"


_PROPAGATION = {"": pb.PROPAGATION_PRIVATE, "None": pb.PROPAGATION_PRIVATE,
                "HostToContainer": pb.PROPAGATION_HOST_TO_CONTAINER,
                "Bidirectional": pb.PROPAGATION_BIDIRECTIONAL}


class SubPathError(ValueError):
    """A ``subPathExpr`` that does not expand to a usable path (the kubelet's
    CreateContainerConfigError)."""


def expand_sub_path(expr: str, env: Mapping[str, str]) -> str:
    """The kubelet's ``ExpandContainerVolumeMounts`` and makeMounts' checks: ``$(VAR)`` from
    the container's environment, every variable named must have a non-empty value, and the
    result must be a relative path without ``..``."""
    missing: set[str] = set()

    def lookup(name: str) -> str:
        value = env.get(name, "")
        if not value:
            missing.add(name)
        return value

    sub = expand(expr, lookup)
    if missing:
        raise SubPathError(f"missing value for {', '.join(sorted(missing))}")
    if sub.startswith("/"):
        raise SubPathError(f"error SubPath `{sub}` must not be an absolute path")
    if ".." in sub.split("/"):
        raise SubPathError(f"unable to provision SubPath `{sub}`: must not contain '..'")
    return sub


class RecursiveReadOnlyError(ValueError):
    """A ``recursiveReadOnly`` mount the runtime cannot make (the kubelet's
    CreateContainerConfigError)."""


def resolve_recursive_read_only(m: VolumeMount, supported: bool) -> bool:
    """The kubelet's ``resolveRecursiveReadOnly``: whether the mount is made recursively
    read-only (CRI ``Mount.recursive_read_only``). Disabled or unset: no; IfPossible: when the
    runtime's handler supports it, else a plain read-only mount; Enabled: it must."""
    if m.recursive_read_only in ("", "Disabled"):
        return False
    where = "failed to resolve recursive read-only mode: volume"
    if not m.read_only:
        raise RecursiveReadOnlyError(f'{where} "{m.name}" requested recursive read-only mode, '
                                     "but it is not read-only")
    if m.mount_propagation not in ("", "None"):
        raise RecursiveReadOnlyError(f'{where} "{m.name}" requested recursive read-only mode, '
                                     "but it is not compatible with propagation "
                                     f'"{m.mount_propagation}"')
    if m.recursive_read_only == "IfPossible":
        return supported
    if not supported:
        raise RecursiveReadOnlyError(f'{where} "{m.name}" requested recursive read-only mode, '
                                     "but it is not supported by the runtime")
    return True


def _mounts(c: Container, volumes: dict[str, Path], read_only: set[str],
            env: Mapping[str, str], rro_supported: bool) -> list[pb.Mount]:
    """``makeMounts``: subPath (or subPathExpr expanded from ``env``) under the volume, the
    propagation as the kubelet's ``translateMountPropagation``, ``recursiveReadOnly`` as its
    ``resolveRecursiveReadOnly`` (``rro_supported``: the pod's runtime handler supports it)."""
    out = []
    for m in c.volume_mounts:
        host = volumes[m.name]
        sub = expand_sub_path(m.sub_path_expr, env) if m.sub_path_expr else m.sub_path
        if sub:
            host = host / sub
        out.append(pb.Mount(container_path=m.mount_path, host_path=str(host),
                            readonly=m.read_only or m.name in read_only,
                            propagation=_PROPAGATION[m.mount_propagation],
                            recursive_read_only=resolve_recursive_read_only(m, rro_supported)))
    return out


def block_devices(c: Container, block: Mapping[str, tuple[str, bool]]) -> list[pb.Device]:
    """The kubelet's ``makeBlockVolumes``: the host path is the pod device map path (a symlink
    to the device, which the runtime resolves), permissions ``mrw`` (``r`` for a claim used
    read-only)."""
    out = []
    for d in c.volume_devices:
        host, read_only = block[d.name]
        out.append(pb.Device(container_path=d.device_path, host_path=host,
                             permissions="r" if read_only else "mrw"))
    return out


def stop_signal(name: str) -> pb.Signal.ValueType:
    """``lifecycle.stopSignal`` as CRI's enum (SIGRTMIN+1 -> SIGRTMINPLUS1); unset: the
    runtime's default (the image's, else SIGTERM)."""
    if not name:
        return pb.RUNTIME_DEFAULT
    value: pb.Signal.ValueType = pb.Signal.Value(name.replace("+", "PLUS").replace("-", "MINUS"))
    return value


def container_config(pod: Pod, c: Container, restart_count: int,
                     volumes: dict[str, Path],
                     seccomp_root: Path = Path("/"),
                     env: list[tuple[str, str]] | None = None,
                     oom_score_adj: int | None = None,
                     termination_log: Path | None = None,
                     target_id: str = "",
                     read_only: Collection[str] = (),
                     rro_supported: bool = False,
                     block: Mapping[str, tuple[str, bool]] | None = None) -> pb.ContainerConfig:
    """Raises KeyError when a mount names a volume the pod does not declare. ``seccomp_root``:
    where Localhost seccomp profiles live (``<rootDir>/seccomp``). ``env``: the container's
    environment as ``envvars.container_env`` built it (None: the plain values); command and args
    are expanded against it (``$(VAR)``). ``oom_score_adj``: the kubelet's value for the pod's
    QoS class (None: unset). ``termination_log``: the host file mounted (read-write) on the
    container's ``terminationMessagePath`` (``termination_log_file``; None: no mount).
    ``target_id``: an ephemeral container's target (``targetContainerName``): its PID namespace
    is that container's when the pod gives each container its own (the kubelet's
    NamespaceMode TARGET). ``read_only``: more volumes mounted read-only (a claim
    the volume manager mounts read-only). ``rro_supported``: the pod's runtime handler supports
    recursive read-only mounts (``resolve_recursive_read_only``; raises
    ``RecursiveReadOnlyError``). ``block``: the raw block volumes the volume manager
    mapped, by volume name: (pod device map path, read-only); each of the container's
    ``volumeDevices`` becomes a CRI device (``makeBlockVolumes``/``makeDevices``; raises
    KeyError when one is not mapped)."""
    ns = namespace_options(pod)
    if env is None:
        env = [(e.name, e.value) for e in c.env]
    command, args = expand_command(c, dict(env))
    mounts = _mounts(c, volumes, read_only_volumes(pod) | set(read_only), dict(env),
                     rro_supported)
    if termination_log is not None:
        mounts.append(pb.Mount(container_path=c.termination_message_path,
                               host_path=str(termination_log)))
    security = container_security(pod, c, ns, seccomp_root)
    if target_id and security.namespace_options.pid == pb.CONTAINER:
        security.namespace_options.pid = pb.TARGET
        security.namespace_options.target_id = target_id
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=c.name, attempt=restart_count),
        image=pb.ImageSpec(image=c.image, user_specified_image=c.image),
        command=command, args=args, working_dir=c.working_dir,
        envs=[pb.KeyValue(key=k, value=v) for k, v in env],
        mounts=mounts,
        devices=block_devices(c, block or {}),
        labels=L.container_labels(pod.name, pod.namespace, pod.uid, c.name),
        annotations=L.container_annotations(container_hash(c), restart_count,
                                            pod.spec.termination_grace_period_seconds,
                                            c.lifecycle.pre_stop,
                                            (c.termination_message_path,
                                             str(c.termination_message_policy)), c.ports),
        log_path=L.container_log_path(c.name, restart_count),
        stop_signal=stop_signal(c.lifecycle.stop_signal),
        stdin=c.stdin, stdin_once=c.stdin_once, tty=c.tty,
        linux=pb.LinuxContainerConfig(
            resources=_resources(c, oom_score_adj),
            security_context=security),
    )


def termination_log_file(pods_dir: Path, uid: str, container: str, token: str) -> Path:
    """The kubelet's ``makeMounts`` file for one container instance:
    ``<rootDir>/pods/<uid>/containers/<name>/<8 hex>``, empty, mode 0666 (so any user the
    container runs as may write it); ``token``: the 8 hex digits (random per instance)."""
    folder = pods_dir / uid / "containers" / container
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / token
    path.touch()
    path.chmod(0o666)
    return path
