"""The typed model of one container, as far as podvisor supports it (frozen dataclasses).

Every class has ``to_dict()`` giving the defaulted Kubernetes wire form (camelCase keys, empty
optional fields left out), which ``podvisor.services.pod.parse`` reads back to an equal object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from podvisor.common.quantity import format_cpu
from podvisor.services.pod.defaults import TERMINATION_MESSAGE_PATH
from podvisor.services.pod.security import SecurityContext


class PullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class PortProtocol(StrEnum):
    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"


class URIScheme(StrEnum):
    HTTP = "HTTP"
    HTTPS = "HTTPS"


class TerminationMessagePolicy(StrEnum):
    FILE = "File"
    FALLBACK_TO_LOGS_ON_ERROR = "FallbackToLogsOnError"


class ContainerRestartPolicy(StrEnum):
    """An init container's own restart policy: ``Always`` makes it a sidecar (a restartable
    init container); the API allows no other value in 1.33."""

    ALWAYS = "Always"


class ResizeRestartPolicy(StrEnum):
    """What an in-place resize of one resource does to the container (``resizePolicy``)."""

    NOT_REQUIRED = "NotRequired"
    RESTART_CONTAINER = "RestartContainer"


RESIZABLE = ("cpu", "memory")  # the resources a resizePolicy names (and a resize may change)


@dataclass(frozen=True)
class ResizePolicy:
    resource_name: str  # "cpu" or "memory"
    restart_policy: ResizeRestartPolicy = ResizeRestartPolicy.NOT_REQUIRED

    def to_dict(self) -> dict[str, Any]:
        return {"resourceName": self.resource_name, "restartPolicy": str(self.restart_policy)}


@dataclass(frozen=True)
class ExecAction:
    KIND: ClassVar[str] = "exec"
    command: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"command": list(self.command)}


@dataclass(frozen=True)
class HTTPHeader:
    name: str
    value: str


@dataclass(frozen=True)
class HTTPGetAction:
    """``port`` is a number or the name of one of the container's ports."""

    KIND: ClassVar[str] = "httpGet"
    port: int | str
    path: str = "/"
    host: str = ""
    scheme: URIScheme = URIScheme.HTTP
    http_headers: tuple[HTTPHeader, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "port": self.port, "scheme": str(self.scheme)}
        if self.host:
            out["host"] = self.host
        if self.http_headers:
            out["httpHeaders"] = [{"name": h.name, "value": h.value} for h in self.http_headers]
        return out


@dataclass(frozen=True)
class TCPSocketAction:
    KIND: ClassVar[str] = "tcpSocket"
    port: int | str
    host: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"port": self.port}
        if self.host:
            out["host"] = self.host
        return out


@dataclass(frozen=True)
class GRPCAction:
    KIND: ClassVar[str] = "grpc"
    port: int
    service: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"port": self.port}
        if self.service:
            out["service"] = self.service
        return out


@dataclass(frozen=True)
class SleepAction:
    KIND: ClassVar[str] = "sleep"
    seconds: int

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds}


ProbeHandler = ExecAction | HTTPGetAction | TCPSocketAction | GRPCAction
# tcpSocket: the API server takes it in a lifecycle hook; the kubelet's handler runner fails it
# when the hook runs ("Cannot run handler: invalid handler: ...", syncloop/hooks.py)
LifecycleHandler = ExecAction | HTTPGetAction | SleepAction | TCPSocketAction


@dataclass(frozen=True)
class Probe:
    """A probe with the kubelet's defaults (0 s delay, 10 s period, 1 s timeout, 1/3)."""

    handler: ProbeHandler
    initial_delay_seconds: int = 0
    period_seconds: int = 10
    timeout_seconds: int = 1
    success_threshold: int = 1
    failure_threshold: int = 3
    termination_grace_period_seconds: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            self.handler.KIND: self.handler.to_dict(),
            "initialDelaySeconds": self.initial_delay_seconds,
            "periodSeconds": self.period_seconds,
            "timeoutSeconds": self.timeout_seconds,
            "successThreshold": self.success_threshold,
            "failureThreshold": self.failure_threshold,
        }
        if self.termination_grace_period_seconds is not None:
            out["terminationGracePeriodSeconds"] = self.termination_grace_period_seconds
        return out


@dataclass(frozen=True)
class Lifecycle:
    pre_stop: LifecycleHandler | None = None
    post_start: LifecycleHandler | None = None
    stop_signal: str = ""  # the API's name (SIGTERM, SIGRTMIN+1, ...); "" = the runtime's

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.post_start is not None:
            out["postStart"] = {self.post_start.KIND: self.post_start.to_dict()}
        if self.pre_stop is not None:
            out["preStop"] = {self.pre_stop.KIND: self.pre_stop.to_dict()}
        if self.stop_signal:
            out["stopSignal"] = self.stop_signal
        return out


@dataclass(frozen=True)
class ObjectFieldSelector:
    """A downward API ``fieldRef``: ``field_path`` such as ``metadata.name`` or
    ``metadata.labels['app']`` (validated by ``podvisor.services.pod.downward``)."""

    field_path: str
    api_version: str = "v1"

    def to_dict(self) -> dict[str, Any]:
        return {"apiVersion": self.api_version, "fieldPath": self.field_path}


@dataclass(frozen=True)
class ResourceFieldSelector:
    """A downward API ``resourceFieldRef``: ``resource`` such as ``limits.cpu``; ``divisor``
    in its canonical form ("0" = unset, i.e. 1); ``container_name`` "" = this container."""

    resource: str
    container_name: str = ""
    divisor: str = "0"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"resource": self.resource, "divisor": self.divisor}
        if self.container_name:
            out["containerName"] = self.container_name
        return out


@dataclass(frozen=True)
class ApiKeyRef:
    """``configMapKeyRef`` / ``secretKeyRef`` (``kind``): one key of an API object (API pods
    only; read through the API server when the container is created)."""

    kind: str
    name: str
    key: str
    optional: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "key": self.key}
        if self.optional:
            out["optional"] = True
        return out


@dataclass(frozen=True)
class EnvFromSource:
    """``envFrom``: every key of a ConfigMap (``kind`` configMapRef) or Secret (secretRef)."""

    kind: str
    name: str
    prefix: str = ""
    optional: bool = False

    def to_dict(self) -> dict[str, Any]:
        ref: dict[str, Any] = {"name": self.name}
        if self.optional:
            ref["optional"] = True
        out: dict[str, Any] = {self.kind: ref}
        if self.prefix:
            out["prefix"] = self.prefix
        return out


EnvVarSource = ObjectFieldSelector | ResourceFieldSelector | ApiKeyRef


def value_from_dict(source: EnvVarSource) -> dict[str, Any]:
    if isinstance(source, ApiKeyRef):
        return {source.kind: source.to_dict()}
    key = "fieldRef" if isinstance(source, ObjectFieldSelector) else "resourceFieldRef"
    return {key: source.to_dict()}


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str = ""
    value_from: EnvVarSource | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.value_from is None:
            return {"name": self.name, "value": self.value}
        return {"name": self.name, "valueFrom": value_from_dict(self.value_from)}


@dataclass(frozen=True)
class ContainerPort:
    """``host_port`` 0 means none; with hostNetwork it defaults to ``container_port``."""

    container_port: int
    host_port: int = 0
    protocol: PortProtocol = PortProtocol.TCP
    name: str = ""
    host_ip: str = ""  # the address the host port is bound on ("": every address)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"containerPort": self.container_port,
                               "protocol": str(self.protocol)}
        if self.host_port:
            out["hostPort"] = self.host_port
        if self.name:
            out["name"] = self.name
        if self.host_ip:
            out["hostIP"] = self.host_ip
        return out


@dataclass(frozen=True)
class ResourceList:
    """CPU in millicores and memory in bytes; None when not given. ``hugepages``: (page size as
    written, e.g. "2Mi"; bytes) per ``hugepages-<size>`` key, in the manifest's order.
    ``ephemeral_storage_bytes``: ``ephemeral-storage`` (enforced by eviction, not the
    runtime)."""

    cpu_millis: int | None = None
    memory_bytes: int | None = None
    hugepages: tuple[tuple[str, int], ...] = ()
    ephemeral_storage_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.cpu_millis is not None:
            out["cpu"] = format_cpu(self.cpu_millis)
        if self.memory_bytes is not None:
            out["memory"] = self.memory_bytes
        for size, amount in self.hugepages:
            out[f"hugepages-{size}"] = amount
        if self.ephemeral_storage_bytes is not None:
            out["ephemeral-storage"] = self.ephemeral_storage_bytes
        return out


@dataclass(frozen=True)
class Resources:
    """Requests default to the limits, as the API server defaults them."""

    limits: ResourceList = field(default_factory=ResourceList)
    requests: ResourceList = field(default_factory=ResourceList)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if limits := self.limits.to_dict():
            out["limits"] = limits
        if requests := self.requests.to_dict():
            out["requests"] = requests
        return out


@dataclass(frozen=True)
class VolumeMount:
    name: str
    mount_path: str
    read_only: bool = False
    sub_path: str = ""
    sub_path_expr: str = ""  # expanded from the container's environment at start ($(VAR))
    mount_propagation: str = ""  # "", None, HostToContainer, Bidirectional (MOUNT_PROPAGATIONS)
    # "" (unset), Disabled, IfPossible or Enabled (RECURSIVE_READ_ONLY): the kubelet's
    # resolveRecursiveReadOnly at container creation (syncloop/cri_config.py)
    recursive_read_only: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "mountPath": self.mount_path}
        if self.read_only:
            out["readOnly"] = True
        if self.sub_path:
            out["subPath"] = self.sub_path
        if self.sub_path_expr:
            out["subPathExpr"] = self.sub_path_expr
        if self.mount_propagation:
            out["mountPropagation"] = self.mount_propagation
        if self.recursive_read_only:
            out["recursiveReadOnly"] = self.recursive_read_only
        return out


MOUNT_PROPAGATIONS = ("None", "HostToContainer", "Bidirectional")
RECURSIVE_READ_ONLY = ("Disabled", "IfPossible", "Enabled")


@dataclass(frozen=True)
class VolumeDevice:
    """``volumeDevices[]``: a raw block volume (a claim bound to a ``volumeMode: Block`` PV)
    given to the container as the device node ``device_path``."""

    name: str
    device_path: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "devicePath": self.device_path}


@dataclass(frozen=True)
class Container:
    name: str
    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[EnvVar, ...] = ()
    working_dir: str = ""
    ports: tuple[ContainerPort, ...] = ()
    resources: Resources = field(default_factory=Resources)
    liveness_probe: Probe | None = None
    readiness_probe: Probe | None = None
    startup_probe: Probe | None = None
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    image_pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    volume_mounts: tuple[VolumeMount, ...] = ()
    volume_devices: tuple[VolumeDevice, ...] = ()  # raw block volumes (claims only)
    security_context: SecurityContext | None = None
    termination_message_path: str = TERMINATION_MESSAGE_PATH
    termination_message_policy: TerminationMessagePolicy = TerminationMessagePolicy.FILE
    env_from: tuple[EnvFromSource, ...] = ()  # API pods only
    # [issue 24] kubectl run -it / attach -it: a stdin kept open (closed after the first
    # attach with stdin_once) and a terminal (CRI's stdin, stdin_once, tty)
    stdin: bool = False
    stdin_once: bool = False
    tty: bool = False
    # init containers only: Always makes it a sidecar (kept running beside the app)
    restart_policy: ContainerRestartPolicy | None = None
    # in-place resize: per resource, whether a change restarts the container (default
    # NotRequired for a resource not listed, as the API defaults it)
    resize_policy: tuple[ResizePolicy, ...] = ()

    @property
    def sidecar(self) -> bool:
        """A restartable init container (``restartPolicy: Always``)."""
        return self.restart_policy is ContainerRestartPolicy.ALWAYS

    def resize_restart(self, resource: str) -> bool:
        """Does an in-place change of ``resource`` restart this container?"""
        return any(p.resource_name == resource
                   and p.restart_policy is ResizeRestartPolicy.RESTART_CONTAINER
                   for p in self.resize_policy)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "image": self.image,
                               "imagePullPolicy": str(self.image_pull_policy),
                               "terminationMessagePath": self.termination_message_path,
                               "terminationMessagePolicy":
                                   str(self.termination_message_policy)}
        optional: dict[str, Any] = {
            "command": list(self.command),
            "args": list(self.args),
            "env": [e.to_dict() for e in self.env],
            "envFrom": [e.to_dict() for e in self.env_from],
            "workingDir": self.working_dir,
            "ports": [p.to_dict() for p in self.ports],
            "resources": self.resources.to_dict(),
            "livenessProbe": self.liveness_probe and self.liveness_probe.to_dict(),
            "readinessProbe": self.readiness_probe and self.readiness_probe.to_dict(),
            "startupProbe": self.startup_probe and self.startup_probe.to_dict(),
            "lifecycle": self.lifecycle.to_dict(),
            "volumeMounts": [m.to_dict() for m in self.volume_mounts],
            "volumeDevices": [d.to_dict() for d in self.volume_devices],
            "securityContext": self.security_context and self.security_context.to_dict(),
            "stdin": self.stdin,
            "stdinOnce": self.stdin_once,
            "tty": self.tty,
            "restartPolicy": self.restart_policy and str(self.restart_policy),
            "resizePolicy": [p.to_dict() for p in self.resize_policy],
        }
        out.update((key, value) for key, value in optional.items() if value)
        return out


@dataclass(frozen=True)
class EphemeralContainer:
    """``spec.ephemeralContainers[]`` (``kubectl debug``): a container added to a running pod
    through the ``ephemeralcontainers`` subresource; started once, never restarted.
    ``target_container_name``: the container whose process namespace it joins ("" none)."""

    container: Container
    target_container_name: str = ""

    @property
    def name(self) -> str:
        return self.container.name

    def to_dict(self) -> dict[str, Any]:
        out = self.container.to_dict()
        if self.target_container_name:
            out["targetContainerName"] = self.target_container_name
        return out
