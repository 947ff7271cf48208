"""Trusted rebuild: the validated wire form (``Pod.to_dict()``) -> the same ``Pod``, unchecked.

A pod is parsed and validated once, by its source (``pod_from_dict``); what travels on the bus
after that is its wire form. A consumer of the bus (the sync loop, the prober) rebuilds the
model with ``pod_from_wire``: the exact inverse of ``Pod.to_dict()``, which reads each field
where ``to_dict`` wrote it and checks nothing (no name rules, no policy, no defaults: they
were applied by the source). ``pod_from_wire(p.to_dict()) == p`` for every validated ``p``
(tests/services/pod/test_pod_wire.py), at a fraction of the cost (bench/pod_wire.py).

Something that is not such a wire form (a bug upstream: the map codecs only carry values a
source built) raises ``PodValidationError`` naming ``where`` and the broken part, so callers
that already drop a rejected pod drop it the same way; it never raises anything else.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from podvisor.common.quantity import cpu_millis
from podvisor.services.pod.container import (
    ApiKeyRef,
    Container,
    ContainerPort,
    ContainerRestartPolicy,
    EnvFromSource,
    EnvVar,
    EnvVarSource,
    EphemeralContainer,
    ExecAction,
    GRPCAction,
    HTTPGetAction,
    HTTPHeader,
    Lifecycle,
    LifecycleHandler,
    ObjectFieldSelector,
    PortProtocol,
    Probe,
    ProbeHandler,
    PullPolicy,
    ResizePolicy,
    ResizeRestartPolicy,
    ResourceFieldSelector,
    ResourceList,
    Resources,
    SleepAction,
    TCPSocketAction,
    TerminationMessagePolicy,
    URIScheme,
    VolumeDevice,
    VolumeMount,
)
from podvisor.services.pod.dns import pod_dns_from_wire
from podvisor.services.pod.errors import FieldIssue, PodValidationError
from podvisor.services.pod.model import (
    ApiVolume,
    ClaimVolume,
    CSIVolume,
    DNSPolicy,
    DownwardAPIFile,
    DownwardAPIVolume,
    EmptyDirVolume,
    EphemeralVolume,
    HostPathType,
    HostPathVolume,
    ObjectMeta,
    Origin,
    Pod,
    PodSpec,
    RestartPolicy,
    StorageMedium,
    TaintEffect,
    Toleration,
    TolerationOperator,
    Volume,
    VolumeSource,
)
from podvisor.services.pod.security import (
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
from podvisor.services.pod.volume_plugins import plugin_volume_from_wire

_API_VOLUME_KINDS = ("configMap", "secret", "projected")
_API_REF_KINDS = ("configMapKeyRef", "secretKeyRef")


def pod_from_wire(wire: Any, where: str = "") -> Pod:
    """The ``Pod`` whose ``to_dict()`` is ``wire``, rebuilt without validation (trusted: the
    source validated it). Raises ``PodValidationError`` if ``wire`` is not such a form."""
    try:
        return _pod(wire)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        reason = f"not a validated pod wire form ({type(exc).__name__}: {exc})"
        raise PodValidationError(where, [FieldIssue("", reason)]) from None


class WirePods:
    """The typed ``Pod`` of each pod of a map (by key, e.g. the ``desired`` map's pod UIDs),
    rebuilt with ``pod_from_wire`` only when that pod's wire form changed (a replica replaces a
    value when it changes, so the same dict object is a hit at once; an equal new one after a
    comparison). A reader that looks at every pod whenever any entry moves (ops' process list,
    the status engine's sweep, the API writer's turn) pays one rebuild per change of a pod.

    ``get`` raises ``PodValidationError`` as ``pod_from_wire`` does (not cached). Safe to share
    between threads (ops' XML-RPC and dashboard threads read, its loop retains): a race costs
    a second rebuild, never a wrong pod."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[Mapping[str, Any], Pod]] = {}
        self._lock = threading.Lock()
        self.rebuilds = 0

    def get(self, key: str, wire: Mapping[str, Any]) -> Pod:
        hit = self._pods.get(key)
        if hit is not None and (hit[0] is wire or hit[0] == wire):
            return hit[1]
        pod = pod_from_wire(wire, where=key)
        with self._lock:
            self.rebuilds += 1
            self._pods[key] = (wire, pod)
        return pod

    def retain(self, keys: Collection[str]) -> None:
        """Forget the pods of keys not in ``keys`` (pods that left the map)."""
        with self._lock:
            for key in [k for k in self._pods if k not in keys]:
                del self._pods[key]


def _pod(w: Mapping[str, Any]) -> Pod:
    if w["kind"] != "Pod" or w["apiVersion"] != "v1":
        raise ValueError(f"kind {w['kind']!r} apiVersion {w['apiVersion']!r}")
    origin = w.get("podvisor")
    return Pod(
        metadata=_meta(w["metadata"]),
        spec=_spec(w["spec"]),
        status=dict(w.get("status") or {}),
        origin=None if origin is None else Origin(
            source=origin["source"], location=origin["location"],
            warnings=tuple(origin.get("warnings", ()))),
    )


def _meta(m: Mapping[str, Any]) -> ObjectMeta:
    return ObjectMeta(
        name=m["name"],
        namespace=m.get("namespace", ""),
        uid=m.get("uid", ""),
        labels=dict(m.get("labels", {})),
        annotations=dict(m.get("annotations", {})),
        deletion_timestamp=m.get("deletionTimestamp"),
        deletion_grace_period_seconds=m.get("deletionGracePeriodSeconds"),
    )


def _spec(s: Mapping[str, Any]) -> PodSpec:
    sc = s.get("securityContext")
    return PodSpec(
        containers=tuple(_container(c) for c in s["containers"]),
        init_containers=tuple(_container(c) for c in s.get("initContainers", ())),
        restart_policy=RestartPolicy(s["restartPolicy"]),
        termination_grace_period_seconds=s["terminationGracePeriodSeconds"],
        host_network=s.get("hostNetwork", False),
        host_pid=s.get("hostPID", False),
        host_ipc=s.get("hostIPC", False),
        share_process_namespace=s.get("shareProcessNamespace", False),
        volumes=tuple(_volume(v) for v in s.get("volumes", ())),
        node_name=s.get("nodeName", ""),
        priority=s.get("priority", 0),
        # to_dict writes {} for "no security context" and a non-empty map otherwise
        security_context=_pod_security(sc) if sc else None,
        service_account_name=s.get("serviceAccountName", ""),
        runtime_class_name=s.get("runtimeClassName", ""),
        dns_policy=DNSPolicy(s["dnsPolicy"]),
        scheduler_name=s["schedulerName"],
        enable_service_links=s["enableServiceLinks"],
        tolerations=tuple(_toleration(t) for t in s.get("tolerations", ())),
        dns=pod_dns_from_wire(s),
        ephemeral_containers=tuple(
            EphemeralContainer(_container(c), c.get("targetContainerName", ""))
            for c in s.get("ephemeralContainers", ())),
        image_pull_secrets=tuple(r.get("name", "") for r in s.get("imagePullSecrets", ())),
        active_deadline_seconds=s.get("activeDeadlineSeconds"),
        readiness_gates=tuple(g["conditionType"] for g in s.get("readinessGates", ())),
    )


def _toleration(t: Mapping[str, Any]) -> Toleration:
    return Toleration(key=t.get("key", ""), operator=TolerationOperator(t.get("operator", "")),
                      value=t.get("value", ""), effect=TaintEffect(t.get("effect", "")),
                      toleration_seconds=t.get("tolerationSeconds"))


def _volume(v: Mapping[str, Any]) -> Volume:
    source: VolumeSource
    if (e := v.get("emptyDir")) is not None:
        source = EmptyDirVolume(medium=StorageMedium(e.get("medium", "")),
                                size_limit_bytes=e.get("sizeLimit"))
    elif (h := v.get("hostPath")) is not None:
        source = HostPathVolume(path=h["path"], type=HostPathType(h["type"]))
    elif (d := v.get("downwardAPI")) is not None:
        source = DownwardAPIVolume(
            items=tuple(DownwardAPIFile(path=i["path"], source=_field_source(i),
                                        mode=i.get("mode")) for i in d["items"]),
            default_mode=d["defaultMode"])
    elif (c := v.get("persistentVolumeClaim")) is not None:
        source = ClaimVolume(c["claimName"], c.get("readOnly", False))
    elif (e := v.get("ephemeral")) is not None:
        source = EphemeralVolume(dict(e["volumeClaimTemplate"]))
    elif (c := v.get("csi")) is not None:
        source = CSIVolume(c["driver"], c.get("readOnly", False), c.get("fsType", ""),
                           dict(c.get("volumeAttributes", {})),
                           c["nodePublishSecretRef"]["name"] if "nodePublishSecretRef" in c
                           else "")
    elif (plugin := plugin_volume_from_wire(v)) is not None:
        source = plugin
    else:
        kind = _one_of(v, _API_VOLUME_KINDS)
        source = ApiVolume(kind, dict(v[kind]))
    return Volume(name=v["name"], source=source)


def _one_of(m: Mapping[str, Any], kinds: tuple[str, ...]) -> str:
    for kind in kinds:
        if kind in m:
            return kind
    raise ValueError(f"none of {', '.join(kinds)} in {sorted(m)}")


def _field_source(w: Mapping[str, Any]) -> ObjectFieldSelector | ResourceFieldSelector:
    if (f := w.get("fieldRef")) is not None:
        return ObjectFieldSelector(field_path=f["fieldPath"], api_version=f["apiVersion"])
    r = w["resourceFieldRef"]
    return ResourceFieldSelector(resource=r["resource"],
                                 container_name=r.get("containerName", ""),
                                 divisor=r["divisor"])


def _env_source(w: Mapping[str, Any]) -> EnvVarSource:
    for kind in _API_REF_KINDS:
        if (ref := w.get(kind)) is not None:
            return ApiKeyRef(kind=kind, name=ref["name"], key=ref["key"],
                             optional=ref.get("optional", False))
    return _field_source(w)


def _env(e: Mapping[str, Any]) -> EnvVar:
    if (vf := e.get("valueFrom")) is not None:
        return EnvVar(name=e["name"], value_from=_env_source(vf))
    return EnvVar(name=e["name"], value=e["value"])


def _env_from(e: Mapping[str, Any]) -> EnvFromSource:
    kind = _one_of(e, ("configMapRef", "secretRef"))
    ref = e[kind]
    return EnvFromSource(kind=kind, name=ref["name"], prefix=e.get("prefix", ""),
                         optional=ref.get("optional", False))


def _resource_list(r: Mapping[str, Any]) -> ResourceList:
    cpu = r.get("cpu")
    return ResourceList(
        cpu_millis=None if cpu is None else cpu_millis(cpu),
        memory_bytes=r.get("memory"),
        hugepages=tuple((k.removeprefix("hugepages-"), v) for k, v in r.items()
                        if k.startswith("hugepages-")),
        ephemeral_storage_bytes=r.get("ephemeral-storage"),
    )


def _handler(w: Mapping[str, Any]) -> ProbeHandler | SleepAction:
    if (x := w.get("exec")) is not None:
        return ExecAction(command=tuple(x["command"]))
    if (h := w.get("httpGet")) is not None:
        return HTTPGetAction(
            port=h["port"], path=h["path"], host=h.get("host", ""), scheme=URIScheme(h["scheme"]),
            http_headers=tuple(HTTPHeader(name=x["name"], value=x["value"])
                               for x in h.get("httpHeaders", ())))
    if (t := w.get("tcpSocket")) is not None:
        return TCPSocketAction(port=t["port"], host=t.get("host", ""))
    if (g := w.get("grpc")) is not None:
        return GRPCAction(port=g["port"], service=g.get("service", ""))
    return SleepAction(seconds=w["sleep"]["seconds"])


def _probe(p: Mapping[str, Any] | None) -> Probe | None:
    if p is None:
        return None
    handler = _handler(p)
    if isinstance(handler, SleepAction):
        raise ValueError("a probe cannot sleep")
    return Probe(handler=handler,
                 initial_delay_seconds=p["initialDelaySeconds"],
                 period_seconds=p["periodSeconds"],
                 timeout_seconds=p["timeoutSeconds"],
                 success_threshold=p["successThreshold"],
                 failure_threshold=p["failureThreshold"],
                 termination_grace_period_seconds=p.get("terminationGracePeriodSeconds"))


def _lifecycle_handler(w: Mapping[str, Any] | None) -> LifecycleHandler | None:
    if w is None:
        return None
    handler = _handler(w)
    if isinstance(handler, GRPCAction):
        raise ValueError("a lifecycle handler cannot be grpc")
    return handler


def _lifecycle(w: Mapping[str, Any]) -> Lifecycle:
    return Lifecycle(pre_stop=_lifecycle_handler(w.get("preStop")),
                     post_start=_lifecycle_handler(w.get("postStart")),
                     stop_signal=str(w.get("stopSignal", "")))


def _profile(w: Mapping[str, Any] | None) -> Profile | None:
    if w is None:
        return None
    return Profile(type=ProfileType(w["type"]), localhost_profile=w.get("localhostProfile", ""))


def _selinux(w: Mapping[str, Any] | None) -> SELinuxOptions | None:
    if w is None:
        return None
    return SELinuxOptions(user=w.get("user", ""), role=w.get("role", ""),
                          type=w.get("type", ""), level=w.get("level", ""))


_E = TypeVar("_E", ProcMountType, SupplementalGroupsPolicy, FSGroupChangePolicy,
             SELinuxChangePolicy)


def _enum_opt(cls: type[_E], value: Any) -> _E | None:
    return None if value is None else cls(value)


def _security(w: Mapping[str, Any] | None) -> SecurityContext | None:
    if w is None:
        return None
    caps = w.get("capabilities")
    return SecurityContext(
        run_as_user=w.get("runAsUser"),
        run_as_group=w.get("runAsGroup"),
        run_as_non_root=w.get("runAsNonRoot"),
        capabilities=None if caps is None else Capabilities(
            add=tuple(caps.get("add", ())), drop=tuple(caps.get("drop", ()))),
        privileged=w.get("privileged"),
        allow_privilege_escalation=w.get("allowPrivilegeEscalation"),
        read_only_root_filesystem=w.get("readOnlyRootFilesystem"),
        proc_mount=_enum_opt(ProcMountType, w.get("procMount")),
        seccomp_profile=_profile(w.get("seccompProfile")),
        app_armor_profile=_profile(w.get("appArmorProfile")),
        se_linux_options=_selinux(w.get("seLinuxOptions")),
    )


def _pod_security(w: Mapping[str, Any]) -> PodSecurityContext:
    return PodSecurityContext(
        run_as_user=w.get("runAsUser"),
        run_as_group=w.get("runAsGroup"),
        run_as_non_root=w.get("runAsNonRoot"),
        supplemental_groups=tuple(w.get("supplementalGroups", ())),
        supplemental_groups_policy=_enum_opt(SupplementalGroupsPolicy,
                                             w.get("supplementalGroupsPolicy")),
        fs_group=w.get("fsGroup"),
        fs_group_change_policy=_enum_opt(FSGroupChangePolicy, w.get("fsGroupChangePolicy")),
        se_linux_change_policy=_enum_opt(SELinuxChangePolicy, w.get("seLinuxChangePolicy")),
        sysctls=tuple(Sysctl(name=s["name"], value=s["value"]) for s in w.get("sysctls", ())),
        seccomp_profile=_profile(w.get("seccompProfile")),
        app_armor_profile=_profile(w.get("appArmorProfile")),
        se_linux_options=_selinux(w.get("seLinuxOptions")),
    )


def _container(c: Mapping[str, Any]) -> Container:
    res = c.get("resources", {})
    return Container(
        name=c["name"],
        image=c["image"],
        command=tuple(c.get("command", ())),
        args=tuple(c.get("args", ())),
        env=tuple(_env(e) for e in c.get("env", ())),
        working_dir=c.get("workingDir", ""),
        ports=tuple(ContainerPort(container_port=p["containerPort"],
                                  host_port=p.get("hostPort", 0),
                                  protocol=PortProtocol(p["protocol"]),
                                  name=p.get("name", ""), host_ip=p.get("hostIP", ""))
                      for p in c.get("ports", ())),
        resources=Resources(limits=_resource_list(res.get("limits", {})),
                            requests=_resource_list(res.get("requests", {}))),
        liveness_probe=_probe(c.get("livenessProbe")),
        readiness_probe=_probe(c.get("readinessProbe")),
        startup_probe=_probe(c.get("startupProbe")),
        lifecycle=_lifecycle(c.get("lifecycle", {})),
        image_pull_policy=PullPolicy(c["imagePullPolicy"]),
        volume_mounts=tuple(VolumeMount(name=m["name"], mount_path=m["mountPath"],
                                        read_only=m.get("readOnly", False),
                                        sub_path=m.get("subPath", ""),
                                        sub_path_expr=m.get("subPathExpr", ""),
                                        mount_propagation=m.get("mountPropagation", ""),
                                        recursive_read_only=m.get("recursiveReadOnly", ""))
                            for m in c.get("volumeMounts", ())),
        volume_devices=tuple(VolumeDevice(name=d["name"], device_path=d["devicePath"])
                             for d in c.get("volumeDevices", ())),
        security_context=_security(c.get("securityContext")),
        termination_message_path=c["terminationMessagePath"],
        termination_message_policy=TerminationMessagePolicy(c["terminationMessagePolicy"]),
        stdin=c.get("stdin", False), stdin_once=c.get("stdinOnce", False),
        tty=c.get("tty", False),
        env_from=tuple(_env_from(e) for e in c.get("envFrom", ())),
        restart_policy=(ContainerRestartPolicy(c["restartPolicy"]) if "restartPolicy" in c
                        else None),
        resize_policy=tuple(ResizePolicy(p["resourceName"],
                                         ResizeRestartPolicy(p["restartPolicy"]))
                            for p in c.get("resizePolicy", ())),
    )
