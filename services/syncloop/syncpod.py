"""SyncPod: read the pod's runtime state fresh from CRI (or take it from the stream event that
triggered the sync, when safe: ``runtime_events``), compute the actions, carry them out.

Thin effects over ``compute_pod_actions`` and the ``cri_config`` builders. Errors of one
container do not stop the others (regular containers); every error is reported in the result,
and the worker requeues the pod after the error delay. Runs on a worker thread: everything it
touches (CRI client, shared back-off, logger) is thread-safe.

Sandboxes: a new one gets the largest listed attempt + 1 (``actions``). Not-ready sandboxes
without containers are stopped and removed here; one whose stop fails (containerd cannot tear
down a network it never set up while its CNI is not initialized) never blocks the pod: it is
retried with its own back-off (``sandbox_backoff``, 2 s doubling to 5 min) by later syncs. A
pod that is not ``hostNetwork`` gets no new sandbox while the runtime's network is not ready
(``network``): the result says so (``network_error``) and the loop holds the pod.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from cri_api.v1 import api_pb2 as pb

from podvisor.common.crashpoints import NEVER, CrashPoints
from podvisor.common.logs import Log
from podvisor.ipc.volumemaps import PodVolumes
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.pod import (
    ApiVolume,
    Container,
    NodeFacts,
    Pod,
    PullPolicy,
    container_env,
    image_reference_error,
    needs_pod_ip,
    oom_score_adj,
    qos_class,
)
from podvisor.services.syncloop import cri_config, volumes
from podvisor.services.syncloop import dns as podns
from podvisor.services.syncloop import volumes as volumes_mod
from podvisor.services.syncloop.actions import (
    PodActions,
    StartAction,
    Waiting,
    compute_pod_actions,
)
from podvisor.services.syncloop.allocation import AllocationStore
from podvisor.services.syncloop.apiobjects import ApiObjects
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff, SharedBackoff
from podvisor.services.syncloop.dns import DnsSettings
from podvisor.services.syncloop.hooks import HookTarget, run_hook
from podvisor.services.syncloop.keyring import Credential, Keyring, pod_keyring, repository
from podvisor.services.syncloop.network import NetworkState, not_ready_error
from podvisor.services.syncloop.podcache import ImagePresence, RuntimeCache
from podvisor.services.syncloop.podcgroups import PodCgroupError, PodCgroups
from podvisor.services.syncloop.resize import NO_RESIZE, ResizePlan, amounts
from podvisor.services.syncloop.resizing import (
    ResizeReport,
    apply_updates,
    report,
    resize_plan,
)
from podvisor.services.syncloop.runtime_events import (
    Effect,
    Effects,
    EventSnapshot,
    runtime_from_event,
)
from podvisor.services.syncloop.runtime_state import (
    ContainerInfo,
    ContainerState,
    PodRuntime,
    pod_runtime,
    read_pod_runtime,
)
from podvisor.services.syncloop.runtimeclass import RuntimeClassError, RuntimeClasses, supports_rro
from podvisor.services.syncloop.terminate import kill_containers, kill_grace

IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
ERR_IMAGE_PULL = "ErrImagePull"
ERR_IMAGE_NEVER_PULL = "ErrImageNeverPull"
INVALID_IMAGE_NAME = "InvalidImageName"
CREATE_CONTAINER_ERROR = "CreateContainerError"
CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
RUN_CONTAINER_ERROR = "RunContainerError"
POST_START_HOOK_ERROR = "PostStartHookError"
FAILED_POST_START_HOOK = "FailedPostStartHook"
DEADLINE_EXCEEDED = "DeadlineExceeded"
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"
KEEP_DEAD_PER_CONTAINER = 1
# A call that met an earlier call for the same object still running in the runtime (the calls
# of a killed sync loop go on for a while, and containerd undoes them when their context ends):
# containerd's "name is reserved" to RunPodSandbox or CreateContainer (CriError.name_reserved),
# a StartContainer of a container being started. Retried this soon, not after error_delay.
IN_FLIGHT_RETRY = 0.5
SANDBOX_STOP_BACKOFF = BackoffPolicy(initial=2.0, cap=300.0, reset_after=600.0)


def _sandbox_backoff() -> SharedBackoff:
    return SharedBackoff(CrashBackoff(SANDBOX_STOP_BACKOFF))


@dataclass(frozen=True)
class SyncDeps:
    cri: RuntimeClient
    pods_dir: Path
    pod_logs_dir: Path
    backoff: SharedBackoff
    image_backoff: SharedBackoff
    mono: Callable[[], float]
    wall: Callable[[], float]
    log: Log
    sleep: Callable[[float], None]
    cgroups: PodCgroups | None = None  # None: no cgroup_parent, no cleanup (cgroupRoot: "")
    # CPUs, memory and IPs of the node (downward API, OOM score); read once by main.py
    node: NodeFacts = field(default_factory=lambda: NodeFacts(cpu_millis=1000,
                                                              memory_bytes=1 << 30))
    cache: RuntimeCache | None = None  # a listing shared by workers; None: always read fresh
    images: ImagePresence | None = None  # None: ImageStatus before every start
    # keyed (pod uid, "sandbox:" + id): a failed stop of a dead sandbox waits this out
    sandbox_backoff: SharedBackoff = field(default_factory=_sandbox_backoff)
    network: NetworkState | None = None  # None: never hold pods for the network
    # API pods' ConfigMaps, Secrets and tokens (None: standalone, such pods never get here)
    objects: ApiObjects | None = None
    # the RuntimeClass manager (None without an API server: runtimeClassName is not looked up
    # and the default handler runs every sandbox, as the kubelet without a client)
    runtime_classes: RuntimeClasses | None = None
    # serializeImagePulls / maxParallelImagePulls: pulls hold a slot (None: unbounded)
    pull_slots: threading.Semaphore | None = None
    # called once per container started (kubelet_started_containers_total)
    started: Callable[[], None] = lambda: None
    # the volume manager's view of a pod's mounted volumes (the ``volumes`` replica; None: no
    # entry yet). Read from pool threads.
    volumes: Callable[[str], PodVolumes | None] = lambda uid: None
    # clusterDNS, clusterDomain, resolvConf: pods' resolv.conf, hostnames, /etc/hosts (dns.py)
    dns: DnsSettings = field(default_factory=DnsSettings)
    # fault-injection tests' crash points ("syncloop:<step>", common/crashpoints.py):
    # sync.after_sandbox, sync.after_create, terminate.after_stop (terminate.py)
    crash: CrashPoints = NEVER
    # where the node's own registry credentials are looked for (config.json, .dockercfg):
    # <rootDir>, the working directory, $HOME/.docker, /.docker (keyring.py)
    docker_config_paths: tuple[Path, ...] = ()
    # in-place resize: the allocation checkpoint (allocation.py; None: resize off, as before)
    allocation: AllocationStore | None = None


@dataclass(frozen=True)
class SyncResult:
    ok: bool
    errors: tuple[str, ...] = ()
    waiting: Mapping[str, Waiting] = field(default_factory=dict)
    sandbox_id: str | None = None
    retry_after: float | None = None
    pod_failed: bool = False
    effects: Effects = field(default_factory=dict)  # container ID -> what this sync did
    acted: bool = False  # it called the runtime to change something
    network_error: str = ""  # no sandbox: the runtime's network is not ready (kubelet wording)
    # a call failed because the runtime was unreachable or went away meanwhile: the errors are
    # the runtime's, not the pod's (retried at the runtime back-off, not after error_delay)
    runtime_down: bool = False
    deadline_exceeded: bool = False  # past activeDeadlineSeconds: the loop fails the pod
    resize: ResizeReport | None = None  # the containers' actual resources after this sync


def _seed_backoff(deps: SyncDeps, pod: Pod, rt: PodRuntime) -> None:
    for c in pod.all_containers():
        latest = rt.latest(c.name)
        if latest is not None and latest.started_at > 0:
            deps.backoff.seed((pod.uid, c.name), latest.restart_count, latest.started_at)


class _Run:
    """One SyncPod execution: the pod, its actions, and what happened."""

    def __init__(self, deps: SyncDeps, pod: Pod, actions: PodActions,
                 rt: PodRuntime | None = None) -> None:
        self.deps, self.pod, self.actions = deps, pod, actions
        self.rt = rt if rt is not None else PodRuntime()
        self.targets = {e.name: e.target_container_name for e in pod.spec.ephemeral_containers}
        self.errors: list[str] = []
        self.waiting: dict[str, Waiting] = dict(actions.waiting)
        self.sandbox_id = actions.sandbox_id
        self.qos = qos_class(pod)
        parent = deps.cgroups.parent(pod.uid, self.qos) if deps.cgroups is not None else ""
        self._pod_ips: tuple[str, ...] | None = None
        self._parent = parent
        self._sandbox_cfg: pb.PodSandboxConfig | None = None
        self.retry_after = actions.retry_after
        self.effects: dict[str, Effect] = {}
        self.from_event = False  # the runtime state came from a stream event (for the log)
        self.runtime_down = False  # a call found the runtime unreachable (SyncResult)
        self._keyring: Keyring | None = None
        self.block_volumes: set[str] = set()  # raw block volumes (mounted_volumes)

    @property
    def sandbox_cfg(self) -> pb.PodSandboxConfig:
        """The pod's sandbox config, made on first use (it reads the node's resolv.conf);
        ValueError when the pod's hostname cannot be made (``kernel_hostname``)."""
        if self._sandbox_cfg is None:
            pod, deps = self.pod, self.deps
            hostname = podns.kernel_hostname(pod, deps.dns.cluster_domain)
            result = podns.pod_dns(pod, deps.dns, podns.read_resolv_conf(deps.dns.resolv_conf),
                                   deps.node.host_ips)
            for reason, message in result.warnings:
                deps.log.warning("syncloop.pod.dns", pod=pod.full_name, pod_uid=pod.uid,
                                 reason=reason, message=message)
            conf = result.conf
            self._sandbox_cfg = cri_config.sandbox_config(
                pod, self.actions.attempt, deps.pod_logs_dir, self._parent, hostname,
                pb.DNSConfig(servers=conf.servers, searches=conf.searches,
                             options=conf.options))
        return self._sandbox_cfg

    def hosts_mount(self, c: Container) -> pb.Mount | None:
        """The kubelet's /etc/hosts mount (``makeMounts``: ``<pod dir>/etc-hosts``, unless the
        container mounts /etc/hosts itself). The file is written when the sandbox is made
        (``write_hosts``: the pod's IPs are known then and stay), or here when it is missing.
        One difference: a pod on the host network without hostAliases gets none, since the
        file would be the node's own /etc/hosts, which its containers see anyway (so such a
        pod needs no mount namespace on the embedded runtime)."""
        if any(m.mount_path == "/etc/hosts" for m in c.volume_mounts) or not self.wants_hosts():
            return None
        path = self.hosts_path()
        if not path.exists():
            self.write_hosts()
        return pb.Mount(container_path="/etc/hosts", host_path=str(path))

    def wants_hosts(self) -> bool:
        return not self.pod.spec.host_network or bool(self.pod.spec.dns.host_aliases)

    def hosts_path(self) -> Path:
        return self.deps.pods_dir / self.pod.uid / "etc-hosts"

    def write_hosts(self) -> None:
        """``ensureHostsFile`` (OSError when it cannot be written)."""
        pod = self.pod
        node_hosts = ""
        if pod.spec.host_network:
            with contextlib.suppress(OSError):
                node_hosts = Path("/etc/hosts").read_text(errors="replace")
        content = podns.hosts_file(pod, self.pod_ips(), self.deps.dns.cluster_domain, node_hosts)
        path = self.hosts_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(".etc-hosts.tmp")
        tmp.write_text(content)
        tmp.chmod(0o644)
        tmp.replace(path)

    def pod_ips(self) -> tuple[str, ...]:
        """The sandbox's IPs (PodSandboxStatus ``network``), read once per sync and only when
        an env var needs them. hostNetwork pods, and sandboxes that report none (the embedded
        runtime's share the host's network), have the host's IPs, as the kubelet gives
        hostNetwork pods."""
        if self._pod_ips is None:
            ips: tuple[str, ...] = ()
            if not self.pod.spec.host_network and self.sandbox_id:
                net = self.deps.cri.pod_sandbox_status(self.sandbox_id).network
                ips = tuple(ip for ip in (net.ip, *(a.ip for a in net.additional_ips)) if ip)
            self._pod_ips = ips or self.deps.node.host_ips
        return self._pod_ips

    def fail_call(self, name: str, reason: str, err: CriError) -> None:
        """A runtime call for container ``name`` failed with ``err``."""
        self.runtime_down = self.runtime_down or err.unavailable
        self.fail(name, reason, err.message)

    def fail(self, name: str, reason: str, message: str) -> None:
        self.waiting[name] = Waiting(reason, message)
        self.errors.append(f"{name}: {reason}: {message}")
        self.deps.log.warning("syncloop.container.error", pod=self.pod.full_name,
                              pod_uid=self.pod.uid, container=name, reason=reason,
                              message=message)

    def mounted_volumes(self) -> dict[str, tuple[str, bool]] | None:
        """The host path and read-only flag of each volume the volume manager mounts for this
        pod, once all of them are ready (the kubelet's ``WaitForAttachAndMount``); None (and
        the error recorded, the volume manager's reasons in it) while one is not."""
        names = [v.name for v in self.pod.spec.volumes if v.mounted]
        if not names:
            return {}
        found = self.deps.volumes(self.pod.uid)
        ready = {n: v for n, v in (found.volumes if found is not None else {}).items()
                 if v.ready and v.host_path}
        waiting = [n for n in names if n not in ready]
        if not waiting:
            self.block_volumes = {n for n in names if ready[n].block}
            return {n: (ready[n].host_path, ready[n].read_only) for n in names}
        why = [f"{n}: {v.message}" for n, v in sorted((found.volumes if found else {}).items())
               if n in waiting and v.message]
        message = (f"Unable to attach or mount volumes: unmounted volumes=[{' '.join(waiting)}]"
                   f": {'; '.join(why) or 'waiting for the volume manager'}")
        self.errors.append(message)
        self.deps.log.info("syncloop.volume.waiting", pod=self.pod.full_name,
                           pod_uid=self.pod.uid, volumes=waiting, message=message)
        return None

    def sandbox_failed(self, why: str) -> None:
        """No sandbox (FailedCreatePodSandBox, the kubelet's "Failed to create pod sandbox:
        <error>"); the pod stays ContainerCreating and is retried after the error delay."""
        message = f"Failed to create pod sandbox: {why}"
        self.errors.append(message)
        self.deps.log.warning("syncloop.sandbox.config_failed", pod=self.pod.full_name,
                              pod_uid=self.pod.uid, message=message)

    def create_sandbox(self) -> bool:
        """False (and the errors recorded) when a volume could not be set up: no sandbox then,
        and the worker retries after its error delay, as the kubelet's volume manager does."""
        if self.mounted_volumes() is None:
            return False
        failed = volumes.setup_volumes(self.pod, self.deps.pods_dir, self.deps.node,
                                       self.deps.wall(), self.deps.objects)
        for name, why in failed.items():
            message = f'MountVolume.SetUp failed for volume "{name}" : {why}'
            self.errors.append(message)
            self.deps.log.warning("syncloop.volume.failed", pod=self.pod.full_name,
                                  pod_uid=self.pod.uid, volume=name, message=message)
        if failed:
            return False
        if self.deps.cgroups is not None:
            try:  # the pod's own limits, before anything runs in it
                self.deps.cgroups.ensure(self.pod, self.qos)
            except PodCgroupError as err:
                message = f"pod cgroup: {err}"
                self.errors.append(message)
                self.deps.log.warning("syncloop.pod.cgroup.failed", pod=self.pod.full_name,
                                      pod_uid=self.pod.uid, message=message)
                return False
        try:
            sandbox_cfg = self.sandbox_cfg
        except ValueError as err:  # the kubelet: "Failed to generate sandbox config"
            message = f"Failed to create pod sandbox: {err}"
            self.errors.append(message)
            self.deps.log.warning("syncloop.sandbox.config_failed", pod=self.pod.full_name,
                                  pod_uid=self.pod.uid, message=message)
            return False
        try:
            handler = self.runtime_handler()
        except RuntimeClassError as err:  # the kubelet's createPodSandbox: not created
            self.sandbox_failed(str(err))
            return False
        log_dir = Path(sandbox_cfg.log_directory)
        log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.sandbox_id = self.deps.cri.run_pod_sandbox(sandbox_cfg, handler)
        except CriError as err:
            if err.unavailable or err.name_reserved:
                raise
            code = "".join(w.capitalize() for w in err.code.name.split("_"))  # Go's codes
            # e.g. a handler the runtime does not have (the kubelet's %v of the gRPC error)
            self.sandbox_failed(f"rpc error: code = {code} desc = {err.message}")
            return False
        self.deps.crash.hit("sync.after_sandbox")
        try:
            ips = list(self.pod_ips())
        except CriError as err:  # only for the log here: a later pod_ips() asks again
            ips = [f"unknown: {err.message}"]
        self.deps.log.info("syncloop.sandbox.created", pod=self.pod.full_name,
                           pod_uid=self.pod.uid, sandbox_id=self.sandbox_id,
                           attempt=self.actions.attempt, pod_ips=ips)
        if self.wants_hosts():  # a new sandbox: new IPs (a failure: written at the start)
            with contextlib.suppress(OSError, CriError):
                self.write_hosts()
        return True

    def ensure_image(self, c: Container) -> bool:
        deps, key = self.deps, (self.pod.uid, "image:" + c.name)
        if (bad := image_reference_error(c.image)) is not None:
            self.fail(c.name, INVALID_IMAGE_NAME, bad)
            return False
        present = c.image_pull_policy is not PullPolicy.ALWAYS and (
            deps.images.present(c.image) if deps.images is not None
            else deps.cri.image_status(c.image) is not None)
        if present:
            if c.image_pull_policy is PullPolicy.IF_NOT_PRESENT:
                self.image_log("present", c, message=f'Container image "{c.image}" already '
                                                     "present on machine")
            return True
        if c.image_pull_policy is PullPolicy.NEVER:
            self.fail(c.name, ERR_IMAGE_NEVER_PULL,
                      f'Container image "{c.image}" is not present with pull policy of Never')
            return False
        entry = deps.image_backoff.entry(key)
        now = deps.mono()
        if entry is not None:
            left = deps.image_backoff.remaining(key, entry.last_update, now)
            if left > 0:
                self.waiting[c.name] = Waiting(IMAGE_PULL_BACK_OFF,
                                               f'Back-off pulling image "{c.image}"')
                self.retry_after = min(self.retry_after or left, left)
                return False
        self.image_log("pulling", c, message=f'Pulling image "{c.image}"')
        asked = deps.mono()
        slots = deps.pull_slots
        if slots is not None:
            slots.acquire()
        started = deps.mono()
        try:
            self.pull(c.image)
        except CriError as err:
            if err.unavailable:  # the runtime went away: no fault of the image, no back-off;
                self.runtime_down = True  # retried as soon as the runtime answers again
            else:
                done = deps.mono()
                deps.image_backoff.record_restart(key, done, done)
            self.fail(c.name, ERR_IMAGE_PULL, f'Failed to pull image "{c.image}": '
                                              f"{err.message}")
            return False
        finally:
            if slots is not None:
                slots.release()
        done = deps.mono()
        deps.image_backoff.forget_key(key)
        if deps.images is not None:
            deps.images.forget(c.image)
        self.image_log("pulled", c, duration=round(done - started, 3),
                       waited=round(started - asked, 3),
                       message=f'Successfully pulled image "{c.image}" in '
                               f"{done - started:.3g}s ({done - asked:.3g}s including "
                               "waiting).")  # no size: that would be one more ImageStatus
        return True

    def keyring(self) -> Keyring:
        """The pod's pull credentials (read once per sync, only when a pull is due); Secrets
        that cannot be read are said once per sync (FailedToRetrieveImagePullSecret)."""
        if self._keyring is None:
            objects = self.deps.objects
            self._keyring, missing = pod_keyring(
                self.pod, objects.pull_secret if objects is not None else None,
                self.deps.docker_config_paths)
            if missing:
                self.deps.log.warning(
                    "syncloop.pod.pull_secrets_missing", pod=self.pod.full_name,
                    pod_uid=self.pod.uid, secrets=missing,
                    message=f"Unable to retrieve some image pull secrets ({', '.join(missing)})"
                            "; attempting to pull the image may not succeed.")
        return self._keyring

    def pull(self, image: str) -> None:
        """The kubelet's ``PullImage``: with no credential for the image's registry, an
        anonymous pull; else each credential in turn until one works (raises the last error,
        all of them named when several failed)."""
        creds: list[Credential] = self.keyring().lookup(repository(image))
        if not creds:
            self.deps.cri.pull_image(image, self.sandbox_cfg)
            return
        errors: list[CriError] = []
        for cred in creds:
            auth = pb.AuthConfig(username=cred.username, password=cred.password)
            try:
                self.deps.cri.pull_image(image, self.sandbox_cfg, auth=auth)
                return
            except CriError as err:
                if err.unavailable:
                    raise
                errors.append(err)
        if len(errors) == 1:
            raise errors[0]
        raise CriError(errors[-1].method, errors[-1].code,
                       "[" + ", ".join(e.message for e in errors) + "]")

    def image_log(self, what: str, c: Container, **fields: Any) -> None:
        self.deps.log.info(f"syncloop.image.{what}", pod=self.pod.full_name,
                           pod_uid=self.pod.uid, container=c.name, image=c.image, **fields)

    def non_root_error(self, c: Container) -> str | None:
        """The kubelet's runAsNonRoot check, with the image's user from ImageStatus (asked only
        when runAsNonRoot is set without runAsUser)."""
        if not cri_config.needs_image_user(self.pod, c):
            return cri_config.run_as_non_root_error(self.pod, c, None, "")
        image = self.deps.cri.image_status(c.image)
        uid = image.uid.value if image is not None and image.HasField("uid") else None
        user = image.username if image is not None else ""
        return cri_config.run_as_non_root_error(self.pod, c, uid, user)

    def start(self, action: StartAction, spec: Container) -> bool:
        if action.container_id:  # created earlier, never started (actions.py)
            return self.start_created(action, spec)
        deps = self.deps
        if not self.ensure_image(spec):
            return False
        if (why := self.non_root_error(spec)) is not None:
            self.fail(spec.name, CREATE_CONTAINER_CONFIG_ERROR, why)
            return False
        mounted = self.mounted_volumes()
        if mounted is None:
            self.waiting[spec.name] = Waiting("ContainerCreating", self.errors[-1])
            return False
        volumes = cri_config.volume_paths(self.pod, deps.pods_dir,
                                          {n: p for n, (p, _) in mounted.items()})
        if (why := volumes_mod.missing_sub_path(spec, volumes, set(mounted))) is not None:
            self.fail(spec.name, CREATE_CONTAINER_CONFIG_ERROR, why)
            return False
        target = self.target_id(action, spec)
        if target is None:
            return False
        try:
            ips = self.pod_ips() if needs_pod_ip(spec) else ()
            env = container_env(self.pod, spec, deps.node, ips, deps.objects)
            oom = oom_score_adj(self.pod, spec, deps.node.memory_bytes, self.qos)
            config = cri_config.container_config(
                self.pod, spec, action.restart_count, volumes, deps.pods_dir.parent / "seccomp",
                env, oom, self.termination_log(spec), target,
                read_only={n for n, (_, ro) in mounted.items() if ro},
                rro_supported=self.rro_supported(spec),
                block={n: v for n, v in mounted.items() if n in self.block_volumes})
            hosts = self.hosts_mount(spec)
            if hosts is not None:
                config.mounts.append(hosts)
        except KeyError as err:
            self.fail(spec.name, CREATE_CONTAINER_ERROR, f"volume {err} not found")
            return False
        except (cri_config.SubPathError, cri_config.RecursiveReadOnlyError) as err:
            self.fail(spec.name, CREATE_CONTAINER_CONFIG_ERROR, str(err))  # makeMounts'
            return False
        except ValueError as err:  # generateContainerConfig's error: a config error
            self.fail(spec.name, CREATE_CONTAINER_CONFIG_ERROR, f"environment: {err}")
            return False
        except OSError as err:  # the kubelet's makeMounts: a config error
            self.fail(spec.name, CREATE_CONTAINER_CONFIG_ERROR, f"/etc/hosts: {err}")
            return False
        try:
            sandbox_cfg = self.sandbox_cfg
        except ValueError as err:
            self.fail(spec.name, CREATE_CONTAINER_CONFIG_ERROR, str(err))
            return False
        if action.previous_finished_at > 0:
            deps.backoff.record_restart((self.pod.uid, spec.name), action.previous_finished_at,
                                        deps.mono())
        if action.replaces and not self.remove_lost(action, spec):
            return False
        try:
            cid = deps.cri.create_container(self.sandbox_id, config, sandbox_cfg)
        except CriError as err:
            if err.name_reserved:
                self.retry_soon()
            elif deps.images is not None and not err.unavailable:
                deps.images.forget(spec.image)
            self.fail_call(spec.name, CREATE_CONTAINER_ERROR, err)
            return False
        self.effects[cid] = Effect.STARTED
        if deps.allocation is not None:  # it runs with the pod's allocation (resize.py)
            deps.allocation.set_actuated(self.pod.uid, spec.name, cid, amounts(spec.resources))
        deps.crash.hit("sync.after_create")
        return self.start_container(action, spec, cid)

    def runtime_handler(self) -> str:
        """The pod's runtime handler: its RuntimeClass's (raises RuntimeClassError), or ""
        (the default) without a RuntimeClass manager (no API server), as the kubelet."""
        classes = self.deps.runtime_classes
        return classes.lookup(self.pod.spec.runtime_class_name) if classes is not None else ""

    def rro_supported(self, spec: Container) -> bool:
        """``runtimeClassSupportsRecursiveReadOnlyMounts``: false without a RuntimeClass
        manager, when the class cannot be resolved, or when the runtime does not list the
        handler as supporting it (asked only for a container that asks for it)."""
        if self.deps.runtime_classes is None or self.deps.network is None or not any(
                m.recursive_read_only in ("IfPossible", "Enabled") for m in spec.volume_mounts):
            return False
        try:
            handler = self.runtime_handler()
        except RuntimeClassError:
            return False
        return supports_rro(handler, self.deps.network.handlers(self.deps.cri))

    def target_id(self, action: StartAction, spec: Container) -> str | None:
        """An ephemeral container's ``targetContainerName`` as a runtime ID ("" none; None:
        the target has no container, CreateContainerConfigError as the kubelet's)."""
        name = self.targets.get(spec.name, "") if action.ephemeral else ""
        if not name:
            return ""
        found = self.rt.latest(name)
        if found is None:
            self.fail(spec.name, CREATE_CONTAINER_CONFIG_ERROR,
                      f"unable to find target container {name}")
            return None
        return found.id

    def termination_log(self, spec: Container) -> Path | None:
        """The container instance's termination-log file (mounted on its
        ``terminationMessagePath``); None (no mount, as the kubelet) when it cannot be made."""
        if not spec.termination_message_path:
            return None
        try:
            return cri_config.termination_log_file(self.deps.pods_dir, self.pod.uid, spec.name,
                                                   secrets.token_hex(4))
        except OSError as err:
            self.deps.log.warning("syncloop.container.termination_log_failed",
                                  pod=self.pod.full_name, pod_uid=self.pod.uid,
                                  container=spec.name, error=str(err))
            return None

    def post_start(self, action: StartAction, spec: Container, cid: str) -> bool:
        """Run the container's postStart hook; on failure kill the container (its preStop
        and grace as for any kill) and report PostStartHookError (FailedPostStartHook)."""
        hook = spec.lifecycle.post_start
        if hook is None:
            return True
        deps = self.deps
        why = run_hook(deps.cri, cid, HookTarget.of(self.pod, spec), hook, self.pod_ips,
                       deps.sleep)
        if why is None:
            return True
        deps.log.warning("syncloop.container.poststart_failed", pod=self.pod.full_name,
                         pod_uid=self.pod.uid, container=spec.name, container_id=cid,
                         message=why)
        info = ContainerInfo(cid, spec.name, self.sandbox_id, ContainerState.RUNNING, "",
                             action.restart_count, 0)
        try:
            kill_containers(deps.cri, deps.log, self.pod, [info],
                            self.pod.spec.termination_grace_period_seconds, deps.sleep,
                            deps.mono)
        except CriError as err:
            deps.log.warning("syncloop.container.kill_failed", pod=self.pod.full_name,
                             pod_uid=self.pod.uid, container=spec.name, error=err.message)
        self.effects[cid] = Effect.STOPPED
        self.waiting[spec.name] = Waiting(POST_START_HOOK_ERROR, why)
        self.errors.append(f"{spec.name}: {POST_START_HOOK_ERROR}: {why}")
        return False

    def remove_lost(self, action: StartAction, spec: Container) -> bool:
        """Remove the container whose attempt was lost (attempts.py ``lost_attempt``): it holds
        the name of the attempt created again in its place."""
        try:
            self.deps.cri.remove_container(action.replaces)
        except CriError as err:
            if not err.not_found:
                self.fail_call(spec.name, CREATE_CONTAINER_ERROR, err)
                return False
        self.effects[action.replaces] = Effect.REMOVED
        self.deps.log.info("syncloop.container.replace", pod=self.pod.full_name,
                           pod_uid=self.pod.uid, container=spec.name,
                           container_id=action.replaces, restart_count=action.restart_count,
                           reason="its attempt was lost")
        return True

    def retry_soon(self) -> None:
        self.retry_after = min(self.retry_after or IN_FLIGHT_RETRY, IN_FLIGHT_RETRY)

    def start_created(self, action: StartAction, spec: Container) -> bool:
        """Start a container created earlier and never started. Its earlier start may have
        been cut off by the runtime's crash, and containerd then refuses every start of it
        (the task "already exists", its bundle or its fifos are half there): a start of it
        that fails here, unless the runtime is down, is not held against the pod. When the
        runtime then says the container exited without ever running, it is replaced at once
        by the same attempt, and only that one's failure counts. When it does not (the start
        of a killed sync loop is still running in the runtime), the pod is synced again soon.
        """
        cid = action.container_id
        self.effects[cid] = Effect.STARTED
        self.deps.log.info("syncloop.container.resume", pod=self.pod.full_name,
                           pod_uid=self.pod.uid, container=spec.name, container_id=cid,
                           reason="created and never started")
        try:
            self.deps.cri.start_container(cid)
        except CriError as err:
            if not err.unavailable:
                if self.never_ran(cid):
                    self.deps.log.info("syncloop.container.resume_failed",
                                       pod=self.pod.full_name, pod_uid=self.pod.uid,
                                       container=spec.name, container_id=cid,
                                       error=err.message)
                    return self.start(replace(action, container_id="", replaces=cid), spec)
                self.retry_soon()
            self.fail_call(spec.name, RUN_CONTAINER_ERROR, err)
            return False
        return self.started(action, spec, cid)

    def never_ran(self, cid: str) -> bool:
        """The runtime says the container exited without ever running (its start failed)."""
        try:
            status = self.deps.cri.container_status(cid)
        except CriError:
            return False
        return status.state == pb.CONTAINER_EXITED and status.started_at <= 0

    def start_container(self, action: StartAction, spec: Container, cid: str) -> bool:
        try:
            self.deps.cri.start_container(cid)
        except CriError as err:
            self.fail_call(spec.name, RUN_CONTAINER_ERROR, err)
            return False
        return self.started(action, spec, cid)

    def started(self, action: StartAction, spec: Container, cid: str) -> bool:
        deps = self.deps
        self.waiting.pop(spec.name, None)
        deps.started()
        deps.log.info("syncloop.container.started", pod=self.pod.full_name, pod_uid=self.pod.uid,
                      container=spec.name, container_id=cid, restart_count=action.restart_count,
                      state_from_event=self.from_event)
        return self.post_start(action, spec, cid)


def _sandbox_key(uid: str, sandbox_id: str) -> tuple[str, str]:
    return uid, "sandbox:" + sandbox_id


def sandbox_wait(deps: SyncDeps, uid: str, now: float) -> Callable[[str], float]:
    """Seconds each sandbox's stop still backs off (``compute_pod_actions``' view)."""

    def wait(sandbox_id: str) -> float:
        key = _sandbox_key(uid, sandbox_id)
        entry = deps.sandbox_backoff.entry(key)
        if entry is None:
            return 0.0
        return deps.sandbox_backoff.remaining(key, entry.last_update, now)
    return wait


def _remove_sandboxes(deps: SyncDeps, pod: Pod, ids: Collection[str]) -> float | None:
    """Stop and remove each dead sandbox; a failure is logged and backs off (never raised).
    Returns the seconds until the earliest retry (None: every one went)."""
    retry: float | None = None
    for sid in ids:
        key = _sandbox_key(pod.uid, sid)
        try:
            deps.cri.stop_pod_sandbox(sid)
            deps.cri.remove_pod_sandbox(sid)
        except CriError as err:
            if err.not_found:
                deps.sandbox_backoff.forget_key(key)
                continue
            now = deps.mono()
            delay = deps.sandbox_backoff.record_restart(key, now, now)
            retry = delay if retry is None else min(retry, delay)
            deps.log.warning("syncloop.sandbox.stop_failed", pod=pod.full_name, pod_uid=pod.uid,
                             sandbox_id=sid, error=err.message, retry_in=round(delay, 1))
            continue
        deps.sandbox_backoff.forget_key(key)
        deps.log.info("syncloop.sandbox.removed", pod=pod.full_name, pod_uid=pod.uid,
                      sandbox_id=sid)
    return retry


def _prune_dead(deps: SyncDeps, rt: PodRuntime, names: Collection[str],
                effects: dict[str, Effect]) -> None:
    """Remove exited containers of ``names`` beyond the newest dead one (container GC)."""
    dead_seen: dict[str, int] = {}
    for c in rt.containers:
        if c.name not in names or c.state is ContainerState.RUNNING:
            continue
        dead_seen[c.name] = dead_seen.get(c.name, 0) + 1
        if dead_seen[c.name] > KEEP_DEAD_PER_CONTAINER:
            try:
                deps.cri.remove_container(c.id)
                effects[c.id] = Effect.REMOVED
            except CriError as err:
                deps.log.warning("syncloop.container.remove_failed", container_id=c.id,
                                 error=err.message)


def _has_api_volumes(deps: SyncDeps, pod: Pod) -> bool:
    return deps.objects is not None and any(isinstance(v.source, ApiVolume)
                                            for v in pod.spec.volumes)


def _refresh_api_volumes(deps: SyncDeps, pod: Pod) -> None:
    """An existing pod's configMap/secret/projected files follow their API objects (each
    sync; unchanged files are left alone)."""
    if deps.objects is None or not _has_api_volumes(deps, pod):
        return
    for name, why in volumes.refresh_api_volumes(pod, deps.pods_dir, deps.node, deps.wall(),
                                                 deps.objects).items():
        deps.log.warning("syncloop.volume.refresh_failed", pod=pod.full_name,
                         pod_uid=pod.uid, volume=name, message=why)


def _kill_by_grace(deps: SyncDeps, pod: Pod, by_grace: Mapping[int, list[ContainerInfo]]) -> None:
    """Each group with its grace, all at once (as one ``kill_containers`` stops its containers
    in parallel); the first CriError is raised after all were tried."""
    errors: list[CriError] = []

    def group(seconds: int, victims: list[ContainerInfo]) -> None:
        try:
            kill_containers(deps.cri, deps.log, pod, victims, seconds, deps.sleep, deps.mono)
        except CriError as err:
            errors.append(err)

    groups = sorted(by_grace.items())
    threads = [threading.Thread(target=group, args=g, daemon=True) for g in groups[1:]]
    for t in threads:
        t.start()
    if groups:
        group(*groups[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def execute(deps: SyncDeps, pod: Pod, rt: PodRuntime, actions: PodActions,
            from_event: bool = False) -> SyncResult:
    run = _Run(deps, pod, actions, rt)
    run.from_event = from_event
    grace = (actions.kill_grace if actions.kill_grace is not None
             else pod.spec.termination_grace_period_seconds)
    if actions.kill:  # first: a container killed after a failed probe gets the probe's grace
        reasons = {k.container_id: k for k in actions.kill}
        by_grace: dict[int, list[ContainerInfo]] = {}
        for c in rt.containers:
            if c.id in reasons:
                k = reasons[c.id]
                by_grace.setdefault(kill_grace(pod, k.name, k.reason), []).append(c)
        _kill_by_grace(deps, pod, by_grace)
        run.effects.update((c.id, Effect.STOPPED) for cs in by_grace.values() for c in cs)
    if actions.kill_pod:
        rest = tuple(c for c in rt.running() if c.id not in run.effects)
        kill_containers(deps.cri, deps.log, pod, rest, grace, deps.sleep, deps.mono,
                        ordered=True)
        run.effects.update((c.id, Effect.STOPPED) for c in rest)
        for s in rt.sandboxes:
            if s.ready:
                deps.cri.stop_pod_sandbox(s.id)
    retry = _remove_sandboxes(deps, pod, actions.remove_sandboxes)
    if retry is not None:
        run.retry_after = retry if run.retry_after is None else min(run.retry_after, retry)
    network = (deps.network.not_ready(deps.cri)
               if deps.network is not None and actions.create_sandbox
               and not pod.spec.host_network else None)
    if network is not None:
        message = not_ready_error(network)
        return SyncResult(ok=False, errors=(message,), waiting=run.waiting,
                          sandbox_id=run.sandbox_id or None, retry_after=run.retry_after,
                          effects=run.effects, acted=True, network_error=message)
    if not actions.create_sandbox and run.sandbox_id:
        _refresh_api_volumes(deps, pod)
    if not actions.create_sandbox or run.create_sandbox():
        specs = {c.name: c for c in pod.all_containers()}
        specs.update((e.name, e.container) for e in pod.spec.ephemeral_containers)
        _prune_dead(deps, rt, [a.name for a in actions.start], run.effects)
        for action in actions.start:
            # a regular init container that fails to start stops the pod's starts; an
            # ephemeral container or a sidecar does not (the kubelet skips it and goes on)
            if not run.start(action, specs[action.name]) and action.init and \
                    not action.sidecar:
                break
    return SyncResult(ok=not run.errors, errors=tuple(run.errors), waiting=run.waiting,
                      sandbox_id=run.sandbox_id or None, retry_after=run.retry_after,
                      pod_failed=actions.pod_failed, effects=run.effects, acted=True,
                      deadline_exceeded=actions.deadline_exceeded,
                      runtime_down=run.runtime_down)


def read_runtime(deps: SyncDeps, uid: str, newer_than: float | None) -> PodRuntime:
    """The pod's runtime state: fresh (``newer_than`` None) or from the shared listing when it
    started at or after ``newer_than``. The status of a running container is read only when
    its crash back-off entry must be rebuilt from its start time (after a sync loop restart)."""

    def running_status(name: str, restart_count: int) -> bool:
        return restart_count > 0 and deps.backoff.entry((uid, name)) is None

    if newer_than is None or deps.cache is None:
        return read_pod_runtime(deps.cri, uid, deps.mono, deps.wall, running_status)
    return deps.cache.pod(uid, newer_than, running_status)


def _event_runtime(deps: SyncDeps, pod: Pod, snapshot: EventSnapshot) -> PodRuntime | None:
    names = [c.name for c in pod.all_containers()]
    rt, why = runtime_from_event(snapshot, names, deps.mono(), deps.wall())
    if rt is None:
        deps.log.debug("syncloop.pod.event_state_unused", pod_uid=pod.uid, reason=why)
    return rt


class _WouldCall(Exception):
    """A quiet resync needed a CRI call: it goes to a pool thread instead."""


class _NoCalls:
    """The CRI client of a quiet resync: any call means "not quiet"."""

    def container_status(self, container_id: str) -> pb.ContainerStatus:
        raise _WouldCall


_NO_CALLS: RuntimeClient = cast(RuntimeClient, _NoCalls())


def quiet_resync(deps: SyncDeps, pod: Pod, liveness_failed: Collection[str],
                 newer_than: float, started: Collection[str] = (),
                 active_since: float | None = None, failed: bool = False,
                 fail_grace: int | None = None) -> SyncResult | None:
    """A SyncPod that needs no CRI call, on the caller's (the loop's) thread: the shared listing
    is usable for ``newer_than`` as it is, no ContainerStatus is needed and the actions are
    none. The kubelet's periodic resync of a running pod, without two thread hand-offs. None:
    it needs the runtime, hand it to a pool thread (``sync_pod``)."""
    if deps.cache is None or _has_api_volumes(deps, pod):
        return None  # API volumes are refreshed on a pool thread (``sync_pod``)
    listing = deps.cache.peek(pod.uid, newer_than)
    if listing is None:
        return None
    uid = pod.uid

    def running_status(name: str, restart_count: int) -> bool:
        return restart_count > 0 and deps.backoff.entry((uid, name)) is None

    try:
        rt = pod_runtime(_NO_CALLS, listing[0], listing[1], deps.mono, deps.wall,
                         running_status)
    except _WouldCall:
        return None
    if not failed and not resize_plan(deps.allocation, pod, rt).empty:
        return None  # a resize to apply: the runtime is called
    actions = _pod_actions(deps, pod, rt, liveness_failed, started, active_since, failed,
                           fail_grace)
    if not actions.noop:
        return None
    if failed and not rt.running():
        volumes.release_empty_dirs(pod, deps.pods_dir)
    return SyncResult(ok=True, waiting=actions.waiting,
                      sandbox_id=rt.sandboxes[0].id if rt.sandboxes else None,
                      retry_after=actions.retry_after, pod_failed=actions.pod_failed,
                      deadline_exceeded=actions.deadline_exceeded,
                      resize=report(deps.allocation, pod, rt))


def deadline_left(pod: Pod, rt: PodRuntime, active_since: float | None, now: float,
                  wall: float) -> float | None:
    """Seconds until the pod's ``activeDeadlineSeconds`` runs out (<= 0: it has; None: no
    deadline). The kubelet counts from the pod's ``status.startTime``; the sync loop from when
    its worker first saw the pod (``active_since``, monotonic), or from the pod's oldest
    sandbox when the runtime shows an older one (a restarted sync loop keeps the deadline)."""
    seconds = pod.spec.active_deadline_seconds
    if seconds is None or active_since is None:
        return None
    start = active_since
    for sb in rt.sandboxes:
        if sb.created_at > 0:
            start = min(start, now - (wall - sb.created_at / 1e9))
    return start + seconds - now


def _pod_actions(deps: SyncDeps, pod: Pod, rt: PodRuntime, liveness_failed: Collection[str],
                 started: Collection[str], active_since: float | None, failed: bool = False,
                 fail_grace: int | None = None, resize: ResizePlan = NO_RESIZE) -> PodActions:
    """``failed``: the pod was failed for good (``SyncLoop.fail_pod``), its containers stopped
    within ``fail_grace`` (None: the pod's own); past its ``activeDeadlineSeconds`` it is too,
    and the actions say so (``deadline_exceeded``) so the loop fails it."""
    now = deps.mono()
    left = deadline_left(pod, rt, active_since, now, deps.wall())
    deadline = not failed and left is not None and left <= 0
    actions = compute_pod_actions(pod, rt, now, deps.backoff, liveness_failed,
                                  sandbox_wait=sandbox_wait(deps, pod.uid, now),
                                  started=started, failed=failed or deadline,
                                  resize_restart=resize.restart)
    if failed or deadline:
        return replace(actions, deadline_exceeded=deadline,
                       kill_grace=fail_grace if failed else None)
    if left is not None and left > 0 and (actions.retry_after is None
                                          or left < actions.retry_after):
        actions = replace(actions, retry_after=left)  # sync again when the deadline comes
    return actions


def sync_pod(deps: SyncDeps, pod: Pod, liveness_failed: Collection[str] = (),
             newer_than: float | None = None,
             snapshot: EventSnapshot | None = None, started: Collection[str] = (),
             active_since: float | None = None, failed: bool = False,
             fail_grace: int | None = None) -> SyncResult:
    """One SyncPod. Raises CriError when the runtime cannot be read or a pod-level call fails.
    ``newer_than``: see ``read_runtime``; ``snapshot``: the triggering event, used as the
    runtime state when ``runtime_from_event`` allows it; ``started``: IDs of containers whose
    startup probe succeeded; ``active_since``: when the worker first saw the pod (monotonic;
    the start of ``activeDeadlineSeconds``); ``failed``: the pod was failed for good
    (``SyncLoop.fail_pod``): stop everything within ``fail_grace`` (None: the pod's own)."""
    rt = _event_runtime(deps, pod, snapshot) if snapshot is not None else None
    from_event = rt is not None
    if rt is None:
        rt = read_runtime(deps, pod.uid, newer_than)
    _seed_backoff(deps, pod, rt)
    todo = resize_plan(deps.allocation, pod, rt) if not failed else NO_RESIZE
    actions = _pod_actions(deps, pod, rt, liveness_failed, started, active_since, failed,
                           fail_grace, todo)
    resize_error = ""
    if not todo.empty and deps.allocation is not None and not actions.kill_pod \
            and not actions.create_sandbox:
        resize_error = apply_updates(deps.cri, deps.allocation, deps.cgroups, deps.log, pod,
                                     todo, lambda: deps.crash.hit("resize.after_update"))
    if actions.noop:
        sandbox = rt.sandboxes[0].id if rt.sandboxes else None
        if sandbox is not None and not actions.failed:
            _refresh_api_volumes(deps, pod)
        if failed and not rt.running():
            volumes.release_empty_dirs(pod, deps.pods_dir)
        return SyncResult(ok=not resize_error, errors=(resize_error,) if resize_error else (),
                          waiting=actions.waiting, sandbox_id=sandbox,
                          retry_after=actions.retry_after, pod_failed=actions.pod_failed,
                          deadline_exceeded=actions.deadline_exceeded, acted=bool(todo.update),
                          resize=report(deps.allocation, pod, rt, resize_error))
    deps.log.debug("syncloop.pod.actions", pod=pod.full_name, pod_uid=pod.uid,
                   kill_pod=actions.kill_pod, create_sandbox=actions.create_sandbox,
                   kill=[k.name for k in actions.kill], start=[s.name for s in actions.start],
                   remove_sandboxes=list(actions.remove_sandboxes))
    result = execute(deps, pod, rt, actions, from_event)
    if deps.allocation is None:
        return result
    if resize_error:
        result = replace(result, ok=False, errors=(*result.errors, resize_error))
    return replace(result, resize=report(deps.allocation, pod, rt, resize_error,
                                         result.effects))
