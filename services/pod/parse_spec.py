"""Readers for the pod spec and its volumes (part of ``parse``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podvisor.common.quantity import QuantityError, memory_bytes
from podvisor.services.pod import defaults as D
from podvisor.services.pod import downward, names, policy
from podvisor.services.pod.container import (
    Container,
    EphemeralContainer,
    ObjectFieldSelector,
    ResourceFieldSelector,
)
from podvisor.services.pod.dns import parse_pod_dns
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
    join,
)
from podvisor.services.pod.model import (
    ApiVolume,
    ClaimVolume,
    DNSPolicy,
    DownwardAPIFile,
    DownwardAPIVolume,
    EmptyDirVolume,
    EphemeralVolume,
    HostPathType,
    HostPathVolume,
    PodSpec,
    RestartPolicy,
    StorageMedium,
    TaintEffect,
    Toleration,
    TolerationOperator,
    Volume,
    VolumeSource,
)
from podvisor.services.pod.parse_claims import parse_claim, parse_csi, parse_ephemeral
from podvisor.services.pod.parse_container import EPHEMERAL, INIT, REGULAR, parse_container
from podvisor.services.pod.parse_plugins import parse_plugin_volume
from podvisor.services.pod.parse_security import parse_pod_security

_DEFAULT_SERVICE_ACCOUNTS = ("", "default")
# the API server's built-in PriorityClasses: what its priority admission sets when a pod
# names one (a static pod's priority the same way; graceful node shutdown groups by it)
SYSTEM_PRIORITY_CLASSES = {"system-node-critical": 2_000_001_000,
                           "system-cluster-critical": 2_000_000_000}


def _check_os(f: Findings, m: Mapping[str, Any], path: str) -> None:
    """``spec.os`` (warned: the pod runs on this node's OS) names this node's OS, or the pod is
    refused as the kubelet's admission refuses it (PodOSNotSupported)."""
    raw = m.get("os")
    name = raw.get("name") if isinstance(raw, Mapping) else None
    where = join(join(path, "os"), "name")
    if name not in (None, "linux", "windows"):
        f.error(where, f"Unsupported value: {name!r}: supported values: \"linux\", \"windows\"")
    elif name == "windows":
        f.error(where, "the pod's OS (windows) is not this node's (linux): the kubelet refuses "
                       "it at admission (PodOSNotSupported)")


def parse_spec(f: Findings, raw: Any, path: str) -> PodSpec | None:
    if raw is None:
        f.error(path, "required")
        return None
    m = as_map(f, raw, path)
    if m is None:
        return None
    check_fields(f, m, path, policy.SPEC_KNOWN, policy.SPEC_UNSUPPORTED)
    accounts = {}
    for key in ("serviceAccountName", "serviceAccount"):
        accounts[key] = get_str(f, m, key, path)
        if accounts[key] not in _DEFAULT_SERVICE_ACCOUNTS and not f.api_objects:
            f.error(join(path, key), f"static pods may not reference API objects "
                                     f"(ServiceAccount {accounts[key]!r})")
    # v1 -> internal conversion: the deprecated serviceAccount fills an empty
    # serviceAccountName.
    account = accounts["serviceAccountName"] or accounts["serviceAccount"]
    dns_policy = get_enum(f, m, "dnsPolicy", path, DNSPolicy, DNSPolicy.CLUSTER_FIRST)
    dns = parse_pod_dns(f, m, path, dns_policy is DNSPolicy.NONE)
    container_names = _raw_container_names(m)
    volumes = _parse_volumes(f, m, path, container_names)
    volume_names = {v.name for v in volumes}
    host_network = get_bool(f, m, "hostNetwork", path)
    host_pid = get_bool(f, m, "hostPID", path)
    host_ipc = get_bool(f, m, "hostIPC", path)
    share_pid = get_bool(f, m, "shareProcessNamespace", path)
    if host_pid and share_pid:  # the API server's validation
        f.error(join(path, "shareProcessNamespace"),
                "ShareProcessNamespace and HostPID cannot both be enabled")
    init = _parse_containers(f, m, path, "initContainers", volume_names, host_network,
                             container_names, INIT)
    containers = _parse_containers(f, m, path, "containers", volume_names, host_network,
                                   container_names, REGULAR)
    if not containers and not any(e.field.startswith(join(path, "containers")) for e in f.errors):
        f.error(join(path, "containers"), "required (at least one container)")
    ephemeral = _parse_ephemeral(f, m, path, volume_names, host_network, container_names,
                                 {c.name for c in (*init, *containers)})
    _check_unique_names(f, m, path, init, containers,
                        tuple(e.container for e in ephemeral))
    _check_block_devices(f, path, volumes, init, containers)
    if m.get("hostUsers") is False:
        f.error(join(path, "hostUsers"), "user namespaces are not supported by podvisor (the "
                                         "pod would run in the node's user namespace)")
    elif m.get("hostUsers") is not None and not isinstance(m["hostUsers"], bool):
        f.error(join(path, "hostUsers"), "must be true or false")
    _check_os(f, m, path)
    return PodSpec(
        containers=containers,
        init_containers=init,
        restart_policy=get_enum(f, m, "restartPolicy", path, RestartPolicy,
                                RestartPolicy.ALWAYS),
        termination_grace_period_seconds=get_int(f, m, "terminationGracePeriodSeconds", path,
                                                 30, minimum=0),
        host_network=host_network,
        host_pid=host_pid,
        host_ipc=host_ipc,
        share_process_namespace=share_pid,
        volumes=volumes,
        node_name=get_str(f, m, "nodeName", path),
        priority=get_int(f, m, "priority", path,
                         SYSTEM_PRIORITY_CLASSES.get(str(m.get("priorityClassName")), 0)),
        security_context=parse_pod_security(f, m.get("securityContext"),
                                            join(path, "securityContext"), host_network,
                                            host_ipc),
        service_account_name=account,
        runtime_class_name=_runtime_class_name(f, m, path),
        dns_policy=dns_policy,
        scheduler_name=get_str(f, m, "schedulerName", path) or D.SCHEDULER_NAME,
        enable_service_links=(D.ENABLE_SERVICE_LINKS if m.get("enableServiceLinks") is None
                              else get_bool(f, m, "enableServiceLinks", path)),
        tolerations=_parse_tolerations(f, m, path),
        dns=dns,
        ephemeral_containers=ephemeral,
        image_pull_secrets=_parse_pull_secrets(f, m, path),
        active_deadline_seconds=get_opt_int(f, m, "activeDeadlineSeconds", path, minimum=1,
                                            maximum=2147483647),
        readiness_gates=_parse_readiness_gates(f, m, path),
    )


def _parse_pull_secrets(f: Findings, m: Mapping[str, Any], path: str) -> tuple[str, ...]:
    """``imagePullSecrets``: Secret names in the pod's namespace (an empty entry is allowed
    by the API and ignored by the kubelet; kept as written)."""
    out: list[str] = []
    for where, item in get_list(f, m, "imagePullSecrets", path):
        ref = as_map(f, item, where)
        if ref is None:
            continue
        check_fields(f, ref, where, {"name"}, {})
        out.append(get_str(f, ref, "name", where))
    return tuple(out)


def _parse_readiness_gates(f: Findings, m: Mapping[str, Any], path: str) -> tuple[str, ...]:
    out: list[str] = []
    for where, item in get_list(f, m, "readinessGates", path):
        gate = as_map(f, item, where)
        if gate is None:
            continue
        check_fields(f, gate, where, {"conditionType"}, {})
        ctype = get_str(f, gate, "conditionType", where, required=True)
        if ctype and (reason := names.qualified_name(ctype)):
            f.error(join(where, "conditionType"), reason)
        out.append(ctype)
    return tuple(out)


def _check_block_devices(f: Findings, path: str, volumes: tuple[Volume, ...],
                         init: tuple[Container, ...], containers: tuple[Container, ...]) -> None:
    """The API server's ``validateVolumeDevices``: a raw block device comes from a claim (a
    ``persistentVolumeClaim`` or an ``ephemeral`` volume)."""
    claims = {v.name for v in volumes if isinstance(v.source, ClaimVolume | EphemeralVolume)}
    for key, group in (("initContainers", init), ("containers", containers)):
        for i, c in enumerate(group):
            for j, d in enumerate(c.volume_devices):
                if d.name in {v.name for v in volumes} and d.name not in claims:
                    f.error(f"{path}.{key}[{i}].volumeDevices[{j}].name",
                            f"Invalid value: {d.name!r}: can only use volume source type of "
                            "PersistentVolumeClaim or Ephemeral for block mode")


def _parse_ephemeral(f: Findings, m: Mapping[str, Any], path: str, volume_names: set[str],
                     host_network: bool, container_names: frozenset[str],
                     targets: set[str]) -> tuple[EphemeralContainer, ...]:
    """``ephemeralContainers`` (the API server's ``validateEphemeralContainers``): a
    ``targetContainerName`` must name an init or regular container of the pod."""
    out: list[EphemeralContainer] = []
    for where, item in get_list(f, m, "ephemeralContainers", path):
        c = parse_container(f, item, where, volume_names, host_network, container_names,
                            EPHEMERAL)
        if c is None:
            continue
        target = get_str(f, item, "targetContainerName", where)
        if target and target not in targets:
            f.error(join(where, "targetContainerName"),
                    f'Not found: "{target}": must be a container in the pod')
        out.append(EphemeralContainer(c, target))
    return tuple(out)


def _raw_container_names(m: Mapping[str, Any]) -> frozenset[str]:
    out: set[str] = set()
    for key in ("initContainers", "containers"):
        items = m.get(key)
        for item in items if isinstance(items, list) else ():
            if isinstance(item, Mapping) and isinstance(item.get("name"), str):
                out.add(item["name"])
    return frozenset(out)


def _parse_tolerations(f: Findings, m: Mapping[str, Any], path: str) -> tuple[Toleration, ...]:
    out: list[Toleration] = []
    for where, item in get_list(f, m, "tolerations", path):
        t = as_map(f, item, where)
        if t is None:
            continue
        check_fields(f, t, where, policy.TOLERATION_KNOWN, {})
        key = get_str(f, t, "key", where)
        if key and (reason := names.qualified_name(key)):
            f.error(join(where, "key"), reason)
        operator = get_enum(f, t, "operator", where, TolerationOperator,
                            TolerationOperator.UNSET)
        value = get_str(f, t, "value", where)
        if operator is TolerationOperator.EXISTS and value:
            f.error(join(where, "operator"), "value must be empty when `operator` is 'Exists'")
        if not key and operator is not TolerationOperator.EXISTS:
            f.error(join(where, "operator"), "operator must be Exists when `key` is empty")
        effect = get_enum(f, t, "effect", where, TaintEffect, TaintEffect.ALL)
        seconds = get_opt_int(f, t, "tolerationSeconds", where)
        if seconds is not None and effect is not TaintEffect.NO_EXECUTE:
            f.error(join(where, "effect"), "effect must be 'NoExecute' when `tolerationSeconds` "
                                           "is set")
        out.append(Toleration(key, operator, value, effect, seconds))
    return tuple(out)


def _parse_containers(f: Findings, m: Mapping[str, Any], path: str, key: str,
                      volume_names: set[str], host_network: bool,
                      container_names: frozenset[str], kind: str) -> tuple[Container, ...]:
    out: list[Container] = []
    for where, item in get_list(f, m, key, path):
        container = parse_container(f, item, where, volume_names, host_network, container_names,
                                    kind)
        if container is not None:
            out.append(container)
    return tuple(out)


def _check_unique_names(f: Findings, m: Mapping[str, Any], path: str,
                        init: tuple[Container, ...], containers: tuple[Container, ...],
                        ephemeral: tuple[Container, ...] = ()) -> None:
    seen: set[str] = set()
    for key, group in (("initContainers", init), ("containers", containers),
                       ("ephemeralContainers", ephemeral)):
        for i, container in enumerate(group):
            if container.name and container.name in seen:
                f.error(join(path, f"{key}[{i}].name"),
                        f"duplicate container name {container.name!r}")
            seen.add(container.name)


def _parse_volumes(f: Findings, m: Mapping[str, Any], path: str,
                   container_names: frozenset[str]) -> tuple[Volume, ...]:
    out: list[Volume] = []
    seen: set[str] = set()
    for where, item in get_list(f, m, "volumes", path):
        v = as_map(f, item, where)
        if v is None:
            continue
        known = policy.VOLUME_KNOWN | set(policy.API_VOLUME_KINDS) \
            | set(policy.MOUNTED_VOLUME_KINDS) if f.api_objects else policy.VOLUME_KNOWN
        check_fields(f, v, where, known, policy.VOLUME_UNSUPPORTED,
                     reject_unknown=policy.VOLUME_UNKNOWN_REASON)
        name = get_str(f, v, "name", where, required=True)
        if name and (reason := names.dns1123_label(name)):
            f.error(join(where, "name"), reason)
        elif name in seen:
            f.error(join(where, "name"), f"duplicate volume name {name!r}")
        seen.add(name)
        source = _parse_volume_source(f, v, where, container_names)
        if source is not None:
            out.append(Volume(name, source))
    return tuple(out)


def _parse_volume_source(f: Findings, v: Mapping[str, Any], where: str,
                         container_names: frozenset[str]) -> VolumeSource | None:
    kinds = ("emptyDir", "hostPath", "downwardAPI", *policy.PLUGIN_VOLUME_KINDS,
             *(policy.API_VOLUME_KINDS + policy.MOUNTED_VOLUME_KINDS if f.api_objects else ()))
    present = [k for k in kinds if v.get(k) is not None or k in v]
    if not present and not any(e.field.startswith(where) for e in f.errors):
        return EmptyDirVolume()  # SetDefaults_Volume: no source is an emptyDir
    if len(present) != 1:
        if not any(e.field.startswith(where) for e in f.errors):
            f.error(where, "must specify exactly one volume source (emptyDir, hostPath or "
                           "downwardAPI)")
        return None
    kind = present[0]
    body = as_map(f, v[kind] if v[kind] is not None else {}, join(where, kind))
    if body is None:
        return None
    if kind == "downwardAPI":
        return _parse_downward_api(f, body, join(where, kind), container_names)
    if kind in policy.API_VOLUME_KINDS:
        return _parse_api_volume(f, kind, body, join(where, kind), container_names)
    if kind == "persistentVolumeClaim":
        return parse_claim(f, body, join(where, kind))
    if kind == "ephemeral":
        return parse_ephemeral(f, body, join(where, kind))
    if kind == "csi":
        return parse_csi(f, body, join(where, kind))
    if kind in policy.PLUGIN_VOLUME_KINDS:
        return parse_plugin_volume(f, kind, body, join(where, kind))
    if kind == "hostPath":
        check_fields(f, body, join(where, kind), policy.HOST_PATH_KNOWN, {})
        host_path = get_str(f, body, "path", join(where, kind), required=True)
        if host_path and not host_path.startswith("/"):
            f.error(join(where, "hostPath.path"), "must be an absolute path")
        return HostPathVolume(host_path, get_enum(f, body, "type", join(where, kind),
                                                  HostPathType, HostPathType.UNSET))
    check_fields(f, body, join(where, kind), policy.EMPTY_DIR_KNOWN, {})
    medium = get_enum(f, body, "medium", join(where, kind), StorageMedium,
                      StorageMedium.DEFAULT)
    # Both stay in the model (and so in the wire form and the static pod's UID): a warning,
    # not a change of the pod. Only the sources report warnings.
    if medium is StorageMedium.MEMORY:
        f.warn(join(where, "emptyDir.medium"), "Memory (tmpfs) is not supported: the volume is "
                                               "a directory on the node's disk; ignored")
    size: int | None = None
    if body.get("sizeLimit") is not None:
        try:
            size = memory_bytes(body["sizeLimit"])
        except QuantityError as exc:
            f.error(join(where, "emptyDir.sizeLimit"), str(exc))
        else:
            f.warn(join(where, "emptyDir.sizeLimit"), "enforced by eviction for API pods only "
                                                      "(a static pod is never evicted)")
    return EmptyDirVolume(medium, size)


def _parse_mode(f: Findings, m: Mapping[str, Any], key: str, where: str) -> int | None:
    mode = get_opt_int(f, m, key, where)
    if mode is not None and not 0 <= mode <= 0o777:
        f.error(join(where, key), f"Invalid value: {mode}: must be a number between 0 and "
                                  "0777 (octal), both inclusive")
        return None
    return mode


def _parse_downward_api(f: Findings, body: Mapping[str, Any], where: str,
                        container_names: frozenset[str]) -> DownwardAPIVolume | None:
    """``validateDownwardAPIVolumeSource``: each item one source, a relative path without
    '..', modes within 0..0777."""
    check_fields(f, body, where, policy.DOWNWARD_API_KNOWN, {})
    default_mode = _parse_mode(f, body, "defaultMode", where)
    items: list[DownwardAPIFile] = []
    seen: set[str] = set()
    for item_where, raw in get_list(f, body, "items", where):
        item = as_map(f, raw, item_where)
        if item is None:
            continue
        check_fields(f, item, item_where, policy.DOWNWARD_API_ITEM_KNOWN, {})
        file_path = get_str(f, item, "path", item_where)
        if not file_path:
            f.error(join(item_where, "path"), "Required value")
        elif (file_path.startswith("/") or ".." in file_path.split("/")
              or file_path.startswith("..")):
            f.error(join(item_where, "path"), f'Invalid value: "{file_path}": must be a '
                                              "relative path without '..' and must not start "
                                              "with '..'")
        elif file_path in seen:
            f.error(join(item_where, "path"), f'Duplicate value: "{file_path}"')
        seen.add(file_path)
        mode = _parse_mode(f, item, "mode", item_where)
        has_field, has_resource = (item.get(k) is not None
                                   for k in ("fieldRef", "resourceFieldRef"))
        source: ObjectFieldSelector | ResourceFieldSelector | None = None
        if has_field and has_resource:
            f.error(item_where, "fieldRef and resourceFieldRef can not be specified "
                                "simultaneously")
        elif has_field:
            source = downward.parse_field_ref(f, item["fieldRef"], join(item_where, "fieldRef"),
                                              downward.VOLUME_FIELD_PATHS)
        elif has_resource:
            where_ref = join(item_where, "resourceFieldRef")
            source = downward.parse_resource_field_ref(f, item["resourceFieldRef"], where_ref,
                                                       volume=True)
            if source is not None and source.container_name not in container_names:
                f.error(join(where_ref, "containerName"),
                        f'Invalid value: "{source.container_name}": no container with that name')
                source = None
        else:
            f.error(item_where, "must specify one of: `fieldRef` or `resourceFieldRef`")
        if source is not None and file_path:
            items.append(DownwardAPIFile(file_path, source, mode))
    return DownwardAPIVolume(tuple(items), D.DOWNWARD_API_DEFAULT_MODE if default_mode is None
                             else default_mode)


def _parse_key_items(f: Findings, body: Mapping[str, Any], where: str) -> None:
    for item_where, raw in get_list(f, body, "items", where):
        item = as_map(f, raw, item_where)
        if item is None:
            continue
        check_fields(f, item, item_where, policy.KEY_TO_PATH_KNOWN, {})
        if not get_str(f, item, "key", item_where):
            f.error(join(item_where, "key"), "Required value")
        _check_relative(f, get_str(f, item, "path", item_where), join(item_where, "path"))
        _parse_mode(f, item, "mode", item_where)


def _check_relative(f: Findings, file_path: str, where: str) -> None:
    if not file_path:
        f.error(where, "Required value")
    elif file_path.startswith("/") or ".." in file_path.split("/"):
        f.error(where, f'Invalid value: "{file_path}": must be a relative path without '
                       "'..'")


def _parse_object_source(f: Findings, kind: str, body: Mapping[str, Any], where: str,
                         projected: bool) -> None:
    if kind == "configMap":
        check_fields(f, body, where, policy.CONFIG_MAP_VOLUME_KNOWN - (
            {"defaultMode"} if projected else set()), {})
        get_str(f, body, "name", where, required=True)
    else:
        name_key = "name" if projected else "secretName"
        check_fields(f, body, where, (policy.SECRET_VOLUME_KNOWN - {"secretName",
                                                                    "defaultMode"})
                     | {name_key} | (set() if projected else {"defaultMode"}), {})
        get_str(f, body, name_key, where, required=True)
    _parse_key_items(f, body, where)
    if not projected:
        _parse_mode(f, body, "defaultMode", where)


def _parse_api_volume(f: Findings, kind: str, body: Mapping[str, Any], where: str,
                      container_names: frozenset[str]) -> ApiVolume | None:
    """``configMap``/``secret``/``projected`` (API pods): validated here, kept as written."""
    errors = len(f.errors)
    if kind in ("configMap", "secret"):
        _parse_object_source(f, kind, body, where, projected=False)
    else:
        check_fields(f, body, where, policy.PROJECTED_KNOWN, {})
        _parse_mode(f, body, "defaultMode", where)
        for src_where, raw in get_list(f, body, "sources", where):
            src = as_map(f, raw, src_where)
            if src is None:
                continue
            present = [k for k in policy.PROJECTION_KINDS if src.get(k) is not None]
            if len(present) != 1:
                f.error(src_where, "must specify exactly one of: configMap, secret, "
                                   "downwardAPI, serviceAccountToken")
                continue
            sub = as_map(f, src[present[0]], join(src_where, present[0]))
            if sub is None:
                continue
            sub_where = join(src_where, present[0])
            if present[0] == "downwardAPI":
                _parse_downward_api(f, sub, sub_where, container_names)
            elif present[0] == "serviceAccountToken":
                check_fields(f, sub, sub_where, policy.SA_TOKEN_KNOWN, {})
                _check_relative(f, get_str(f, sub, "path", sub_where), join(sub_where, "path"))
                seconds = get_opt_int(f, sub, "expirationSeconds", sub_where)
                if seconds is not None and seconds < 600:
                    f.error(join(sub_where, "expirationSeconds"), f"Invalid value: {seconds}:"
                            " may not specify a duration less than 10 minutes")
            else:
                _parse_object_source(f, present[0], sub, sub_where, projected=True)
    if len(f.errors) > errors:
        return None
    return ApiVolume(kind, dict(body))


def _runtime_class_name(f: Findings, m: Mapping[str, Any], path: str) -> str:
    """``runtimeClassName``: a DNS subdomain (the API server's ``ValidateRuntimeClassName``)."""
    name = get_str(f, m, "runtimeClassName", path)
    if name and (why := names.dns1123_subdomain(name)) is not None:
        f.error(join(path, "runtimeClassName"), why)
        return ""
    return name
