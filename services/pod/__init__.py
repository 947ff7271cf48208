"""podvisor.services.pod: the Pod model every process shares.

- ``decode_pod(bytes, where)`` / ``decode_pod_or_list`` / ``load_document``: manifest bytes in.
- ``pod_from_dict(obj, where) -> ParsedPod(pod, warnings)``: validate + default a decoded
  manifest (a source does this, once per pod).
- ``pod_from_wire(wire, where) -> Pod``: the trusted, unchecked rebuild of a validated pod
  from its wire form ``Pod.to_dict()`` (what bus consumers use; ``pod_from_dict`` reads it
  too, at full validation cost); ``WirePods``: the same, kept per map key and rebuilt only
  when a pod's wire form changed.
- ``PodValidationError(where, errors)``: every rejection, each ``FieldIssue(field, reason)``.
- ``apply_static_defaults``: the kubelet's defaults for file/HTTP pods (UID, name, annotations).
- ``container_hash``: the spec hash that triggers a restart when a container's spec changes.
- ``defaults``: the API server's defaults as data (``DEFAULTS``).
- ``qos_class`` / ``oom_score_adj``: the kubelet's QoS class and OOM score adjustment.
- ``container_env`` / ``expand``: a container's environment with the downward API
  (``NodeFacts`` carries the node's part) and ``$(VAR)`` expansion.
"""

from podvisor.common.timefmt import rfc3339_micro as rfc3339
from podvisor.services.pod.container import (
    Container,
    ContainerPort,
    ContainerRestartPolicy,
    EnvVar,
    EphemeralContainer,
    ExecAction,
    GRPCAction,
    HTTPGetAction,
    HTTPHeader,
    Lifecycle,
    LifecycleHandler,
    PortProtocol,
    Probe,
    ProbeHandler,
    PullPolicy,
    ResourceList,
    Resources,
    SleepAction,
    TCPSocketAction,
    TerminationMessagePolicy,
    URIScheme,
    VolumeMount,
)
from podvisor.services.pod.downward import NodeFacts, projected_downward_files, volume_files
from podvisor.services.pod.envvars import (
    ObjectReader,
    container_env,
    expand,
    expand_command,
    needs_pod_ip,
)
from podvisor.services.pod.errors import FieldIssue, PodValidationError
from podvisor.services.pod.hashing import canonical_json, container_hash
from podvisor.services.pod.imageref import image_reference_error
from podvisor.services.pod.manifest import (
    MAX_MANIFEST_BYTES,
    decode_pod,
    decode_pod_or_list,
    load_document,
)
from podvisor.services.pod.model import (
    CONFIG_HASH_ANNOTATION,
    CONFIG_MIRROR_ANNOTATION,
    CONFIG_SEEN_ANNOTATION,
    CONFIG_SOURCE_ANNOTATION,
    LOCAL_ANNOTATION_PREFIX,
    ApiVolume,
    ClaimVolume,
    CSIVolume,
    DNSPolicy,
    DownwardAPIVolume,
    EmptyDirVolume,
    EphemeralVolume,
    HostPathType,
    HostPathVolume,
    MountedSource,
    ObjectMeta,
    Origin,
    Pod,
    PodSpec,
    RestartPolicy,
    StorageMedium,
    Volume,
)
from podvisor.services.pod.parse import ParsedPod, pod_from_dict
from podvisor.services.pod.qos import QOSClass, oom_score_adj, qos_class
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
    effective_security_context,
    masked_paths,
    no_new_privs,
    readonly_paths,
)
from podvisor.services.pod.static import (
    SOURCE_FILE,
    SOURCE_HTTP,
    apply_static_defaults,
    static_pod_uid,
)
from podvisor.services.pod.volume_plugins import (
    PLUGIN_KINDS,
    FCVolume,
    FlexVolume,
    ISCSIVolume,
    NFSVolume,
    PluginVolume,
    plugin_volume_from_wire,
)
from podvisor.services.pod.wire import WirePods, pod_from_wire

__all__ = [
    "CONFIG_HASH_ANNOTATION",
    "CONFIG_MIRROR_ANNOTATION",
    "CONFIG_SEEN_ANNOTATION",
    "CONFIG_SOURCE_ANNOTATION",
    "LOCAL_ANNOTATION_PREFIX",
    "MAX_MANIFEST_BYTES",
    "PLUGIN_KINDS",
    "SOURCE_FILE",
    "SOURCE_HTTP",
    "ApiVolume",
    "CSIVolume",
    "Capabilities",
    "ClaimVolume",
    "Container",
    "ContainerPort",
    "ContainerRestartPolicy",
    "DNSPolicy",
    "DownwardAPIVolume",
    "EmptyDirVolume",
    "EnvVar",
    "EphemeralContainer",
    "EphemeralVolume",
    "ExecAction",
    "FCVolume",
    "FSGroupChangePolicy",
    "FieldIssue",
    "FlexVolume",
    "GRPCAction",
    "HTTPGetAction",
    "HTTPHeader",
    "HostPathType",
    "HostPathVolume",
    "ISCSIVolume",
    "Lifecycle",
    "LifecycleHandler",
    "MountedSource",
    "NFSVolume",
    "NodeFacts",
    "ObjectMeta",
    "ObjectReader",
    "Origin",
    "ParsedPod",
    "PluginVolume",
    "Pod",
    "PodSecurityContext",
    "PodSpec",
    "PodValidationError",
    "PortProtocol",
    "Probe",
    "ProbeHandler",
    "ProcMountType",
    "Profile",
    "ProfileType",
    "PullPolicy",
    "QOSClass",
    "ResourceList",
    "Resources",
    "RestartPolicy",
    "SELinuxChangePolicy",
    "SELinuxOptions",
    "SecurityContext",
    "SleepAction",
    "StorageMedium",
    "SupplementalGroupsPolicy",
    "Sysctl",
    "TCPSocketAction",
    "TerminationMessagePolicy",
    "URIScheme",
    "Volume",
    "VolumeMount",
    "WirePods",
    "apply_static_defaults",
    "canonical_json",
    "container_env",
    "container_hash",
    "decode_pod",
    "decode_pod_or_list",
    "effective_security_context",
    "expand",
    "expand_command",
    "image_reference_error",
    "load_document",
    "masked_paths",
    "needs_pod_ip",
    "no_new_privs",
    "oom_score_adj",
    "plugin_volume_from_wire",
    "pod_from_dict",
    "pod_from_wire",
    "projected_downward_files",
    "qos_class",
    "readonly_paths",
    "rfc3339",
    "static_pod_uid",
    "volume_files",
]
