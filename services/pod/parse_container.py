"""Readers for containers: ports, env, resources, mounts (part of ``parse``)."""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from podvisor.common.quantity import QuantityError, cpu_millis, memory_bytes
from podvisor.services.pod import defaults as D
from podvisor.services.pod import downward, names, policy
from podvisor.services.pod.container import (
    MOUNT_PROPAGATIONS,
    RECURSIVE_READ_ONLY,
    RESIZABLE,
    ApiKeyRef,
    Container,
    ContainerPort,
    ContainerRestartPolicy,
    EnvFromSource,
    EnvVar,
    EnvVarSource,
    PortProtocol,
    PullPolicy,
    ResizePolicy,
    ResizeRestartPolicy,
    ResourceList,
    Resources,
    TerminationMessagePolicy,
    VolumeDevice,
    VolumeMount,
)
from podvisor.services.pod.fields import (
    Findings,
    as_map,
    check_fields,
    get_bool,
    get_enum,
    get_int,
    get_list,
    get_opt_int,
    get_str,
    get_str_list,
    join,
)
from podvisor.services.pod.parse_probe import parse_lifecycle, parse_probe
from podvisor.services.pod.parse_security import parse_container_security

INIT, REGULAR, EPHEMERAL = "init", "regular", "ephemeral"


def parse_container(f: Findings, raw: Any, path: str, volume_names: Collection[str],
                    host_network: bool, container_names: Collection[str] = (),
                    kind: str = REGULAR) -> Container | None:
    """One container of ``kind``: ``init`` (may be a sidecar: ``restartPolicy: Always``),
    ``regular`` or ``ephemeral`` (the API server's rules: no ports, probes, lifecycle,
    resources or restartPolicy; its ``targetContainerName`` is read by the spec)."""
    m = as_map(f, raw, path)
    if m is None:
        return None
    known = policy.CONTAINER_KNOWN | ({"envFrom"} if f.api_objects else set())
    if kind == EPHEMERAL:
        known = known | {policy.EPHEMERAL_TARGET}
        for key in policy.EPHEMERAL_FORBIDDEN:
            if m.get(key):  # an empty value sets nothing (kubectl debug sends resources: {})
                f.error(join(path, key), "Forbidden: cannot be set for an Ephemeral Container")
    check_fields(f, {k: v for k, v in m.items() if k != policy.CONTAINER_RESTART_POLICY},
                 path, known, policy.CONTAINER_UNSUPPORTED)
    name = get_str(f, m, "name", path, required=True)
    if name and (reason := names.dns1123_label(name)):
        f.error(join(path, "name"), reason)
    image = get_str(f, m, "image", path, required=True)
    if image and image.strip() != image:
        f.error(join(path, "image"), "must not have leading or trailing whitespace")
    ports = parse_ports(f, m, path, host_network)
    port_names = {p.name for p in ports if p.name}
    probes = {key: parse_probe(f, m[key], join(path, key), port_names,
                               readiness=key == "readinessProbe")
              for key in ("livenessProbe", "readinessProbe", "startupProbe")
              if m.get(key) is not None}
    lifecycle = parse_lifecycle(f, m.get("lifecycle") or {}, join(path, "lifecycle"), port_names)
    message_path = get_str(f, m, "terminationMessagePath", path) or D.TERMINATION_MESSAGE_PATH
    container = Container(
        name=name,
        image=image,
        command=get_str_list(f, m, "command", path),
        args=get_str_list(f, m, "args", path),
        env=_parse_env(f, m, path, container_names),
        env_from=_parse_env_from(f, m, path) if f.api_objects else (),
        working_dir=get_str(f, m, "workingDir", path),
        ports=ports,
        resources=_parse_resources(f, m.get("resources"), join(path, "resources")),
        liveness_probe=probes.get("livenessProbe"),
        readiness_probe=probes.get("readinessProbe"),
        startup_probe=probes.get("startupProbe"),
        lifecycle=lifecycle,
        image_pull_policy=get_enum(f, m, "imagePullPolicy", path, PullPolicy,
                                   default_pull_policy(image)),
        volume_mounts=_parse_mounts(f, m, path, volume_names),
        volume_devices=_parse_devices(f, m, path, volume_names),
        security_context=parse_container_security(f, m.get("securityContext"),
                                                  join(path, "securityContext")),
        termination_message_path=message_path,
        termination_message_policy=get_enum(f, m, "terminationMessagePolicy", path,
                                            TerminationMessagePolicy,
                                            TerminationMessagePolicy.FILE),
        restart_policy=_restart_policy(f, m, path, kind),
        resize_policy=_resize_policy(f, m.get("resizePolicy"), join(path, "resizePolicy"))
        if kind != EPHEMERAL else (),
    )
    check_bidirectional(f, container, path)
    return replace(container, stdin=get_bool(f, m, "stdin", path),
                   stdin_once=get_bool(f, m, "stdinOnce", path), tty=get_bool(f, m, "tty", path))


def _restart_policy(f: Findings, m: Mapping[str, Any], path: str,
                    kind: str) -> ContainerRestartPolicy | None:
    """The API server's rule (1.33): only an init container may set it, and only to Always."""
    value = m.get(policy.CONTAINER_RESTART_POLICY)
    if value is None:
        return None
    where = join(path, policy.CONTAINER_RESTART_POLICY)
    if kind == REGULAR:
        f.error(where, "Forbidden: may not be set for non-init containers")
        return None
    if kind == EPHEMERAL:
        return None  # already refused with the other fields an ephemeral container may not set
    if value != str(ContainerRestartPolicy.ALWAYS):
        f.error(where, f'Unsupported value: "{value}": supported values: "Always"')
        return None
    return ContainerRestartPolicy.ALWAYS


def _resize_policy(f: Findings, raw: Any, path: str) -> tuple[ResizePolicy, ...]:
    """The API server's ``validateResizePolicy`` (1.33): cpu or memory, once each, NotRequired
    (the default) or RestartContainer."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        f.error(path, "must be a list")
        return ()
    out: list[ResizePolicy] = []
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        m = as_map(f, item, where)
        if m is None:
            continue
        name = get_str(f, m, "resourceName", where, required=True)
        if name and name not in RESIZABLE:
            f.error(join(where, "resourceName"),
                    f'Unsupported value: "{name}": supported values: "cpu", "memory"')
            continue
        if any(p.resource_name == name for p in out):
            f.error(join(where, "resourceName"), f'Duplicate value: "{name}"')
            continue
        policy_value = get_enum(f, m, "restartPolicy", where, ResizeRestartPolicy,
                                ResizeRestartPolicy.NOT_REQUIRED)
        if name:
            out.append(ResizePolicy(name, policy_value))
    return tuple(out)


def default_pull_policy(image: str) -> PullPolicy:
    """Always for ``:latest`` or untagged images, IfNotPresent otherwise (API defaulting)."""
    if "@" in image:
        return PullPolicy.IF_NOT_PRESENT
    last = image.rsplit("/", 1)[-1]
    tag = last.rpartition(":")[2] if ":" in last else ""
    return PullPolicy.ALWAYS if tag in ("", "latest") else PullPolicy.IF_NOT_PRESENT


def parse_ports(f: Findings, m: Mapping[str, Any], path: str,
                host_network: bool) -> tuple[ContainerPort, ...]:
    out: list[ContainerPort] = []
    seen_names: set[str] = set()
    for where, item in get_list(f, m, "ports", path):
        p = as_map(f, item, where)
        if p is None:
            continue
        check_fields(f, p, where, policy.PORT_KNOWN, policy.PORT_UNSUPPORTED)
        port = get_opt_int(f, p, "containerPort", where, minimum=1, maximum=65535,
                           required=True) or 0
        host_port = get_int(f, p, "hostPort", where, 0, minimum=0, maximum=65535)
        if host_network and host_port == 0:
            host_port = port
        elif host_network and host_port != port:
            f.error(join(where, "hostPort"), "must equal containerPort when hostNetwork is true")
        name = get_str(f, p, "name", where)
        if name and (reason := names.port_name(name)):
            f.error(join(where, "name"), reason)
        elif name and name in seen_names:  # unnamed ports are fine, as in Kubernetes
            f.error(join(where, "name"), f"duplicate port name {name!r}")
        if name:
            seen_names.add(name)
        protocol = get_enum(f, p, "protocol", where, PortProtocol, PortProtocol.TCP)
        host_ip = get_str(f, p, "hostIP", where)
        try:
            host_ip = str(ipaddress.ip_address(host_ip)) if host_ip else ""
        except ValueError:
            f.error(join(where, "hostIP"), f"Invalid value: {host_ip!r}: must be a valid IP "
                                           "address")
        out.append(ContainerPort(port, host_port, protocol, name, host_ip))
    return tuple(out)


def _parse_env(f: Findings, m: Mapping[str, Any], path: str,
               container_names: Collection[str]) -> tuple[EnvVar, ...]:
    out: list[EnvVar] = []
    for where, item in get_list(f, m, "env", path):
        e = as_map(f, item, where)
        if e is None:
            continue
        check_fields(f, e, where, policy.ENV_KNOWN, {})
        name = get_str(f, e, "name", where, required=True)
        if name and (reason := names.env_var_name(name)):
            f.error(join(where, "name"), reason)
        value = get_str(f, e, "value", where)
        source: EnvVarSource | None = None
        if e.get("valueFrom") is not None:
            source = _parse_value_from(f, e["valueFrom"], join(where, "valueFrom"), value,
                                       container_names)
        out.append(EnvVar(name, "" if source is not None else value, source))
    return tuple(out)


def _parse_value_from(f: Findings, raw: Any, where: str, value: str,
                      container_names: Collection[str]) -> EnvVarSource | None:
    """``validateEnvVarValueFrom``: exactly one source, and no ``value`` beside it."""
    m = as_map(f, raw, where)
    if m is None:
        return None
    known = (*policy.VALUE_FROM_KNOWN, *policy.API_VALUE_FROM) if f.api_objects \
        else policy.VALUE_FROM_KNOWN
    check_fields(f, m, where, known, policy.VALUE_FROM_UNSUPPORTED)
    sources = [k for k in (*policy.VALUE_FROM_KNOWN, *policy.VALUE_FROM_UNSUPPORTED)
               if m.get(k) is not None]
    if not sources:
        f.error(where, "Invalid value: \"\": must specify one of: `fieldRef`, "
                       "`resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`")
        return None
    if value:
        f.error(where, "Invalid value: \"\": may not be specified when `value` is not empty")
        return None
    if len(sources) > 1:
        f.error(where, "Invalid value: \"\": may not have more than one field specified at "
                       "a time")
        return None
    if sources[0] == "fieldRef":
        return downward.parse_field_ref(f, m["fieldRef"], join(where, "fieldRef"),
                                        downward.ENV_FIELD_PATHS)
    if sources[0] == "resourceFieldRef":
        sel = downward.parse_resource_field_ref(f, m["resourceFieldRef"],
                                                join(where, "resourceFieldRef"), volume=False)
        if sel is not None and sel.container_name and container_names and (
                sel.container_name not in container_names):
            f.error(join(where, "resourceFieldRef.containerName"),
                    f'Invalid value: "{sel.container_name}": no container with that name')
            return None
        return sel
    if f.api_objects and sources[0] in policy.API_VALUE_FROM:
        ref = as_map(f, m[sources[0]], join(where, sources[0]))
        if ref is None:
            return None
        ref_where = join(where, sources[0])
        check_fields(f, ref, ref_where, {"name", "key", "optional"}, {})
        name = get_str(f, ref, "name", ref_where, required=True)
        key = get_str(f, ref, "key", ref_where, required=True)
        return ApiKeyRef(sources[0], name, key, bool(ref.get("optional")))
    return None  # an API object reference: already rejected by check_fields


def _parse_env_from(f: Findings, m: Mapping[str, Any], path: str) -> tuple[EnvFromSource, ...]:
    out: list[EnvFromSource] = []
    for where, item in get_list(f, m, "envFrom", path):
        e = as_map(f, item, where)
        if e is None:
            continue
        check_fields(f, e, where, {"prefix", "configMapRef", "secretRef"}, {})
        kinds = [k for k in ("configMapRef", "secretRef") if e.get(k) is not None]
        if len(kinds) != 1:
            f.error(where, "must specify exactly one of: configMapRef, secretRef")
            continue
        ref = as_map(f, e[kinds[0]], join(where, kinds[0]))
        if ref is None:
            continue
        check_fields(f, ref, join(where, kinds[0]), {"name", "optional"}, {})
        name = get_str(f, ref, "name", join(where, kinds[0]), required=True)
        out.append(EnvFromSource(kinds[0], name, get_str(f, e, "prefix", where),
                                 bool(ref.get("optional"))))
    return tuple(out)


def _parse_resources(f: Findings, raw: Any, path: str) -> Resources:
    if raw is None:
        return Resources()
    m = as_map(f, raw, path)
    if m is None:
        return Resources()
    check_fields(f, m, path, policy.RESOURCES_KNOWN, policy.RESOURCES_UNSUPPORTED)
    limits = _parse_resource_list(f, m.get("limits"), join(path, "limits"))
    requests = _parse_resource_list(f, m.get("requests"), join(path, "requests"))
    cpu = requests.cpu_millis if requests.cpu_millis is not None else limits.cpu_millis
    memory = requests.memory_bytes if requests.memory_bytes is not None else limits.memory_bytes
    for key, request, limit in (("cpu", cpu, limits.cpu_millis),
                                ("memory", memory, limits.memory_bytes)):
        if request is not None and limit is not None and request > limit:
            f.error(join(path, f"requests.{key}"), f"must be less than or equal to {key} limit")
    storage = requests.ephemeral_storage_bytes if requests.ephemeral_storage_bytes is not None \
        else limits.ephemeral_storage_bytes
    return Resources(limits=limits, requests=ResourceList(cpu, memory, requests.hugepages,
                                                          storage))


def _parse_resource_list(f: Findings, raw: Any, path: str) -> ResourceList:
    if raw is None:
        return ResourceList()
    m = as_map(f, raw, path)
    if m is None:
        return ResourceList()
    cpu: int | None = None
    memory: int | None = None
    hugepages: list[tuple[str, int]] = []
    storage: int | None = None
    for key, value in m.items():
        where = join(path, key)
        try:
            if key == "cpu":
                cpu = cpu_millis(value)
            elif key == "memory":
                memory = memory_bytes(value)
            elif key.startswith(policy.HUGEPAGES_PREFIX):
                size = key[len(policy.HUGEPAGES_PREFIX):]
                if memory_bytes(size) <= 0:
                    raise QuantityError(f"{size!r} is not a page size")
                hugepages.append((size, memory_bytes(value)))  # the runtime enforces or refuses
            elif key == policy.EPHEMERAL_STORAGE:
                storage = memory_bytes(value)  # enforced by eviction (services/eviction)
            else:
                f.error(where, f"extended resource {key!r} is not available on this node")
        except QuantityError as exc:
            f.error(where, str(exc))
    return ResourceList(cpu, memory, tuple(hugepages), storage)


def _parse_mounts(f: Findings, m: Mapping[str, Any], path: str,
                  volume_names: Collection[str]) -> tuple[VolumeMount, ...]:
    out: list[VolumeMount] = []
    seen_paths: set[str] = set()
    for where, item in get_list(f, m, "volumeMounts", path):
        v = as_map(f, item, where)
        if v is None:
            continue
        check_fields(f, v, where, policy.MOUNT_KNOWN, policy.MOUNT_UNSUPPORTED)
        name = get_str(f, v, "name", where, required=True)
        if name and name not in volume_names:
            f.error(join(where, "name"), f"no volume named {name!r} in spec.volumes")
        mount_path = get_str(f, v, "mountPath", where, required=True)
        if mount_path and not mount_path.startswith("/"):
            f.error(join(where, "mountPath"), "must be an absolute path")
        elif mount_path in seen_paths:
            f.error(join(where, "mountPath"), f"{mount_path!r} is mounted twice")
        seen_paths.add(mount_path)
        sub_path = get_str(f, v, "subPath", where)
        if sub_path.startswith("/") or ".." in sub_path.split("/"):
            f.error(join(where, "subPath"), "must be a relative path without '..'")
        expr = get_str(f, v, "subPathExpr", where)
        if expr and sub_path:
            f.error(join(where, "subPathExpr"), "subPathExpr and subPath are mutually exclusive")
        elif expr.startswith("/") or ".." in expr.split("/"):
            f.error(join(where, "subPathExpr"), "must be a relative path without '..'")
        propagation = get_str(f, v, "mountPropagation", where)
        if propagation and propagation not in MOUNT_PROPAGATIONS:
            f.error(join(where, "mountPropagation"),
                    f"Unsupported value: {propagation!r}: supported values: "
                    f"{', '.join(repr(p) for p in MOUNT_PROPAGATIONS)}")
            propagation = ""
        read_only = get_bool(f, v, "readOnly", where)
        rro = _recursive_read_only(f, v, where, read_only, propagation)
        out.append(VolumeMount(name, mount_path, read_only, sub_path, expr, propagation, rro))
    return tuple(out)


def _parse_devices(f: Findings, m: Mapping[str, Any], path: str,
                   volume_names: Collection[str]) -> tuple[VolumeDevice, ...]:
    """``volumeDevices`` as the API server's ``validateVolumeDevices`` checks them (the volume
    being a claim is checked with the pod's volumes: ``check_block_devices``)."""
    out: list[VolumeDevice] = []
    names: set[str] = set()
    paths: set[str] = set()
    raw_mounts = m.get("volumeMounts")
    mounts: list[Any] = raw_mounts if isinstance(raw_mounts, list) else []
    mount_names = {v.get("name") for v in mounts if isinstance(v, Mapping)}
    mount_paths = {v.get("mountPath") for v in mounts if isinstance(v, Mapping)}
    for where, item in get_list(f, m, "volumeDevices", path):
        v = as_map(f, item, where)
        if v is None:
            continue
        check_fields(f, v, where, frozenset({"name", "devicePath"}), {})
        name = get_str(f, v, "name", where, required=True)
        device_path = get_str(f, v, "devicePath", where, required=True)
        if name and name in names:
            f.error(join(where, "name"), f"Invalid value: {name!r}: must be unique")
        elif name and name not in volume_names:
            f.error(join(where, "name"), f"Not found: {name!r}")
        if device_path in paths:
            f.error(join(where, "devicePath"), f"Invalid value: {device_path!r}: must be unique")
        elif device_path and ".." in device_path.split("/"):
            f.error(join(where, "devicePath"), f"Invalid value: {device_path!r}: can not "
                                               "contain backsteps ('..')")
        elif device_path and not device_path.startswith("/"):
            f.error(join(where, "devicePath"), "must be an absolute path")
        if name and name in mount_names:
            f.error(join(path, "volumeDevices.name"), f"Invalid value: {name!r}: must not "
                                                         "already exist in volumeMounts")
        if device_path and device_path in mount_paths:
            f.error(join(path, "volumeDevices.devicePath"),
                    f"Invalid value: {device_path!r}: must not already exist as a path in "
                    "volumeMounts")
        names.add(name)
        paths.add(device_path)
        out.append(VolumeDevice(name, device_path))
    return tuple(out)


def _recursive_read_only(f: Findings, v: Mapping[str, Any], where: str, read_only: bool,
                         propagation: str) -> str:
    """``recursiveReadOnly`` as the API server's ``validateVolumeMounts`` checks it: IfPossible
    and Enabled only on a read-only mount whose propagation is None or unset."""
    rro = get_str(f, v, "recursiveReadOnly", where)
    field = join(where, "recursiveReadOnly")
    if rro and rro not in RECURSIVE_READ_ONLY:
        f.error(field, f"Unsupported value: {rro!r}: supported values: "
                       f"{', '.join(repr(x) for x in RECURSIVE_READ_ONLY)}")
        return ""
    if rro in ("IfPossible", "Enabled"):
        if not read_only:
            f.error(field, "Forbidden: may only be specified when readOnly is true")
        if propagation not in ("", "None"):
            f.error(field, "Forbidden: may only be specified when mountPropagation is None or "
                           "not specified")
    return rro


def check_bidirectional(f: Findings, c: Container, path: str) -> None:
    """The API server's ``validateMountPropagation``."""
    privileged = c.security_context is not None and bool(c.security_context.privileged)
    for i, m in enumerate(c.volume_mounts):
        if m.mount_propagation == "Bidirectional" and not privileged:
            f.error(f"{path}.volumeMounts[{i}].mountPropagation", "Bidirectional mount "
                    "propagation is available only to privileged containers")
