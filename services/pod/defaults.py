"""The API server's defaults for a Pod, as data (``pkg/apis/core/v1/defaults.go``).

The parsers read their default values from the constants here, and ``DEFAULTS`` lists every
defaulted field with the wire-form path where it shows (``[]`` = each item of a list) and the
Go function that sets it; tests/services/pod/test_pod_defaults.py checks each row against the wire
form of a manifest that leaves the field out. Defaults that depend on other fields (imagePullPolicy
from the image's tag, requests from limits, hostPort from containerPort with hostNetwork, an
emptyDir for a volume without a source) are in ``DERIVED`` and tested one by one.

The static pod's UID is the hash of the defaulted pod (as the kubelet's ``applyDefaults`` in
``pkg/kubelet/config/common.go`` hashes the decoded, defaulted object), so adding a default
here changes every static pod's UID once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DNS_POLICY = "ClusterFirst"
RESTART_POLICY = "Always"
TERMINATION_GRACE_PERIOD_SECONDS = 30
SCHEDULER_NAME = "default-scheduler"
ENABLE_SERVICE_LINKS = True
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_POLICY = "File"
PORT_PROTOCOL = "TCP"
PROBE_TIMEOUT_SECONDS = 1
PROBE_PERIOD_SECONDS = 10
PROBE_SUCCESS_THRESHOLD = 1
PROBE_FAILURE_THRESHOLD = 3
PROBE_INITIAL_DELAY_SECONDS = 0  # the Go zero value, kept in the wire form
HTTP_GET_PATH = "/"
HTTP_GET_SCHEME = "HTTP"
FIELD_REF_API_VERSION = "v1"
DOWNWARD_API_DEFAULT_MODE = 0o644
HOST_PATH_TYPE = ""
RESOURCE_FIELD_DIVISOR = "0"  # an unset Quantity prints as "0"

# The toleration every file (static) pod gets from the kubelet's applyDefaults, after its UID
# was computed: such pods are never evicted for NoExecute taints.
STATIC_POD_TOLERATION: dict[str, str] = {"operator": "Exists", "effect": "NoExecute"}


@dataclass(frozen=True)
class Default:
    path: str  # where it shows in Pod.to_dict(); "[]" = every item
    value: Any
    source: str  # the Go function that sets it


_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")

DEFAULTS: tuple[Default, ...] = (
    Default("spec.dnsPolicy", DNS_POLICY, "SetDefaults_PodSpec"),
    Default("spec.restartPolicy", RESTART_POLICY, "SetDefaults_PodSpec"),
    Default("spec.securityContext", {}, "SetDefaults_PodSpec"),
    Default("spec.terminationGracePeriodSeconds", TERMINATION_GRACE_PERIOD_SECONDS,
            "SetDefaults_PodSpec"),
    Default("spec.schedulerName", SCHEDULER_NAME, "SetDefaults_PodSpec"),
    Default("spec.enableServiceLinks", ENABLE_SERVICE_LINKS, "SetDefaults_Pod"),
    *(Default(f"spec.{group}[].{key}", value, "SetDefaults_Container")
      for group in ("containers", "initContainers")
      for key, value in (("terminationMessagePath", TERMINATION_MESSAGE_PATH),
                         ("terminationMessagePolicy", TERMINATION_MESSAGE_POLICY))),
    Default("spec.containers[].ports[].protocol", PORT_PROTOCOL, "SetDefaults_ContainerPort"),
    *(Default(f"spec.containers[].{probe}.{key}", value, "SetDefaults_Probe")
      for probe in _PROBES
      for key, value in (("timeoutSeconds", PROBE_TIMEOUT_SECONDS),
                         ("periodSeconds", PROBE_PERIOD_SECONDS),
                         ("successThreshold", PROBE_SUCCESS_THRESHOLD),
                         ("failureThreshold", PROBE_FAILURE_THRESHOLD))),
    Default("spec.containers[].livenessProbe.httpGet.path", HTTP_GET_PATH,
            "SetDefaults_HTTPGetAction"),
    Default("spec.containers[].livenessProbe.httpGet.scheme", HTTP_GET_SCHEME,
            "SetDefaults_HTTPGetAction"),
    Default("spec.containers[].env[].valueFrom.fieldRef.apiVersion", FIELD_REF_API_VERSION,
            "SetDefaults_ObjectFieldSelector"),
    Default("spec.volumes[].downwardAPI.defaultMode", DOWNWARD_API_DEFAULT_MODE,
            "SetDefaults_DownwardAPIVolumeSource"),
    Default("spec.volumes[].downwardAPI.items[].fieldRef.apiVersion", FIELD_REF_API_VERSION,
            "SetDefaults_ObjectFieldSelector"),
    Default("spec.volumes[].hostPath.type", HOST_PATH_TYPE,
            "SetDefaults_HostPathVolumeSource"),
)

DERIVED: tuple[Default, ...] = (
    Default("spec.containers[].imagePullPolicy", "Always for :latest or no tag, else "
            "IfNotPresent", "SetDefaults_Container"),
    Default("spec.containers[].resources.requests", "each limit without a request",
            "SetDefaults_Pod"),
    Default("spec.containers[].ports[].hostPort", "containerPort with hostNetwork",
            "SetDefaults_Pod (defaultHostNetworkPorts)"),
    Default("spec.volumes[].emptyDir", "{} for a volume without a source", "SetDefaults_Volume"),
    Default("spec.tolerations[]", STATIC_POD_TOLERATION, "kubelet applyDefaults (file pods)"),
)
