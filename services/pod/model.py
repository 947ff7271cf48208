"""The typed Pod model (frozen dataclasses) and its wire form.

``Pod.to_dict()`` is the plain dict published on the bus: the defaulted manifest plus a
top-level ``podvisor`` key holding where the pod came from (``Origin``). Any process rebuilds
the model with ``podvisor.services.pod.pod_from_dict()``; the round trip is exact.

The mappings inside (labels, annotations, status) are plain dicts typed read-only: treat them
as immutable and build changed copies with ``dataclasses.replace``. Models are not hashable.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from podvisor.services.pod import defaults as D
from podvisor.services.pod.container import (
    Container,
    EphemeralContainer,
    ObjectFieldSelector,
    ResourceFieldSelector,
    value_from_dict,
)
from podvisor.services.pod.dns import PodDNS
from podvisor.services.pod.security import PodSecurityContext
from podvisor.services.pod.volume_plugins import PluginVolume

CONFIG_HASH_ANNOTATION = "kubernetes.io/config.hash"
CONFIG_SOURCE_ANNOTATION = "kubernetes.io/config.source"
CONFIG_SEEN_ANNOTATION = "kubernetes.io/config.seen"
CONFIG_MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# The annotations the kubelet owns; changing only these is not an update.
LOCAL_ANNOTATION_PREFIX = "kubernetes.io/config."


class RestartPolicy(StrEnum):
    ALWAYS = "Always"
    ON_FAILURE = "OnFailure"
    NEVER = "Never"


class StorageMedium(StrEnum):
    DEFAULT = ""
    MEMORY = "Memory"


class HostPathType(StrEnum):
    UNSET = ""
    DIRECTORY_OR_CREATE = "DirectoryOrCreate"
    DIRECTORY = "Directory"
    FILE_OR_CREATE = "FileOrCreate"
    FILE = "File"
    SOCKET = "Socket"
    CHAR_DEVICE = "CharDevice"
    BLOCK_DEVICE = "BlockDevice"


@dataclass(frozen=True)
class EmptyDirVolume:
    medium: StorageMedium = StorageMedium.DEFAULT
    size_limit_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.medium:
            out["medium"] = str(self.medium)
        if self.size_limit_bytes is not None:
            out["sizeLimit"] = self.size_limit_bytes
        return {"emptyDir": out}


@dataclass(frozen=True)
class HostPathVolume:
    path: str
    type: HostPathType = HostPathType.UNSET

    def to_dict(self) -> dict[str, Any]:
        return {"hostPath": {"path": self.path, "type": str(self.type)}}


@dataclass(frozen=True)
class DownwardAPIFile:
    """One file of a downwardAPI volume: ``path`` relative to the volume, one source, and the
    file's mode (None: the volume's ``defaultMode``)."""

    path: str
    source: ObjectFieldSelector | ResourceFieldSelector
    mode: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, **value_from_dict(self.source)}
        if self.mode is not None:
            out["mode"] = self.mode
        return out


@dataclass(frozen=True)
class DownwardAPIVolume:
    items: tuple[DownwardAPIFile, ...] = ()
    default_mode: int = D.DOWNWARD_API_DEFAULT_MODE

    def to_dict(self) -> dict[str, Any]:
        return {"downwardAPI": {"items": [i.to_dict() for i in self.items],
                                "defaultMode": self.default_mode}}


@dataclass(frozen=True)
class ApiVolume:
    """A ``configMap``, ``secret`` or ``projected`` volume (``kind``), API pods only: its
    validated source as written (``spec``); the files are made from API objects when the pod's
    sandbox is created and refreshed on every sync (``syncloop/apivolumes.py``)."""

    kind: str
    spec: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {self.kind: copy.deepcopy(dict(self.spec))}


@dataclass(frozen=True)
class ClaimVolume:
    """A ``persistentVolumeClaim`` volume (API pods only): the claim in the pod's namespace,
    mounted by the ``volumes`` process through the PersistentVolume it is bound to."""

    claim_name: str
    read_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"claimName": self.claim_name}
        if self.read_only:
            out["readOnly"] = True
        return {"persistentVolumeClaim": out}


@dataclass(frozen=True)
class EphemeralVolume:
    """A generic ephemeral volume (API pods only): the API server's ephemeral-volume
    controller makes the claim ``<pod>-<volume>`` from ``template`` (the
    ``volumeClaimTemplate`` as written), owned by the pod; it is then mounted as a claim."""

    template: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"ephemeral": {"volumeClaimTemplate": copy.deepcopy(dict(self.template))}}


@dataclass(frozen=True)
class CSIVolume:
    """An inline ``csi`` volume (API pods only; the CSI driver must allow the ``Ephemeral``
    lifecycle mode in its CSIDriver object)."""

    driver: str
    read_only: bool = False
    fs_type: str = ""
    volume_attributes: Mapping[str, str] = field(default_factory=dict)
    node_publish_secret: str = ""  # nodePublishSecretRef.name

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": self.driver}
        if self.read_only:
            out["readOnly"] = True
        if self.fs_type:
            out["fsType"] = self.fs_type
        if self.volume_attributes:
            out["volumeAttributes"] = dict(self.volume_attributes)
        if self.node_publish_secret:
            out["nodePublishSecretRef"] = {"name": self.node_publish_secret}
        return {"csi": out}


# the sources the ``volumes`` process mounts (the others are files the sync loop writes)
MountedSource = ClaimVolume | EphemeralVolume | CSIVolume | PluginVolume
VolumeSource = (EmptyDirVolume | HostPathVolume | DownwardAPIVolume | ApiVolume | ClaimVolume
                | EphemeralVolume | CSIVolume | PluginVolume)


@dataclass(frozen=True)
class Volume:
    name: str
    source: VolumeSource

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.source.to_dict()}

    @property
    def mounted(self) -> bool:
        """Whether the ``volumes`` process mounts it (a claim, an ephemeral or a csi volume, and
        the plugins' nfs, iscsi, fc and flexVolume)."""
        return isinstance(self.source, MountedSource)


@dataclass(frozen=True)
class ObjectMeta:
    name: str
    namespace: str = ""
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        optional: dict[str, Any] = {
            "namespace": self.namespace,
            "uid": self.uid,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "deletionTimestamp": self.deletion_timestamp,
        }
        out.update((key, value) for key, value in optional.items() if value)
        if self.deletion_grace_period_seconds is not None:
            out["deletionGracePeriodSeconds"] = self.deletion_grace_period_seconds
        return out


class DNSPolicy(StrEnum):
    CLUSTER_FIRST = "ClusterFirst"
    CLUSTER_FIRST_WITH_HOST_NET = "ClusterFirstWithHostNet"
    DEFAULT = "Default"
    NONE = "None"


class TolerationOperator(StrEnum):
    UNSET = ""
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    ALL = ""
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


@dataclass(frozen=True)
class Toleration:
    """Kept as data (shown in ``/pods``); podvisor evicts nothing for taints."""

    key: str = ""
    operator: TolerationOperator = TolerationOperator.UNSET
    value: str = ""
    effect: TaintEffect = TaintEffect.ALL
    toleration_seconds: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in (("key", self.key),
                                                 ("operator", str(self.operator)),
                                                 ("value", self.value),
                                                 ("effect", str(self.effect))) if v}
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


@dataclass(frozen=True)
class PodSpec:
    containers: tuple[Container, ...]
    init_containers: tuple[Container, ...] = ()
    restart_policy: RestartPolicy = RestartPolicy.ALWAYS
    termination_grace_period_seconds: int = D.TERMINATION_GRACE_PERIOD_SECONDS
    host_network: bool = False
    host_pid: bool = False                 # the node's PID namespace (CRI pid=NODE)
    host_ipc: bool = False                 # the node's IPC namespace (CRI ipc=NODE)
    share_process_namespace: bool = False  # one PID namespace for the pod (CRI pid=POD)
    volumes: tuple[Volume, ...] = ()
    node_name: str = ""
    priority: int = 0
    security_context: PodSecurityContext | None = None
    service_account_name: str = ""
    dns_policy: DNSPolicy = DNSPolicy.CLUSTER_FIRST
    scheduler_name: str = D.SCHEDULER_NAME
    enable_service_links: bool = D.ENABLE_SERVICE_LINKS
    tolerations: tuple[Toleration, ...] = ()
    # hostname, subdomain, setHostnameAsFQDN, hostAliases, dnsConfig
    dns: PodDNS = field(default_factory=PodDNS)
    # [issue 24] the kubelet's pod lifecycle fields
    ephemeral_containers: tuple[EphemeralContainer, ...] = ()
    image_pull_secrets: tuple[str, ...] = ()   # Secret names ("" entries kept, as the API does)
    active_deadline_seconds: int | None = None
    readiness_gates: tuple[str, ...] = ()      # condition types
    # the RuntimeClass whose handler runs the sandbox ("": the runtime's default handler;
    # looked up in the API only when the agent has one: syncloop/runtimeclass.py)
    runtime_class_name: str = ""

    @property
    def sidecars(self) -> tuple[Container, ...]:
        """The restartable init containers (``restartPolicy: Always``), in order."""
        return tuple(c for c in self.init_containers if c.sidecar)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"containers": [c.to_dict() for c in self.containers]}
        out.update(self.dns.to_dict())
        if self.init_containers:
            out["initContainers"] = [c.to_dict() for c in self.init_containers]
        if self.ephemeral_containers:
            out["ephemeralContainers"] = [c.to_dict() for c in self.ephemeral_containers]
        if self.image_pull_secrets:
            out["imagePullSecrets"] = [{"name": n} if n else {} for n in self.image_pull_secrets]
        if self.active_deadline_seconds is not None:
            out["activeDeadlineSeconds"] = self.active_deadline_seconds
        if self.readiness_gates:
            out["readinessGates"] = [{"conditionType": t} for t in self.readiness_gates]
        out["restartPolicy"] = str(self.restart_policy)
        out["terminationGracePeriodSeconds"] = self.termination_grace_period_seconds
        out["dnsPolicy"] = str(self.dns_policy)
        out["securityContext"] = {}
        out["schedulerName"] = self.scheduler_name
        out["enableServiceLinks"] = self.enable_service_links
        if self.host_network:
            out["hostNetwork"] = True
        if self.host_pid:
            out["hostPID"] = True
        if self.host_ipc:
            out["hostIPC"] = True
        if self.share_process_namespace:
            out["shareProcessNamespace"] = True
        if self.volumes:
            out["volumes"] = [v.to_dict() for v in self.volumes]
        if self.node_name:
            out["nodeName"] = self.node_name
        if self.service_account_name:
            out["serviceAccountName"] = self.service_account_name
        if self.runtime_class_name:
            out["runtimeClassName"] = self.runtime_class_name
        if self.priority:
            out["priority"] = self.priority
        if self.security_context is not None:
            out["securityContext"] = self.security_context.to_dict()
        if self.tolerations:
            out["tolerations"] = [t.to_dict() for t in self.tolerations]
        return out


@dataclass(frozen=True)
class Origin:
    """podvisor's own metadata: which source (``file``/``http``/``api``), which file or URL,
    and the warnings found while reading it (unsupported fields that were ignored)."""

    source: str
    location: str
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "location": self.location,
                "warnings": list(self.warnings)}


@dataclass(frozen=True)
class Pod:
    metadata: ObjectMeta
    spec: PodSpec
    status: Mapping[str, Any] = field(default_factory=dict)
    origin: Origin | None = None

    @property
    def uid(self) -> str:
        return self.metadata.uid

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def full_name(self) -> str:
        """``<name>_<namespace>``, the kubelet's unique pod name on a node."""
        return f"{self.metadata.name}_{self.metadata.namespace}"

    def all_containers(self) -> tuple[Container, ...]:
        """Init containers first, then regular containers."""
        return self.spec.init_containers + self.spec.containers

    def with_annotations(self, updates: Mapping[str, str]) -> Pod:
        """A copy with ``updates`` merged into the annotations."""
        merged = {**self.metadata.annotations, **updates}
        return replace(self, metadata=replace(self.metadata, annotations=merged))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": self.metadata.to_dict(),
            "spec": self.spec.to_dict(),
            "status": copy.deepcopy(dict(self.status)),
        }
        if self.origin is not None:
            out["podvisor"] = self.origin.to_dict()
        return out
