"""Readers for the pod spec and its volumes (part of ``parse``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podvisor.common.quantity import QuantityError, memory_bytes
from podvisor.services.pod import names, policy
from podvisor.services.pod.container import Container
from podvisor.services.pod.fields import (
    Findings,
    as_map,
    check_fields,
    get_bool,
    get_enum,
    get_int,
    get_list,
    get_str,
    join,
)
from podvisor.services.pod.model import (
    EmptyDirVolume,
    HostPathType,
    HostPathVolume,
    PodSpec,
    RestartPolicy,
    StorageMedium,
    Volume,
)
from podvisor.services.pod.parse_container import parse_container

_DEFAULT_SERVICE_ACCOUNTS = ("", "default")


def parse_spec(f: Findings, raw: Any, path: str) -> PodSpec | None:
    if raw is None:
        f.error(path, "required")
        return None
    m = as_map(f, raw, path)
    if m is None:
        return None
    check_fields(f, m, path, policy.SPEC_KNOWN, policy.SPEC_UNSUPPORTED)
    for key in ("serviceAccountName", "serviceAccount"):
        account = get_str(f, m, key, path)
        if account not in _DEFAULT_SERVICE_ACCOUNTS:
            f.error(join(path, key),
                    f"static pods may not reference API objects (ServiceAccount {account!r})")
    volumes = _parse_volumes(f, m, path)
    volume_names = {v.name for v in volumes}
    host_network = get_bool(f, m, "hostNetwork", path)
    init = _parse_containers(f, m, path, "initContainers", volume_names, host_network)
    containers = _parse_containers(f, m, path, "containers", volume_names, host_network)
    if not containers and not any(e.field.startswith(join(path, "containers")) for e in f.errors):
        f.error(join(path, "containers"), "required (at least one container)")
    _check_unique_names(f, m, path, init, containers)
    return PodSpec(
        containers=containers,
        init_containers=init,
        restart_policy=get_enum(f, m, "restartPolicy", path, RestartPolicy,
                                RestartPolicy.ALWAYS),
        termination_grace_period_seconds=get_int(f, m, "terminationGracePeriodSeconds", path,
                                                 30, minimum=0),
        host_network=host_network,
        volumes=volumes,
        node_name=get_str(f, m, "nodeName", path),
        priority=get_int(f, m, "priority", path, 0),
    )


def _parse_containers(f: Findings, m: Mapping[str, Any], path: str, key: str,
                      volume_names: set[str], host_network: bool) -> tuple[Container, ...]:
    out: list[Container] = []
    for where, item in get_list(f, m, key, path):
        container = parse_container(f, item, where, volume_names, host_network)
        if container is not None:
            out.append(container)
    return tuple(out)


def _check_unique_names(f: Findings, m: Mapping[str, Any], path: str,
                        init: tuple[Container, ...], containers: tuple[Container, ...]) -> None:
    seen: set[str] = set()
    for key, group in (("initContainers", init), ("containers", containers)):
        for i, container in enumerate(group):
            if container.name and container.name in seen:
                f.error(join(path, f"{key}[{i}].name"),
                        f"duplicate container name {container.name!r}")
            seen.add(container.name)


def _parse_volumes(f: Findings, m: Mapping[str, Any], path: str) -> tuple[Volume, ...]:
    out: list[Volume] = []
    seen: set[str] = set()
    for where, item in get_list(f, m, "volumes", path):
        v = as_map(f, item, where)
        if v is None:
            continue
        check_fields(f, v, where, policy.VOLUME_KNOWN, policy.VOLUME_UNSUPPORTED,
                     reject_unknown=policy.VOLUME_UNKNOWN_REASON)
        name = get_str(f, v, "name", where, required=True)
        if name and (reason := names.dns1123_label(name)):
            f.error(join(where, "name"), reason)
        elif name in seen:
            f.error(join(where, "name"), f"duplicate volume name {name!r}")
        seen.add(name)
        source = _parse_volume_source(f, v, where)
        if source is not None:
            out.append(Volume(name, source))
    return tuple(out)


def _parse_volume_source(f: Findings, v: Mapping[str, Any],
                         where: str) -> EmptyDirVolume | HostPathVolume | None:
    present = [k for k in ("emptyDir", "hostPath") if v.get(k) is not None or k in v]
    if len(present) != 1:
        if not any(e.field.startswith(where) for e in f.errors):
            f.error(where, "must specify exactly one volume source (emptyDir or hostPath)")
        return None
    kind = present[0]
    body = as_map(f, v[kind] if v[kind] is not None else {}, join(where, kind))
    if body is None:
        return None
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
            f.warn(join(where, "emptyDir.sizeLimit"), "not enforced by podvisor; ignored")
    return EmptyDirVolume(medium, size)
