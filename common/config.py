"""The agent's configuration: one YAML file with KubeletConfiguration key names, plus flags.

`Config` is a frozen dataclass; attribute names are the snake_case of the YAML keys. The schema
is data (`TOP_KEYS`, `SUPERVISION_KEYS`, `SPEC_KEYS`): adding a key is one line in a table plus
one dataclass field. `config_from_mapping()` is the single parser, used for the YAML file (merged
with flags) and for `run/config.json` which children read back; `config_to_mapping()` is its
inverse. Unknown keys and bad values raise `ConfigError` naming the dotted key.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from podvisor.common.nodekeys import (
    DEFAULT_EVICTION_HARD,
    parse_eviction_grace,
    parse_eviction_hard,
    parse_ip_list,
    parse_node_ips,
    parse_node_labels,
    parse_reserved,
    parse_taints,
)
from podvisor.common.shutdownkeys import ShutdownGroup, parse_by_pod_priority, shutdown_groups
from podvisor.common.values import (
    ConfigError,
    format_duration,
    parse_bool,
    parse_duration,
    parse_endpoint,
    parse_float,
    parse_headers,
    parse_int,
    parse_quantity,
    parse_str,
)

__all__ = [
    "SPEC_KEYS",
    "SUPERVISION_KEYS",
    "TOP_KEYS",
    "Config",
    "ConfigError",
    "Key",
    "Kind",
    "SupervisionConfig",
    "cert_dir",
    "config_from_mapping",
    "config_to_mapping",
    "keys_not_yet_used",
    "load_config",
    "node_shutdown_groups",
    "read_config_json",
    "run_config",
    "runtime_endpoint_of",
    "write_config_json",
]


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Kind:
    """How one kind of value is parsed from YAML/flags and written back to JSON."""

    parse: Callable[[str, object], Any]
    dump: Callable[[Any], Any] = _same
    metavar: str = "VALUE"


STR = Kind(parse_str, metavar="STRING")
BOOL = Kind(parse_bool, metavar="BOOL")
DURATION = Kind(parse_duration, format_duration, "DURATION")
QUANTITY = Kind(parse_quantity, metavar="SIZE")
ENDPOINT = Kind(parse_endpoint, metavar="ENDPOINT")
HEADERS = Kind(parse_headers, metavar="NAME:VALUE")
INT = Kind(lambda k, v: parse_int(k, v, minimum=0), metavar="INT")
PORT = Kind(lambda k, v: parse_int(k, v, minimum=0, maximum=65535), metavar="PORT")
PERCENT = Kind(lambda k, v: parse_int(k, v, minimum=0, maximum=100), metavar="PERCENT")
COUNT = Kind(lambda k, v: parse_int(k, v, minimum=1), metavar="INT")
LIMIT = Kind(lambda k, v: parse_int(k, v, minimum=-1), metavar="INT")  # -1 = unlimited
FACTOR = Kind(parse_float, metavar="NUMBER")
LEVEL = Kind(
    lambda k, v: _parse_choice(k, v, ("debug", "info", "warning", "error")), metavar="LEVEL"
)
CGROUP = Kind(lambda k, v: _parse_cgroup_path(k, v), metavar="PATH")
# [issue 26] the Node's settings: maps and lists in the file, the kubelet flag's form in a flag
NODE_IPS = Kind(parse_node_ips, metavar="IP[,IP]")
LABELS = Kind(parse_node_labels, dict, metavar="KEY=VALUE,...")
TAINTS = Kind(parse_taints, list, metavar="KEY[=VALUE]:EFFECT,...")
RESERVED = Kind(parse_reserved, dict, metavar="RESOURCE=QUANTITY,...")
EVICTION = Kind(parse_eviction_hard, dict, metavar="SIGNAL<QUANTITY,...")
RECLAIM = Kind(parse_eviction_hard, dict, metavar="SIGNAL=QUANTITY,...")
GRACES = Kind(parse_eviction_grace, dict, metavar="SIGNAL=DURATION,...")
CLUSTER_DNS = Kind(parse_ip_list, list, metavar="IP,...")  # [issue 24]


def _parse_choice(key: str, raw: object, choices: tuple[str, ...]) -> str:
    text = parse_str(key, raw).strip().lower()
    if text not in choices:
        raise ConfigError(key, f"expected one of {', '.join(choices)}, got {raw!r}")
    return text


def _parse_exact(key: str, raw: object, choices: tuple[str, ...]) -> str:
    """One of ``choices``, spelled exactly (the kubelet's enum values)."""
    text = parse_str(key, raw).strip()
    if text not in choices:
        raise ConfigError(key, f"expected one of {', '.join(choices)}, got {raw!r}")
    return text


def _parse_cgroup_path(key: str, raw: object) -> str:
    """'' (disabled) or an absolute cgroup path like /podvisor (no '..', no systemd slice)."""
    text = parse_str(key, raw).strip()
    if not text:
        return ""
    parts = [p for p in text.split("/") if p]
    if not text.startswith("/") or ".." in parts or "." in parts or ":" in text:
        raise ConfigError(key, f"expected '' or an absolute cgroup path like /podvisor, "
                               f"got {raw!r}")
    return "/" + "/".join(parts)


@dataclass(frozen=True)
class Key:
    """One config key: its YAML name, the dataclass attribute, its kind and help text."""

    name: str
    attr: str
    kind: Kind
    help: str


TOP_KEYS: tuple[Key, ...] = (
    Key("nodeName", "node_name", STR, "node name (default: the host name)"),
    Key("rootDir", "root_dir", STR, "all state, sockets and logs live under it"),
    Key("staticPodPath", "static_pod_path", STR, "directory (or file) of static pod manifests"),
    Key("staticPodURL", "static_pod_url", STR, "URL serving a Pod or PodList"),
    Key("staticPodURLHeader", "static_pod_url_header", HEADERS, "headers for staticPodURL"),
    Key("fileCheckFrequency", "file_check_frequency", DURATION, "static pod path relist period"),
    Key("httpCheckFrequency", "http_check_frequency", DURATION, "static pod URL poll period"),
    Key("syncFrequency", "sync_frequency", DURATION, "full pod resync period"),
    Key("runtimeEndpoint", "runtime_endpoint", ENDPOINT, "'embedded' or unix:///path"),
    Key("criProxy", "cri_proxy", BOOL,
        "a remote runtimeEndpoint reached through a proxy on rootDir/run/cri.sock (the "
        "runtime process), where cri faults apply"),
    Key("runtimeRequestTimeout", "runtime_request_timeout", DURATION, "CRI call timeout"),
    Key("address", "address", STR, "HTTP server bind address"),
    Key("port", "port", PORT, "HTTP server port"),
    Key("readOnlyPort", "read_only_port", PORT, "read-only HTTP port (0 disables)"),
    Key("tlsCertFile", "tls_cert_file", STR,
        "main port certificate (PEM; '' = a self-signed pair under rootDir/pki)"),
    Key("tlsPrivateKeyFile", "tls_private_key_file", STR, "main port private key (PEM)"),
    Key("imageGCHighThresholdPercent", "image_gc_high_threshold_percent", PERCENT, "GC above"),
    Key("imageGCLowThresholdPercent", "image_gc_low_threshold_percent", PERCENT, "GC down to"),
    Key("imageMinimumGCAge", "image_minimum_gc_age", DURATION, "minimum age of a GCed image"),
    Key("containerLogMaxSize", "container_log_max_size", QUANTITY, "rotate container logs at"),
    Key("containerLogMaxFiles", "container_log_max_files", COUNT, "container log files kept"),
    Key("serializeImagePulls", "serialize_image_pulls", BOOL, "pull one image at a time"),
    Key("maxParallelImagePulls", "max_parallel_image_pulls", INT,
        "with serializeImagePulls false: pulls at once (0 = no limit)"),
    Key("kubeconfig", "kubeconfig", STR, "kubeconfig of the API server ('' = standalone)"),
    Key("stopPodsOnExit", "stop_pods_on_exit", BOOL, "stop every pod when the agent stops"),
    # [issue 27] graceful node shutdown (process `nodeshutdown`; common/shutdownkeys.py)
    Key("shutdownGracePeriod", "shutdown_grace_period", DURATION,
        "graceful node shutdown: the time pods get in all (0 = off)"),
    Key("shutdownGracePeriodCriticalPods", "shutdown_grace_period_critical_pods", DURATION,
        "of shutdownGracePeriod, the time kept for critical pods (priority >= 2000000000)"),
    Key("shutdownGracePeriodByPodPriority", "shutdown_grace_period_by_pod_priority",
        Kind(parse_by_pod_priority, list, "LIST"),
        "[{priority, shutdownGracePeriodSeconds}] (replaces the two above)"),
    Key("shutdownOnSignal", "shutdown_on_signal", BOOL,
        "SIGTERM/SIGINT of the agent is a graceful node shutdown (where logind does not run)"),
    Key("networkPlugin", "network_plugin",
        Kind(lambda k, v: _parse_choice(k, v, ("cni", "host")), metavar="PLUGIN"),
        "the embedded runtime's pod network: 'cni' (a network namespace per pod, set up by "
        "the CNI plugins of cniConfDir) or 'host' (pods share the node's network)"),
    Key("cniConfDir", "cni_conf_dir", STR,
        "CNI network config directory ('' = rootDir/cni/net.d; podvisor writes a bridge "
        "conflist there when it holds none)"),
    Key("cniBinDir", "cni_bin_dir", STR, "where the CNI plugins are (':'-separated)"),
    Key("cgroupRoot", "cgroup_root", CGROUP,
        "pods' cgroups go under <cgroupRoot>/pod<uid> ('' = the runtime's default place)"),
    Key("podPidsLimit", "pod_pids_limit", LIMIT,
        "pids.max of each Guaranteed/Burstable pod's cgroup (-1 = unlimited, as the kubelet)"),
    Key("runOnce", "run_once", BOOL,
        "run the sources' first sets once, print each pod's result and exit"),
    Key("runOnceMaxRetries", "run_once_max_retries", COUNT,
        "RunOnce: SyncPods per pod at most before it counts as failed"),
    Key("runOnceRetryDelay", "run_once_retry_delay", DURATION,
        "RunOnce: the wait after a pod's first SyncPod (doubles after each)"),
    # [issue 15] API server membership (used when kubeconfig is set)
    Key("nodeStatusUpdateFrequency", "node_status_update_frequency", DURATION,
        "how often the Node status is computed (PATCHed when it changed)"),
    Key("nodeStatusReportFrequency", "node_status_report_frequency", DURATION,
        "an unchanged Node status is PATCHed this often"),
    Key("nodeLeaseDurationSeconds", "node_lease_duration_seconds", COUNT,
        "the node Lease's leaseDurationSeconds"),
    Key("nodeLeaseRenewInterval", "node_lease_renew_interval", DURATION,
        "the node Lease is renewed this often"),
    Key("maxPods", "max_pods", COUNT, "the Node's pods capacity (admission: OutOfpods)"),
    Key("registerNode", "register_node", BOOL, "register the Node with the API server"),
    Key("apiWatchTimeout", "api_watch_timeout", DURATION,
        "each watch request lasts rand[t, 2t) before it is renewed"),
    Key("apiRetryMaxDelay", "api_retry_max_delay", DURATION,
        "cap of the back-off between failed API requests (0.8 s doubling)"),
    Key("statusSweepFrequency", "status_sweep_frequency", DURATION,
        "every API pod's status is compared with the API's and written this often"),
    Key("configMapAndSecretChangeDetectionStrategy",
        "config_map_and_secret_change_detection_strategy", Kind(
            lambda k, v: _parse_exact(k, v, ("Watch", "Cache", "Get")), metavar="STRATEGY"),
        "how pods' ConfigMaps/Secrets are read: Watch (a watch per object), Cache "
        "(apiObjectCacheTTL) or Get"),
    Key("apiObjectCacheTTL", "api_object_cache_ttl", DURATION,
        "with the Cache strategy: ConfigMaps and Secrets read for pods are cached this long"),
    # [issue 25] the volume manager (process `volumes`)
    Key("volumeStatsAggPeriod", "volume_stats_agg_period", DURATION,
        "how often the mounted volumes' usage is read (/stats/summary's volume entries)"),
    Key("volumePluginDir", "volume_plugin_dir", STR,  # [issue 24] FlexVolume drivers
        "the FlexVolume drivers' folder: <vendor~driver>/<driver> executables, probed by the "
        "volumes process"),
    # [issue 26] TLS bootstrap and certificate rotation (process `certificates`)
    Key("bootstrapKubeconfig", "bootstrap_kubeconfig", STR,
        "kubeconfig with a bootstrap token: when `kubeconfig` is missing or its certificate "
        "expired, a client certificate is requested with it and `kubeconfig` written"),
    Key("certDir", "cert_dir", STR,
        "where the certificates TLS bootstrap and rotation get are kept ('' = rootDir/pki)"),
    Key("rotateCertificates", "rotate_certificates", BOOL,
        "request a new client certificate before the current one expires"),
    Key("serverTLSBootstrap", "server_tls_bootstrap", BOOL,
        "the main port's serving certificate comes from the API server (signer "
        "kubernetes.io/kubelet-serving), rotated the same way"),
    # [issue 26] the Node's settings
    Key("nodeIP", "node_ip", NODE_IPS,
        "the node's InternalIP (one, or one per family), reported in the Node and served"),
    Key("nodeLabels", "node_labels", LABELS, "labels the Node is registered with"),
    Key("registerWithTaints", "register_with_taints", TAINTS,
        "taints the Node is registered with"),
    Key("providerID", "provider_id", STR, "the Node's spec.providerID ('' = none)"),
    Key("kubeReserved", "kube_reserved", RESERVED,
        "resources held back for Kubernetes' daemons (less allocatable)"),
    Key("systemReserved", "system_reserved", RESERVED,
        "resources held back for the system's daemons (less allocatable)"),
    Key("evictionHard", "eviction_hard", EVICTION,
        "hard eviction thresholds; memory.available and nodefs.available are held back from "
        "allocatable (a map given replaces the defaults whole)"),
    # [issue 27] node-pressure eviction (process `eviction`)
    Key("evictionSoft", "eviction_soft", EVICTION,
        "soft eviction thresholds: acted on once met for their evictionSoftGracePeriod"),
    Key("evictionSoftGracePeriod", "eviction_soft_grace_period", GRACES,
        "how long each soft threshold must be met before a pod is evicted for it"),
    Key("evictionMaxPodGracePeriod", "eviction_max_pod_grace_period", INT,
        "soft eviction: a pod's grace period at most this (seconds; 0 = the pod's own)"),
    Key("evictionMinimumReclaim", "eviction_minimum_reclaim", RECLAIM,
        "a threshold once met stays met until its signal is this much above it"),
    Key("evictionPressureTransitionPeriod", "eviction_pressure_transition_period", DURATION,
        "a pressure condition stays True this long after its threshold was last met"),
    Key("evictionMonitoringPeriod", "eviction_monitoring_period", DURATION,
        "how often the eviction manager reads the signals (the kubelet's 10 s)"),
    # [issue 24] pod DNS (services/syncloop/dns.py)
    Key("clusterDNS", "cluster_dns", CLUSTER_DNS,
        "IPs of the cluster's DNS service: the nameservers of ClusterFirst pods"),
    Key("clusterDomain", "cluster_domain", STR,
        "the cluster's DNS domain (pods' search paths and subdomain FQDNs)"),
    Key("resolvConf", "resolv_conf", STR,
        "the resolver configuration pods' DNS is based on ('' = none: the node's resolver)"),
    # [ops port, issue 14] the dashboard and supervisord's XML-RPC (process `ops`)
    Key("opsAddress", "ops_address", STR, "ops port bind address (dashboard, XML-RPC)"),
    Key("opsPort", "ops_port", PORT, "ops port: dashboard at / and XML-RPC at /RPC2 (0 disables)"),
    Key("opsUsername", "ops_username", STR, "HTTP Basic user name of the ops port"),
    Key("opsPasswordFile", "ops_password_file", STR,
        "file holding the ops password ('' = rootDir/ops-password, written once at random)"),
    Key("opsTLSCertFile", "ops_tls_cert_file", STR, "serve the ops port over TLS with this cert"),
    Key("opsTLSPrivateKeyFile", "ops_tls_private_key_file", STR, "the TLS cert's private key"),
)

SUPERVISION_KEYS: tuple[Key, ...] = (
    Key("heartbeatInterval", "heartbeat_interval", DURATION, "how often children heartbeat"),
    Key("shutdownTimeout", "shutdown_timeout", DURATION, "bound on stopping all children"),
    Key("stopPodsTimeout", "stop_pods_timeout", DURATION,
        "bound on waiting for the sync loop to stop every pod before shutdown"),
    Key("builtins", "builtins", BOOL, "run the built-in subsystems"),
    Key("logLevel", "log_level", LEVEL, "debug, info, warning or error"),
    Key("logMaxSize", "log_max_size", QUANTITY, "rotate logs/<process>.log at this size"),
    Key("logMaxFiles", "log_max_files", COUNT, "rotated log files kept per process"),
    Key("spawnMethod", "spawn_method", Kind(
        lambda k, v: _parse_choice(k, v, ("forkserver", "exec")), metavar="METHOD"),
        "forkserver (fast restarts) or exec (a fresh interpreter per start)"),
)

# [syncloop engineer] The `syncloop` section: crash back-off (configurable cap, KEP-4603).
SYNCLOOP_KEYS: tuple[Key, ...] = (
    Key("crashLoopBackOffInitial", "crash_loop_backoff_initial", DURATION,
        "first crash back-off delay (doubles per restart)"),
    Key("crashLoopBackOffMax", "crash_loop_backoff_max", DURATION, "crash back-off cap"),
    Key("crashLoopBackOffReset", "crash_loop_backoff_reset", DURATION,
        "a container not restarted this long starts its back-off over"),
)


# [main port, issue 13] `authentication` and `authorization`, nested as KubeletConfiguration
# spells them: authentication.{anonymous.enabled, x509.clientCAFile, webhook.enabled,
# webhook.cacheTTL, tokenFile}, authorization.{mode, webhook.cacheAuthorizedTTL,
# webhook.cacheUnauthorizedTTL}. The webhook modes (TokenReview, SubjectAccessReview; issue 15)
# need the API server: enabling one without `kubeconfig` is rejected at load with the reason.
AUTHN_KEYS: tuple[Key, ...] = (
    Key("tokenFile", "token_file", STR,
        "static bearer tokens, kube-apiserver's CSV: token,user,uid,\"group1,group2\""),
)
AUTHN_SUB_KEYS: dict[str, tuple[Key, ...]] = {
    "anonymous": (Key("enabled", "anonymous_enabled", BOOL,
                      "requests without credentials are user system:anonymous"),),
    "x509": (Key("clientCAFile", "client_ca_file", STR,
                 "CA bundle (PEM) that signs accepted client certificates"),),
    "webhook": (Key("enabled", "webhook_enabled", BOOL,
                    "bearer tokens reviewed by the API server (TokenReview; needs kubeconfig)"),
                Key("cacheTTL", "webhook_cache_ttl", DURATION, "TokenReview answers cached")),
}
AUTHZ_KEYS: tuple[Key, ...] = (
    Key("mode", "mode", Kind(lambda k, v: _parse_authz_mode(k, v), metavar="MODE"),
        "AlwaysAllow, or Webhook (SubjectAccessReview at the API server; needs kubeconfig)"),
)
AUTHZ_SUB_KEYS: dict[str, tuple[Key, ...]] = {
    "webhook": (Key("cacheAuthorizedTTL", "webhook_cache_authorized_ttl", DURATION,
                    "allowed SubjectAccessReview answers cached"),
                Key("cacheUnauthorizedTTL", "webhook_cache_unauthorized_ttl", DURATION,
                    "denied SubjectAccessReview answers cached")),
}
WEBHOOK_NEEDS_API = ("needs the API server: set kubeconfig (or use tokenFile or "
                     "x509.clientCAFile with authorization.mode AlwaysAllow)")


def _parse_authz_mode(key: str, raw: object) -> str:
    text = parse_str(key, raw).strip()
    if text not in ("AlwaysAllow", "Webhook"):
        raise ConfigError(key, f"expected AlwaysAllow or Webhook, got {raw!r}")
    return text


@dataclass(frozen=True)
class AuthenticationConfig:
    anonymous_enabled: bool = False
    client_ca_file: str = ""
    token_file: str = ""
    webhook_enabled: bool = False
    webhook_cache_ttl: float = 120.0


@dataclass(frozen=True)
class AuthorizationConfig:
    mode: str = "AlwaysAllow"
    webhook_cache_authorized_ttl: float = 300.0
    webhook_cache_unauthorized_ttl: float = 30.0


def _parse_nested(prefix: str, raw: object, keys: tuple[Key, ...],
                  subs: dict[str, tuple[Key, ...]]) -> dict[str, Any]:
    out = _parse_section(prefix, raw, keys, skip=tuple(subs))
    section: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    for sub, sub_keys in subs.items():
        out.update(_parse_section(f"{prefix}.{sub}", section.get(sub), sub_keys))
    return out


def _parse_authentication(raw: object) -> AuthenticationConfig:
    return AuthenticationConfig(**_parse_nested("authentication", raw, AUTHN_KEYS,
                                                 AUTHN_SUB_KEYS))


def _parse_authorization(raw: object) -> AuthorizationConfig:
    return AuthorizationConfig(**_parse_nested("authorization", raw, AUTHZ_KEYS,
                                               AUTHZ_SUB_KEYS))


def _dump_nested(obj: object, keys: tuple[Key, ...],
                 subs: dict[str, tuple[Key, ...]]) -> dict[str, Any]:
    out = _dump_section(obj, keys)
    for sub, sub_keys in subs.items():
        out[sub] = _dump_section(obj, sub_keys)
    return out


@dataclass(frozen=True)
class SyncloopConfig:
    crash_loop_backoff_initial: float = 10.0
    crash_loop_backoff_max: float = 300.0
    crash_loop_backoff_reset: float = 600.0


# Keys of a restart spec (`supervision.defaults` and `supervision.processes.<name>`).
SPEC_KEYS: tuple[Key, ...] = (
    Key("module", "module", STR, "module with run(ctx) (custom processes)"),
    Key("enabled", "enabled", BOOL, "run this process"),
    Key("period", "period", DURATION, "re-run this long after a normal return"),
    Key("jitter", "jitter", FACTOR, "add rand[0,1) * jitter * period"),
    Key("backoffBase", "backoff_base", DURATION, "delay after the 2nd crash in a row"),
    Key("backoffCap", "backoff_cap", DURATION, "maximum crash back-off delay"),
    Key("backoffResetAfter", "backoff_reset_after", DURATION, "stable run that resets back-off"),
    Key("intensity", "intensity", COUNT, "crash restarts allowed within intensityPeriod"),
    Key("intensityPeriod", "intensity_period", DURATION, "window of the intensity limit"),
    Key("heartbeatTimeout", "heartbeat_timeout", DURATION, "kill when silent this long"),
    Key("stopTimeout", "stop_timeout", DURATION, "SIGTERM to SIGKILL grace"),
    # [ops port, issue 14] supervisord-style event listeners (custom processes only)
    Key("kind", "kind", Kind(
        lambda k, v: _parse_choice(k, v, ("process", "eventlistener")), metavar="KIND"),
        "process (a module's run(ctx)) or eventlistener (a command fed supervisord's events)"),
    Key("command", "command", STR, "eventlistener: the command (split like a shell's words)"),
    Key("events", "events", Kind(lambda k, v: _parse_events(k, v), metavar="EVENTS"),
        "eventlistener: comma-separated event types (PROCESS_STATE, TICK_5, TICK_60, ...)"),
    Key("stdoutEventsEnabled", "stdout_events_enabled", BOOL,
        "emit PROCESS_LOG_STDOUT events for this process's log lines (supervisord's)"),
    Key("stderrEventsEnabled", "stderr_events_enabled", BOOL,
        "supervisord's stderr_events_enabled (a subsystem's stderr is in its one log: no-op)"),
)

# supervisord's event types an eventlistener may subscribe to (a type covers its subtypes).
EVENT_TYPES = ("EVENT", "PROCESS_STATE", "PROCESS_STATE_STARTING", "PROCESS_STATE_RUNNING",
               "PROCESS_STATE_BACKOFF", "PROCESS_STATE_STOPPING", "PROCESS_STATE_EXITED",
               "PROCESS_STATE_STOPPED", "PROCESS_STATE_FATAL", "PROCESS_STATE_UNKNOWN",
               "TICK", "TICK_5", "TICK_60", "TICK_3600",
               "PROCESS_LOG", "PROCESS_LOG_STDOUT", "PROCESS_LOG_STDERR")


def _parse_events(key: str, raw: object) -> str:
    text = parse_str(key, raw)
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in EVENT_TYPES]
    if bad or not names:
        raise ConfigError(key, f"unknown event type {bad[0]!r}" if bad else "no event type")
    return ",".join(names)


@dataclass(frozen=True)
class SupervisionConfig:
    """The `supervision` section. `defaults` and `processes` hold validated partial restart
    specs keyed by attribute name (e.g. `{"period": 1.0}`); `podvisor.supervisor.registry`
    resolves them into full `ProcessSpec`s."""

    heartbeat_interval: float = 1.0
    shutdown_timeout: float = 20.0
    stop_pods_timeout: float = 60.0
    builtins: bool = True
    log_level: str = "info"
    log_max_size: int = 10 * 1024 * 1024
    log_max_files: int = 3
    spawn_method: str = "forkserver"
    defaults: Mapping[str, Any] = field(default_factory=dict)
    processes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    """The effective agent config. Defaults mirror the kubelet's (KUBELET.md)."""

    node_name: str = field(default_factory=lambda: socket.gethostname().lower())
    root_dir: str = "/var/lib/podvisor"
    static_pod_path: str = ""
    static_pod_url: str = ""
    static_pod_url_header: Mapping[str, list[str]] = field(default_factory=dict)
    file_check_frequency: float = 20.0
    http_check_frequency: float = 20.0
    sync_frequency: float = 60.0
    runtime_endpoint: str = "embedded"
    cri_proxy: bool = False
    runtime_request_timeout: float = 120.0
    address: str = "127.0.0.1"
    port: int = 10250
    read_only_port: int = 0
    tls_cert_file: str = ""
    tls_private_key_file: str = ""
    image_gc_high_threshold_percent: int = 85
    image_gc_low_threshold_percent: int = 80
    image_minimum_gc_age: float = 120.0
    container_log_max_size: int = 10 * 1024 * 1024
    container_log_max_files: int = 5
    serialize_image_pulls: bool = True
    max_parallel_image_pulls: int = 0
    kubeconfig: str = ""
    stop_pods_on_exit: bool = False
    shutdown_grace_period: float = 0.0
    shutdown_grace_period_critical_pods: float = 0.0
    shutdown_grace_period_by_pod_priority: Sequence[Mapping[str, int]] = field(
        default_factory=list)
    shutdown_on_signal: bool = False
    cgroup_root: str = "/podvisor"
    # [issue 27] the embedded runtime's pod network
    network_plugin: str = "host"
    cni_conf_dir: str = ""
    cni_bin_dir: str = "/usr/lib/cni:/opt/cni/bin"
    pod_pids_limit: int = -1
    run_once: bool = False
    run_once_max_retries: int = 10
    run_once_retry_delay: float = 1.0
    # [issue 15] API server membership
    node_status_update_frequency: float = 10.0
    node_status_report_frequency: float = 300.0
    node_lease_duration_seconds: int = 40
    node_lease_renew_interval: float = 10.0
    max_pods: int = 110
    register_node: bool = True
    api_watch_timeout: float = 300.0
    api_retry_max_delay: float = 30.0
    status_sweep_frequency: float = 10.0
    config_map_and_secret_change_detection_strategy: str = "Watch"
    api_object_cache_ttl: float = 10.0
    volume_stats_agg_period: float = 60.0  # [issue 25] volumeStatsAggPeriod (1m)
    volume_plugin_dir: str = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/"
    # [issue 26] TLS bootstrap and rotation; the Node's settings
    bootstrap_kubeconfig: str = ""
    cert_dir: str = ""
    rotate_certificates: bool = False
    server_tls_bootstrap: bool = False
    node_ip: str = ""
    node_labels: Mapping[str, str] = field(default_factory=dict)
    register_with_taints: Sequence[Mapping[str, str]] = field(default_factory=list)
    provider_id: str = ""
    kube_reserved: Mapping[str, str] = field(default_factory=dict)
    system_reserved: Mapping[str, str] = field(default_factory=dict)
    eviction_hard: Mapping[str, str] = field(
        default_factory=lambda: dict(DEFAULT_EVICTION_HARD))
    eviction_soft: Mapping[str, str] = field(default_factory=dict)
    eviction_soft_grace_period: Mapping[str, float] = field(default_factory=dict)
    eviction_max_pod_grace_period: int = 0
    eviction_minimum_reclaim: Mapping[str, str] = field(default_factory=dict)
    eviction_pressure_transition_period: float = 300.0
    eviction_monitoring_period: float = 10.0
    # [issue 24] pod DNS
    cluster_dns: Sequence[str] = field(default_factory=list)
    cluster_domain: str = ""
    resolv_conf: str = "/etc/resolv.conf"
    # [ops port, issue 14]
    ops_address: str = "127.0.0.1"
    ops_port: int = 9001
    ops_username: str = "admin"
    ops_password_file: str = ""
    ops_tls_cert_file: str = ""
    ops_tls_private_key_file: str = ""
    supervision: SupervisionConfig = field(default_factory=SupervisionConfig)
    syncloop: SyncloopConfig = field(default_factory=SyncloopConfig)
    # [images, issue 12] imageRegistries: {HOST: {caFile, plainHTTP, mirrors}} (YAML only)
    image_registries: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    authentication: AuthenticationConfig = field(default_factory=AuthenticationConfig)
    authorization: AuthorizationConfig = field(default_factory=AuthorizationConfig)

    @property
    def node_ips(self) -> tuple[str, ...]:
        """``nodeIP``'s addresses (one, or one per family; () when unset): the Node's
        InternalIPs, and the pods' ``hostIP``/``hostIPs`` as the kubelet reports them."""
        return tuple(ip for ip in self.node_ip.split(",") if ip)


def _parse_section(
    prefix: str, raw: object, keys: tuple[Key, ...], skip: tuple[str, ...] = ()
) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(prefix or "<root>", f"expected a map, got {type(raw).__name__}")
    by_name = {k.name: k for k in keys}
    out: dict[str, Any] = {}
    for name, value in raw.items():
        path = f"{prefix}.{name}" if prefix else str(name)
        if name in skip:
            continue
        key = by_name.get(name) if isinstance(name, str) else None
        if key is None:
            raise ConfigError(path, "unknown key")
        out[key.attr] = key.kind.parse(path, value)
    return out


def _parse_supervision(raw: object) -> SupervisionConfig:
    base = _parse_section("supervision", raw, SUPERVISION_KEYS, skip=("defaults", "processes"))
    section: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    defaults = _parse_section("supervision.defaults", section.get("defaults"), SPEC_KEYS)
    if "module" in defaults:
        raise ConfigError("supervision.defaults.module", "a module is per process")
    procs_raw = section.get("processes") or {}
    if not isinstance(procs_raw, Mapping):
        raise ConfigError("supervision.processes", "expected a map of process name to spec")
    processes: dict[str, Mapping[str, Any]] = {}
    for name, spec in procs_raw.items():
        path = f"supervision.processes.{name}"
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(path, "process names use letters, digits, '-' and '_'")
        processes[name] = _parse_section(path, spec, SPEC_KEYS)
    return SupervisionConfig(**base, defaults=defaults, processes=processes)


def config_from_mapping(raw: object) -> Config:
    """Validate a parsed YAML/JSON document into a `Config` (raises `ConfigError`)."""
    values = _parse_section("", raw, TOP_KEYS, skip=("supervision", "syncloop",
                                                      "authentication", "authorization",
                                                      "imageRegistries"))
    section = raw.get("supervision") if isinstance(raw, Mapping) else None
    sl_raw = raw.get("syncloop") if isinstance(raw, Mapping) else None
    syncloop = SyncloopConfig(**_parse_section("syncloop", sl_raw, SYNCLOOP_KEYS))
    mapping: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    config = Config(**values, supervision=_parse_supervision(section), syncloop=syncloop,
                    authentication=_parse_authentication(mapping.get("authentication")),
                    authorization=_parse_authorization(mapping.get("authorization")),
                    image_registries=_parse_registries(mapping.get("imageRegistries")))
    if bool(config.tls_cert_file) != bool(config.tls_private_key_file):
        raise ConfigError("tlsPrivateKeyFile" if config.tls_cert_file else "tlsCertFile",
                          "tlsCertFile and tlsPrivateKeyFile go together")
    if not config.kubeconfig:  # [issue 15] the webhook modes ask the API server
        if config.authentication.webhook_enabled:
            raise ConfigError("authentication.webhook.enabled", f"true {WEBHOOK_NEEDS_API}")
        if config.authorization.mode == "Webhook":
            raise ConfigError("authorization.mode", f"Webhook {WEBHOOK_NEEDS_API}")
    for key, value in (("bootstrapKubeconfig", config.bootstrap_kubeconfig),
                       ("rotateCertificates", config.rotate_certificates),
                       ("serverTLSBootstrap", config.server_tls_bootstrap)):
        if value and not config.kubeconfig:  # [issue 26] they write or renew kubeconfig's pair
            raise ConfigError(key, "needs kubeconfig (the file TLS bootstrap writes and "
                                   "rotation renews)")
    if config.image_gc_low_threshold_percent > config.image_gc_high_threshold_percent:
        raise ConfigError("imageGCLowThresholdPercent", "must be <= imageGCHighThresholdPercent")
    if not config.root_dir:
        raise ConfigError("rootDir", "must not be empty")
    if config.serialize_image_pulls and config.max_parallel_image_pulls > 1:
        raise ConfigError("maxParallelImagePulls", "needs serializeImagePulls: false (the "
                                                   "kubelet's rule)")
    if config.supervision.heartbeat_interval <= 0:
        raise ConfigError("supervision.heartbeatInterval", "must be > 0")
    if bool(config.ops_tls_cert_file) != bool(config.ops_tls_private_key_file):
        raise ConfigError("opsTLSCertFile" if not config.ops_tls_cert_file
                          else "opsTLSPrivateKeyFile",
                          "opsTLSCertFile and opsTLSPrivateKeyFile go together")
    if config.ops_port and not config.ops_username:
        raise ConfigError("opsUsername", "must not be empty")
    if config.shutdown_on_signal and not node_shutdown_groups(config):
        raise ConfigError("shutdownOnSignal", "needs shutdownGracePeriod (or "
                                              "shutdownGracePeriodByPodPriority)")
    return config


def node_shutdown_groups(config: Config) -> list[ShutdownGroup]:
    """Graceful node shutdown's priority groups ([] = off; common/shutdownkeys.py)."""
    return shutdown_groups(config.shutdown_grace_period,
                           config.shutdown_grace_period_critical_pods,
                           [dict(g) for g in config.shutdown_grace_period_by_pod_priority])


def cert_dir(config: Config) -> Path:
    """Where TLS bootstrap and rotation keep their pairs: `certDir`, else `<rootDir>/pki`."""
    return Path(config.cert_dir or os.path.join(config.root_dir, "pki"))


def cni_conf_dir(config: Config) -> Path:
    """The embedded runtime's CNI config directory: `cniConfDir`, else `<rootDir>/cni/net.d`."""
    return Path(config.cni_conf_dir or os.path.join(config.root_dir, "cni", "net.d"))


def ops_password_path(config: Config) -> Path:
    """The ops port's password file: `opsPasswordFile`, else `<rootDir>/ops-password`."""
    return Path(config.ops_password_file or os.path.join(config.root_dir, "ops-password"))


# [images, issue 12] The embedded runtime's registry settings, per registry host.
REGISTRY_FIELDS = {"caFile": str, "plainHTTP": bool, "mirrors": list}


def _parse_registries(raw: object) -> dict[str, dict[str, Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError("imageRegistries", "expected a map of registry host to settings")
    out: dict[str, dict[str, Any]] = {}
    for host, spec in raw.items():
        path = f"imageRegistries.{host}"
        if not isinstance(host, str) or not host or "/" in host:
            raise ConfigError(path, "keys are registry hosts like registry.local:5000")
        if not isinstance(spec, Mapping):
            raise ConfigError(path, "expected a map (caFile, plainHTTP, mirrors)")
        entry: dict[str, Any] = {}
        for name, value in spec.items():
            want = REGISTRY_FIELDS.get(name) if isinstance(name, str) else None
            if want is None:
                raise ConfigError(f"{path}.{name}", "unknown key (caFile, plainHTTP, mirrors)")
            if not isinstance(value, want) or (
                    isinstance(value, list) and not all(isinstance(m, str) and m
                                                        for m in value)):
                raise ConfigError(f"{path}.{name}", f"expected {want.__name__}"
                                  + (" of registry hosts" if want is list else ""))
            entry[name] = list(value) if isinstance(value, list) else value
        out[host] = entry
    return out


def _dump_section(obj: object, keys: tuple[Key, ...]) -> dict[str, Any]:
    return {k.name: k.kind.dump(getattr(obj, k.attr)) for k in keys}


def _dump_spec(partial: Mapping[str, Any]) -> dict[str, Any]:
    return {k.name: k.kind.dump(partial[k.attr]) for k in SPEC_KEYS if k.attr in partial}


def config_to_mapping(config: Config) -> dict[str, Any]:
    """The inverse of `config_from_mapping` (camelCase keys, durations as strings)."""
    out = _dump_section(config, TOP_KEYS)
    out["syncloop"] = _dump_section(config.syncloop, SYNCLOOP_KEYS)
    out["imageRegistries"] = {h: dict(v) for h, v in config.image_registries.items()}
    out["authentication"] = _dump_nested(config.authentication, AUTHN_KEYS, AUTHN_SUB_KEYS)
    out["authorization"] = _dump_nested(config.authorization, AUTHZ_KEYS, AUTHZ_SUB_KEYS)
    sup = config.supervision
    out["supervision"] = {
        **_dump_section(sup, SUPERVISION_KEYS),
        "defaults": _dump_spec(sup.defaults),
        "processes": {name: _dump_spec(spec) for name, spec in sup.processes.items()},
    }
    return out


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


# Keys podvisor accepts (they are part of the config contract) but whose subsystem does not exist
# yet: a value other than the default is reported at start, never silently ignored.
NOT_YET_USED: tuple[tuple[str, str, str], ...] = (
)


def keys_not_yet_used(config: Config) -> list[tuple[str, str]]:
    """(key, why) for every key set away from its default that nothing uses yet."""
    default = Config()
    return [(key, why) for key, attr, why in NOT_YET_USED
            if getattr(config, attr) != getattr(default, attr)]


# Keys naming files: relative paths in the config file are relative to the file's folder (as
# the kubelet resolves its config file's paths); relative paths in flags, to the working dir.
PATH_KEYS = ("rootDir", "staticPodPath", "kubeconfig", "tlsCertFile", "tlsPrivateKeyFile",
             "opsPasswordFile", "opsTLSCertFile", "opsTLSPrivateKeyFile", "bootstrapKubeconfig",
             "certDir", "cniConfDir", "resolvConf")
NESTED_PATH_KEYS = (("authentication", "tokenFile"), ("authentication", "x509", "clientCAFile"))


def _absolute_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(data)
    for key in PATH_KEYS:
        value = out.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            out[key] = os.path.normpath(os.path.join(base, value))
    for path in NESTED_PATH_KEYS:
        holder: Any = out
        for part in path[:-1]:
            holder = holder.get(part) if isinstance(holder, Mapping) else None
        if isinstance(holder, dict):
            value = holder.get(path[-1])
            if isinstance(value, str) and value and not os.path.isabs(value):
                holder[path[-1]] = os.path.normpath(os.path.join(base, value))
    return out


def load_config(path: Path | None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Read the YAML file (if any), apply `overrides` (flags, as a nested camelCase mapping,
    which win over the file), validate, and make the path keys absolute (`PATH_KEYS`)."""
    import yaml  # imported here: children read JSON and should not pay for yaml

    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError("--config", f"cannot read {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError("--config", f"invalid YAML in {path}: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError("<root>", f"expected a map at the top of {path}")
        data = _absolute_paths(loaded or {}, path.resolve().parent)
    data = _absolute_paths(_merge(data, overrides or {}), Path.cwd())
    return config_from_mapping(data)


def write_config_json(config: Config, path: Path) -> None:
    """Write the effective config atomically (mode 0600) for children to read."""
    tmp = path.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(config_to_mapping(config), out, indent=2, sort_keys=True)
    os.replace(tmp, path)


def read_config_json(path: Path) -> Config:
    """Read `run/config.json` back (raises `ConfigError` or `OSError`)."""
    with path.open(encoding="utf-8") as src:
        return config_from_mapping(json.load(src))


def run_config(path: Path) -> Config | None:
    """The effective config an agent on this rootDir wrote (`run/config.json`), or None when no
    agent ever ran there (raises `ConfigError` or `OSError` when it cannot be read)."""
    if not path.exists():
        return None
    return read_config_json(path)


def runtime_endpoint_of(path: Path) -> str:
    """`runtimeEndpoint` of the agent on this rootDir (`run/config.json`): `embedded` when no
    agent ran there or its config cannot be read (the one lookup podvisorctl's commands share)."""
    try:
        config = run_config(path)
    except (OSError, ValueError):
        return "embedded"
    return config.runtime_endpoint if config is not None else "embedded"


def dataclass_attrs(cls: type[Any]) -> set[str]:
    """Attribute names of a config dataclass (used by a test that keeps tables and classes
    in sync)."""
    return {f.name for f in fields(cls)}
