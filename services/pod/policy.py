"""What podvisor does with each Pod field it does not support: reject or warn.

docs/ARCHITECTURE.md ("Pods and sources") renders these tables; keep the two in step.
Rule of thumb: a field whose absence would change what the workload sees or can reach
(API objects a static pod names, devices, unknown volume types) rejects the pod, and so does
a security setting podvisor cannot enforce (user namespaces, SELinux relabelling); a field
that only tunes scheduling or terminal handling is ignored with a warning. Security contexts
are supported (parse_security.py); what a runtime cannot enforce, it refuses at create.
"""

from __future__ import annotations

from podvisor.services.pod.fields import Unsupported

_API = "static pods may not reference API objects"


def _reject(reason: str) -> Unsupported:
    return Unsupported(reject=True, reason=reason)


def _warn(reason: str) -> Unsupported:
    return Unsupported(reject=False, reason=reason)


_SERVER_SET = _warn("set by the API server; ignored")
_SCHEDULING = _warn("scheduling field; a static pod is already bound to this node; ignored")
_NOT_ENFORCED = _warn("not enforced by podvisor; ignored")

POD_KNOWN = frozenset({"apiVersion", "kind", "metadata", "spec", "status", "podvisor"})

METADATA_KNOWN = frozenset({"name", "namespace", "uid", "labels", "annotations",
                            "deletionTimestamp", "deletionGracePeriodSeconds"})
METADATA_UNSUPPORTED = {
    "generateName": _warn("not supported for static pods (use name); ignored"),
    "creationTimestamp": _SERVER_SET,
    "resourceVersion": _SERVER_SET,
    "generation": _SERVER_SET,
    "selfLink": _SERVER_SET,
    "managedFields": _SERVER_SET,
    "ownerReferences": _warn("garbage collection is done by the API server; ignored"),
    "finalizers": _warn("finalizers are handled by the API server; ignored"),
}

SPEC_KNOWN = frozenset({"containers", "initContainers", "restartPolicy",
                        "terminationGracePeriodSeconds", "hostNetwork", "volumes", "nodeName",
                        "priority", "serviceAccountName", "serviceAccount", "securityContext",
                        "hostUsers", "dnsPolicy", "schedulerName", "enableServiceLinks",
                        "tolerations", "hostPID", "hostIPC", "shareProcessNamespace",
                        # [issue 24] pod DNS (pod/dns.py; the sync loop's syncloop/dns.py)
                        "dnsConfig", "hostname", "subdomain", "setHostnameAsFQDN",
                        "hostAliases",
                        # [issue 24] the pod lifecycle fields (the sync loop and status)
                        "imagePullSecrets", "ephemeralContainers", "activeDeadlineSeconds",
                        "readinessGates",
                        # [issue 24] the sandbox's runtime handler (syncloop/runtimeclass.py)
                        "runtimeClassName"})
SPEC_UNSUPPORTED = {
    "resourceClaims": _reject(f"{_API} (ResourceClaim)"),
    "affinity": _SCHEDULING,
    "nodeSelector": _SCHEDULING,
    "schedulingGates": _SCHEDULING,
    "priorityClassName": _warn("only the built-in system-node-critical and "
                               "system-cluster-critical set the priority (no priority given; "
                               "graceful node shutdown reads it); other classes ignored"),
    "preemptionPolicy": _SCHEDULING,
    "topologySpreadConstraints": _SCHEDULING,
    "overhead": _NOT_ENFORCED,
    "resources": _reject("pod-level resources (spec.resources) are not supported; set "
                         "resources on each container (they are enforced)"),
    "automountServiceAccountToken": _warn("no service account token is mounted; ignored"),
    "os": _warn("the pod runs on this node's OS; ignored (os.name other than linux: refused, "
                "as the kubelet's admission does)"),
}

CONTAINER_KNOWN = frozenset({"name", "image", "command", "args", "env", "workingDir", "ports",
                             "resources", "livenessProbe", "readinessProbe", "startupProbe",
                             "lifecycle", "imagePullPolicy", "volumeMounts", "securityContext",
                             "terminationMessagePath", "terminationMessagePolicy",
                             "stdin", "stdinOnce", "tty",  # [issue 24]
                             # [issue 24] in-place resize (syncloop/resize.py)
                             "resizePolicy",
                             "volumeDevices"})  # raw block volumes (the volumes process)
# an init container's restartPolicy (sidecars); regular and ephemeral containers may not set it
CONTAINER_RESTART_POLICY = "restartPolicy"
# what the API server forbids on an ephemeral container ("cannot be set for an Ephemeral
# Container"), and the one field it adds
EPHEMERAL_FORBIDDEN = ("ports", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle",
                       "resources", "resizePolicy", "restartPolicy")
EPHEMERAL_TARGET = "targetContainerName"
CONTAINER_UNSUPPORTED = {
    "envFrom": _reject(f"{_API} (ConfigMap/Secret via envFrom)"),
}

_WINDOWS = _warn("Windows-only; ignored on a Linux node (as the kubelet does)")
POD_SECURITY_KNOWN = frozenset({"runAsUser", "runAsGroup", "runAsNonRoot", "supplementalGroups",
                                "supplementalGroupsPolicy", "fsGroup", "fsGroupChangePolicy",
                                "sysctls", "seccompProfile", "appArmorProfile",
                                "seLinuxOptions",
                                # [issue 24] SELinuxChangePolicy is on by default in 1.33: kept
                                # and validated; no volume is relabelled (docs: the field table)
                                "seLinuxChangePolicy"})
POD_SECURITY_UNSUPPORTED = {"windowsOptions": _WINDOWS}
SECURITY_KNOWN = frozenset({"runAsUser", "runAsGroup", "runAsNonRoot", "capabilities",
                            "privileged", "allowPrivilegeEscalation", "readOnlyRootFilesystem",
                            "procMount", "seccompProfile", "appArmorProfile", "seLinuxOptions"})
SECURITY_UNSUPPORTED = {"windowsOptions": _WINDOWS}

LIFECYCLE_KNOWN = frozenset({"preStop", "postStart", "stopSignal"})
LIFECYCLE_UNSUPPORTED: dict[str, Unsupported] = {}

PROBE_KNOWN = frozenset({"exec", "httpGet", "tcpSocket", "grpc", "initialDelaySeconds",
                         "periodSeconds", "timeoutSeconds", "successThreshold",
                         "failureThreshold", "terminationGracePeriodSeconds"})
# [issue 24] tcpSocket: the API server takes it; the kubelet's handler runner fails the hook when
# it runs ("Cannot run handler: invalid handler: ..."): FailedPostStartHook and the container
# killed, or FailedPreStopHook and the stop goes on (syncloop/hooks.py)
PRE_STOP_KNOWN = frozenset({"exec", "httpGet", "sleep", "tcpSocket"})
PRE_STOP_UNSUPPORTED: dict[str, Unsupported] = {}
POST_START_UNSUPPORTED: dict[str, Unsupported] = {}

PORT_KNOWN = frozenset({"containerPort", "hostPort", "protocol", "name", "hostIP"})
PORT_UNSUPPORTED: dict[str, Unsupported] = {}

MOUNT_KNOWN = frozenset({"name", "mountPath", "readOnly", "subPath",
                         "subPathExpr", "mountPropagation",  # [issue 24]
                         "recursiveReadOnly"})  # [issue 24] resolved at creation (cri_config)
MOUNT_UNSUPPORTED: dict[str, Unsupported] = {}

ENV_KNOWN = frozenset({"name", "value", "valueFrom"})
VALUE_FROM_KNOWN = ("fieldRef", "resourceFieldRef")
_NO_API_YET = "(only pods from the API server may); use value or fieldRef"
VALUE_FROM_UNSUPPORTED = {
    "configMapKeyRef": _reject(f"{_API} (ConfigMap) {_NO_API_YET}"),
    "secretKeyRef": _reject(f"{_API} (Secret) {_NO_API_YET}"),
}

RESOURCES_KNOWN = frozenset({"limits", "requests"})
RESOURCES_UNSUPPORTED = {"claims": _reject(f"{_API} (ResourceClaim)")}
EPHEMERAL_STORAGE = "ephemeral-storage"  # enforced by eviction (services/eviction), as the kubelet
HUGEPAGES_PREFIX = "hugepages-"  # passed to the runtime (CRI hugepage_limits): enforced or refused

# [issue 24] the kubelet's volume plugins for network and driver volumes, mounted by the
# ``volumes`` process (static pods too: they name no API object, but for a secretRef)
PLUGIN_VOLUME_KINDS = ("nfs", "iscsi", "fc", "flexVolume")
VOLUME_KNOWN = frozenset({"name", "emptyDir", "hostPath", "downwardAPI", *PLUGIN_VOLUME_KINDS})
VOLUME_UNSUPPORTED = {
    "secret": _reject(f"{_API} (Secret volume)"),
    "configMap": _reject(f"{_API} (ConfigMap volume)"),
    "persistentVolumeClaim": _reject(f"{_API} (PersistentVolumeClaim volume: as with the "
                                     "kubelet, the API server refuses the mirror pod of a "
                                     "static pod that references a claim)"),
    "projected": _reject(f"{_API} (projected volume)"),
    "ephemeral": _reject(f"{_API} (ephemeral volume: its claim is made by the API server's "
                         "ephemeral-volume controller, for API pods only)"),
    "csi": _reject(f"{_API} (inline csi volume: it needs its driver's CSIDriver object)"),
}
VOLUME_UNKNOWN_REASON = ("unsupported volume type (podvisor supports emptyDir, hostPath, "
                         "downwardAPI, nfs, iscsi, fc and flexVolume; API pods also configMap, "
                         "secret, projected, persistentVolumeClaim, ephemeral and csi)")
# [issue 15] API pods: the API-backed volume sources and env sources
API_VOLUME_KINDS = ("configMap", "secret", "projected")
# [issue 25] API pods: the volumes the ``volumes`` process mounts
MOUNTED_VOLUME_KINDS = ("persistentVolumeClaim", "ephemeral", "csi")
CLAIM_KNOWN = frozenset({"claimName", "readOnly"})
EPHEMERAL_KNOWN = frozenset({"volumeClaimTemplate"})
CLAIM_TEMPLATE_KNOWN = frozenset({"metadata", "spec"})
CSI_VOLUME_KNOWN = frozenset({"driver", "readOnly", "fsType", "volumeAttributes",
                              "nodePublishSecretRef"})
NFS_KNOWN = frozenset({"server", "path", "readOnly"})
ISCSI_KNOWN = frozenset({"targetPortal", "iqn", "lun", "iscsiInterface", "fsType", "readOnly",
                         "portals", "chapAuthDiscovery", "chapAuthSession", "initiatorName"})
FC_KNOWN = frozenset({"targetWWNs", "lun", "wwids", "fsType", "readOnly"})
FLEX_VOLUME_KNOWN = frozenset({"driver", "fsType", "readOnly", "options"})
# a Secret named by an iscsi or flexVolume volume: API pods only (the API server refuses a
# mirror pod that references a Secret)
SECRET_REF = "secretRef"
PLUGIN_SECRET_UNSUPPORTED = {SECRET_REF: _reject(f"{_API} (Secret via secretRef)")}
API_VALUE_FROM = ("configMapKeyRef", "secretKeyRef")
CONFIG_MAP_VOLUME_KNOWN = frozenset({"name", "items", "defaultMode", "optional"})
SECRET_VOLUME_KNOWN = frozenset({"secretName", "items", "defaultMode", "optional"})
PROJECTED_KNOWN = frozenset({"sources", "defaultMode"})
PROJECTION_KINDS = ("configMap", "secret", "downwardAPI", "serviceAccountToken")
KEY_TO_PATH_KNOWN = frozenset({"key", "path", "mode"})
SA_TOKEN_KNOWN = frozenset({"audience", "expirationSeconds", "path"})
DOWNWARD_API_KNOWN = frozenset({"items", "defaultMode"})
DOWNWARD_API_ITEM_KNOWN = frozenset({"path", "fieldRef", "resourceFieldRef", "mode"})
TOLERATION_KNOWN = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})

HANDLER_KNOWN = {
    "exec": frozenset({"command"}),
    "httpGet": frozenset({"path", "port", "host", "scheme", "httpHeaders"}),
    "tcpSocket": frozenset({"port", "host"}),
    "grpc": frozenset({"port", "service"}),
    "sleep": frozenset({"seconds"}),
}
EMPTY_DIR_KNOWN = frozenset({"medium", "sizeLimit"})
HOST_PATH_KNOWN = frozenset({"path", "type"})
