"""The embedded runtime's core: sandboxes and containers, their states, durability and events.

No gRPC here (the servicer translates). Thread-safety: every public method may be called from
any gRPC worker thread; one lock guards the two maps, and waits (stop) happen outside it on a
condition variable that the exit watcher notifies.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as pb

from podvisor.common import labels
from podvisor.common.crashpoints import NEVER, CrashPoints
from podvisor.common.logs import Log as Logger
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.maps import HOST_NETWORK_REASON
from podvisor.services.runtime import convert, images, oom
from podvisor.services.runtime.cgroups import DEFAULT_PARENT, Cgroups, host_layout
from podvisor.services.runtime.cni import Attachment, Cni, CniError, PortMapping
from podvisor.services.runtime.events import EventBroadcaster
from podvisor.services.runtime.faults import Fault, invalid, not_found, precondition
from podvisor.services.runtime.index import ID_LENGTH, Index, sandbox_name
from podvisor.services.runtime.model import (
    Container,
    ContainerState,
    ExitInfo,
    Sandbox,
    SandboxNetwork,
    SandboxState,
    StartInfo,
)
from podvisor.services.runtime.monitor import LOG_FLAGS, mount_setattr_works
from podvisor.services.runtime.native import monitor_binary
from podvisor.services.runtime.procfs import group_members, is_alive, signal_group
from podvisor.services.runtime.seccomp import SeccompSupport, python_seccomp
from podvisor.services.runtime.security import (
    NO_SECCOMP,
    container_security,
    read_host,
    sandbox_security,
)
from podvisor.services.runtime.store import Loaded, Store
from podvisor.services.runtime.watcher import ExitWatcher, bind_exit_socket
from podvisor.services.runtime.zygote import (
    Spawner,
    SpawnError,
    seccomp_fields,
    wait_readable,
)

KILL_WAIT = 10.0  # seconds to wait for a container to die after SIGKILL
MAX_SOCKET_PATH = 107  # sockaddr_un.sun_path, less its terminating NUL
SETTLE_TIMEOUT = 10.0  # seconds a restarted runtime waits for a start in flight (``_settle``)

# The crash points of the engine (common/crashpoints.py; "runtime:<step>"), in the order of the
# CRI calls' paths; docs/ARCHITECTURE.md "Exactly once" says what recovery does after each.
STEPS = (
    "sandbox.before_record", "sandbox.after_record",
    "create.before_record", "create.after_record",
    "start.before_intent", "start.after_intent", "start.after_send", "start.after_reply",
    "stop.after_signal", "stop.after_exit",
    "remove.after_stop", "remove.after_cgroups", "remove.after_record",
    "stop_sandbox.after_record",
    "remove_sandbox.after_containers", "remove_sandbox.after_record",
)
# The pod network's steps (``networkPlugin: cni``; cni.py), tested apart from ``STEPS`` in
# tests/services/runtime/test_embedded_network.py.
NETWORK_STEPS = (
    "network.after_record", "network.after_setup",
    "network.before_teardown", "network.after_teardown",
)


TERMINATION_LOG_NOT_MOUNTED = (
    "termination message not collected: the embedded runtime runs without root, so "
    "terminationMessagePath was not mounted")


def without_termination_log(st: pb.ContainerStatus) -> pb.ContainerStatus:
    """The status of a container whose termination-log file this runtime did not mount (it
    runs without root: ``Engine._mountable``): that mount is not listed (it was not made), and
    once exited its message says why there is no file's text (the kubelet then shows the
    runtime's message, or with FallbackToLogsOnError the log's tail after it), never silently."""
    path = st.annotations.get(labels.TERMINATION_MESSAGE_PATH, "")
    if not path or not any(m.container_path == path for m in st.mounts):
        return st
    out = pb.ContainerStatus()
    out.CopyFrom(st)
    del out.mounts[:]
    out.mounts.extend(m for m in st.mounts if m.container_path != path)
    if out.state == pb.CONTAINER_EXITED:
        out.message = "; ".join(x for x in (st.message, TERMINATION_LOG_NOT_MOUNTED) if x)
    return out


class Engine:
    def __init__(self, root: Path, log: Logger, wall: Callable[[], int] = SYSTEM_CLOCK.wall_ns,
                 cgroups: Cgroups | None = None,
                 registries: Mapping[str, Any] | None = None,
                 crash: CrashPoints = NEVER, cni: Cni | None = None,
                 pod_network: bool = False) -> None:
        """``cgroups``: where container cgroups go (the host's hierarchies by default);
        ``registries``: the ``imageRegistries`` settings; ``crash``: fault-injection tests'
        crash points (``STEPS``, ``NETWORK_STEPS``); ``cni``: the pod network's plugins
        (cleanup of what earlier sandboxes made, whatever the mode); ``pod_network``: sandboxes
        that ask for their own network get a namespace and CNI (``networkPlugin: cni``),
        else they share the node's (``networkPlugin: host``)."""
        self.crash = crash
        self.cni = cni
        self.pod_network = pod_network and cni is not None
        self.store = Store(root)
        self.images = images.Images(root / "images", registries, wall)
        self._rootfs_root = root / "rootfs"
        self._attach_dir = root / "a"  # attach sockets of containers with stdin (monitor.c)
        self.cgroups = cgroups if cgroups is not None else Cgroups(host_layout())
        self.log = log
        self.wall = wall
        self.events = EventBroadcaster()
        self._lock = threading.RLock()
        self._exited = threading.Condition(self._lock)
        self._sandboxes: dict[str, Sandbox] = {}
        self._containers: dict[str, Container] = {}
        self._starting: set[str] = set()
        self._early_exits: dict[str, ExitInfo] = {}  # exit notes that beat the start's reply
        self._specs: dict[str, bytes] = {}  # container id -> what its monitor runs (JSON)
        self._statuses: dict[str, tuple[Container, pb.ContainerStatus]] = {}
        self._index = Index()
        self._exit_socket = root / "exits.sock"
        self._spawner = Spawner(crash=crash)
        self._host = read_host()  # the ids and capabilities containers can be given
        self._seccomp = NO_SECCOMP  # whether the monitors load seccomp filters (start())
        self.rro = mount_setattr_works()  # recursive read-only mounts (runtime_handlers)
        self._watcher = ExitWatcher(self._on_monitor_exit, self._on_exit_note)

    # --- lifecycle ---
    def start(self) -> None:
        """Load state from disk and re-adopt running containers (same IDs, pids, start times)."""
        self._attach_dir.mkdir(mode=0o700, exist_ok=True)
        loaded = self.store.load()
        for problem in loaded.problems:
            self.log.warning("runtime.store.problem", detail=problem)
        for note in loaded.notes:
            self.log.info("runtime.store.imported", detail=note)
        for sb in self._recover_networks(loaded.sandboxes):
            self._sandboxes[sb.id] = sb
            self._index.add_sandbox(sb)
        sock = bind_exit_socket(self._exit_socket)
        if sock is not None:
            self._watcher.listen(sock)
            self._spawner.notify = str(self._exit_socket)
        self._watcher.start()
        native = monitor_binary()
        self._spawner.monitor_exe = str(native.path or "")
        self._seccomp = (SeccompSupport(native.seccomp, native.seccomp_why) if native.path
                         else python_seccomp())
        if not self._seccomp.ok:
            self.log.warning("runtime.seccomp.unavailable", reason=self._seccomp.why,
                             detail="containers that ask for a seccomp profile are refused")
        # monitors outlive the agent: they must not hold its stdout/stderr (a pipe to `tee` or
        # a caller reading `podvisor run --runonce` would stay open while any pod runs)
        self._spawner.stderr_path = str(self._exit_socket.with_name("monitors.log"))
        if native.path is None:
            self.log.warning("runtime.monitor.python", reason=native.why,
                             detail="container monitors run the Python monitor "
                                    "(~1.8 MB more private memory each)")
        self._specs.update(loaded.specs)
        self._settle(loaded)
        for i, c in enumerate(loaded.containers):
            if c.exited is not None:  # exited while the runtime was down
                loaded.containers[i] = c = replace(c, exited=self._exit_reason(c.id, c.exited))
        for c in loaded.containers:
            self._containers[c.id] = c
            self._index.add_container(c)
            if c.state is ContainerState.RUNNING and c.started is not None:
                self._watcher.watch(c.id, c.started.monitor_pid, c.started.monitor_ticks)
        self._spawner.start()
        self._sweep_rootfs()
        self.log.info("runtime.adopted", sandboxes=len(self._sandboxes),
                      containers=len(self._containers),
                      running=sum(c.state is ContainerState.RUNNING
                                  for c in self._containers.values()))

    def _settle(self, loaded: Loaded) -> None:
        """Starts the previous runtime left in flight: the start's intent is journaled (the
        monitor it went to), and neither started.json nor exit.json exists. Before anything is
        served, wait for each such monitor to record the start (the container is then adopted:
        RUNNING, or EXITED when it already ended) or to be gone without recording it (nothing
        runs: the monitor never took the request, its start failed, or it died and its
        container with it, ``die_with_monitor``; the container stays CREATED and may be
        started again). A monitor that settles nothing within ``SETTLE_TIMEOUT`` is killed
        (its container dies with it) and judged the same way. So every container process the
        runtime ever started is in the record the clients will find, or is gone, before the
        first CRI call is answered (docs/ARCHITECTURE.md, "Exactly once")."""
        pending = {c.id: loaded.starting[c.id] for c in loaded.containers
                   if c.started is None and c.exited is None and c.id in loaded.starting}
        if not pending:
            return
        self.log.info("runtime.start.settling", containers=sorted(pending))
        settled: dict[str, StartInfo | None] = {}
        deadline = SYSTEM_CLOCK.monotonic() + SETTLE_TIMEOUT
        pause = 0.001
        while pending:
            for cid, (pid, ticks) in list(pending.items()):
                alive = is_alive(pid, ticks)  # first: a monitor found gone wrote all it will
                started = self.store.read_started(cid)
                if started is not None or not alive:
                    settled[cid] = started
                    del pending[cid]
            if not pending:
                break
            if SYSTEM_CLOCK.monotonic() > deadline:
                for cid, (pid, ticks) in pending.items():
                    self.log.warning("runtime.start.settle_timeout", container=cid,
                                     monitor_pid=pid, timeout=SETTLE_TIMEOUT)
                    _kill_and_wait(pid, ticks)
                    settled[cid] = self.store.read_started(cid)
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        for i, c in enumerate(loaded.containers):
            if c.id not in settled:
                continue
            started = settled[c.id]
            if started is None:
                self.log.info("runtime.start.abandoned", container=c.id,
                              detail="its monitor is gone and never started it: created")
                continue
            exited = self.store.read_exit(c.id)
            loaded.containers[i] = replace(c, started=started, exited=exited)
            self.log.info("runtime.start.adopted", container=c.id, pid=started.pid,
                          exited=exited is not None)

    def _recover_networks(self, sandboxes: list[Sandbox]) -> list[Sandbox]:
        """After a crash: a sandbox journaled before its network setup finished was never
        answered: its record goes (its name is free again, as if RunPodSandbox never ran), and
        every network no ready sandbox owns (such a setup, a teardown cut short, anything a
        killed runtime left in ``network/`` or ``netns/``) is torn down (cni.py)."""
        kept: list[Sandbox] = []
        for sb in sandboxes:
            if (sb.network is not None and not sb.network.ready
                    and sb.state is SandboxState.READY):
                self.store.delete_sandbox(sb.id)
                self.log.info("runtime.network.abandoned", sandbox=sb.id,
                              detail="its network setup never finished: removed")
                continue
            kept.append(sb)
        if self.cni is None:
            return kept
        owned = {sb.id for sb in kept if sb.state is SandboxState.READY
                 and sb.network is not None and sb.network.ready}
        for sandbox_id in sorted(self.cni.attached() - owned):
            try:
                self.cni.teardown(sandbox_id)
                self.log.info("runtime.network.swept", sandbox=sandbox_id)
            except (CniError, OSError) as err:
                self.log.warning("runtime.network.sweep_failed", sandbox=sandbox_id,
                                 error=str(err))
        return kept

    def network_condition(self) -> pb.RuntimeCondition:
        """CRI Status's NetworkReady: with ``networkPlugin: host`` ready, reason
        ``HostNetwork`` (every pod in the node's network: /healthz and the Node say so); with
        ``cni`` ready when the plugins can run, else containerd's reason and wording."""
        if not self.pod_network or self.cni is None:
            return pb.RuntimeCondition(
                type="NetworkReady", status=True, reason=HOST_NETWORK_REASON,
                message="networkPlugin: host: pods share the node's network (its IP and one "
                        "port space); set networkPlugin: cni for a network per pod")
        problem = self.cni.problem()
        if problem:
            return pb.RuntimeCondition(type="NetworkReady", status=False,
                                       reason="NetworkPluginNotReady",
                                       message=f"Network plugin returns error: {problem}")
        return pb.RuntimeCondition(type="NetworkReady", status=True)

    def netns_of(self, sandbox_id: str) -> str:
        """The sandbox's network namespace ('' = the node's)."""
        net = self.sandbox(sandbox_id).network
        return net.netns if net is not None else ""

    def close(self) -> None:
        """Stop watching; running containers and their monitors keep running."""
        self.events.close_all()
        self._watcher.stop()
        self._spawner.close()
        self.store.close()

    # --- lookups ---
    def sandbox(self, sandbox_id: str) -> Sandbox:
        with self._lock:
            sb = self._sandboxes.get(sandbox_id)
        if sb is None:
            raise not_found("pod sandbox", sandbox_id)
        return sb

    def container(self, container_id: str) -> Container:
        with self._lock:
            c = self._containers.get(container_id)
        if c is None:
            raise not_found("container", container_id)
        return c

    def sandboxes(self) -> list[Sandbox]:
        with self._lock:
            return list(self._sandboxes.values())

    def containers(self) -> list[Container]:
        with self._lock:
            return list(self._containers.values())

    def containers_of(self, sandbox_id: str) -> list[Container]:
        with self._lock:
            return [self._containers[i] for i in self._index.by_sandbox.get(sandbox_id, ())]

    def find_sandboxes(self, id_prefix: str, pod_uid: str | None) -> list[Sandbox]:
        """Candidates for a filter, through the indexes (the caller applies the full filter):
        a full ID or the pod UID label narrow it to a few records instead of all."""
        with self._lock:
            if len(id_prefix) == ID_LENGTH:
                sb = self._sandboxes.get(id_prefix)
                return [sb] if sb is not None else []
            if pod_uid is not None:
                return [self._sandboxes[i] for i in self._index.sandboxes_by_uid.get(pod_uid, ())]
            return list(self._sandboxes.values())

    def find_containers(self, id_prefix: str, sandbox_id: str,
                        pod_uid: str | None) -> list[Container]:
        """Like ``find_sandboxes``: by full ID, full sandbox ID or pod UID label, else all."""
        with self._lock:
            if len(id_prefix) == ID_LENGTH:
                c = self._containers.get(id_prefix)
                return [c] if c is not None else []
            if len(sandbox_id) == ID_LENGTH:
                ids: Iterable[str] = self._index.by_sandbox.get(sandbox_id, ())
            elif pod_uid is not None:
                ids = self._index.containers_by_uid.get(pod_uid, ())
            else:
                return list(self._containers.values())
            return [self._containers[i] for i in ids]

    # --- sandboxes ---
    def runtime_handlers(self) -> list[pb.RuntimeHandler]:
        """CRI Status's ``runtime_handlers``: the default "" and its named alias ``podvisor``
        (what a RuntimeClass's ``handler`` names: a DNS label cannot be ""), alike; recursive
        read-only mounts when the kernel has ``mount_setattr`` (Linux 5.12)."""
        features = pb.RuntimeHandlerFeatures(recursive_read_only_mounts=self.rro)
        return [pb.RuntimeHandler(name=h, features=features) for h in HANDLERS]

    def run_sandbox(self, config: pb.PodSandboxConfig, handler: str) -> str:
        md = config.metadata
        if not md.name or not md.namespace or not md.uid:
            raise invalid("sandbox config needs metadata.name, .namespace and .uid")
        if handler not in HANDLERS:  # containerd's words for a handler it is not configured for
            raise Fault(grpc.StatusCode.NOT_FOUND, f"failed to get sandbox runtime: no runtime "
                                                   f'for "{handler}" is configured')
        own_net = (self.cni is not None and self.pod_network
                   and config.linux.security_context.namespace_options.network != pb.NODE)
        sandbox_security(config, bool(own_net))
        name = sandbox_name(config)
        with self._lock:  # reserve the name; write the journal outside the lock
            holder = self._index.sandbox_names.get(name)
            if holder is not None:
                raise Fault(grpc.StatusCode.ALREADY_EXISTS,
                            f"sandbox name {md.name}_{md.namespace}_{md.uid}_{md.attempt} "
                            f"is reserved for {holder}")
            sb = Sandbox(secrets.token_hex(32), config, self.wall(), SandboxState.READY, handler)
            self._index.sandbox_names[name] = sb.id
        try:
            if own_net:
                sb = self._with_network(sb)
            else:
                self.crash.hit("sandbox.before_record")
                self.store.save_sandbox(sb)
        except BaseException:
            with self._lock:
                del self._index.sandbox_names[name]
            raise
        with self._lock:
            self._sandboxes[sb.id] = sb
            self._index.add_sandbox(sb)
        self.log.info("sandbox.created", pod=md.name, namespace=md.namespace, sandbox=sb.id)
        self.crash.hit("sandbox.after_record")
        return sb.id

    def _with_network(self, sb: Sandbox) -> Sandbox:
        """The sandbox's own network: journaled first (not yet ready: a crash from here on
        leaves a record the next start removes, and an attachment it tears down), then the
        namespace and CNI ADD (cni.py), then journaled ready with its IPs. A failed setup
        tears down what it made and removes the record."""
        assert self.cni is not None
        md = sb.config.metadata
        net = SandboxNetwork(str(self.cni.netns_path(sb.id)))
        self.store.save_sandbox(replace(sb, network=net))
        self.crash.hit("network.after_record")
        ports = tuple(PortMapping(p.host_port, p.container_port,
                                  pb.Protocol.Name(p.protocol).lower(), p.host_ip)
                      for p in sb.config.port_mappings if p.host_port > 0)
        try:
            ips = self.cni.setup(Attachment(sb.id, net.netns, md.name, md.namespace, md.uid,
                                            ports))
        except (CniError, OSError) as err:
            self.store.delete_sandbox(sb.id)
            self.log.warning("runtime.network.setup_failed", pod=md.name,
                             namespace=md.namespace, sandbox=sb.id, error=str(err))
            raise Fault(grpc.StatusCode.UNKNOWN, f"failed to setup network for sandbox "
                                                 f"{sb.id!r}: {err}") from None
        self.crash.hit("network.after_setup")
        sb = replace(sb, network=replace(net, ips=tuple(ips), ready=True))
        self.store.save_sandbox(sb)
        self.log.info("runtime.network.ready", pod=md.name, namespace=md.namespace,
                      sandbox=sb.id, ips=ips)
        return sb

    def _teardown_network(self, sb: Sandbox) -> None:
        """CNI DEL and the namespace (idempotent; cni.py). A failure fails the CRI call, which
        the sync loop retries, as containerd's StopPodSandbox does."""
        if sb.network is None or self.cni is None:
            return
        self.crash.hit("network.before_teardown")
        try:
            self.cni.teardown(sb.id)
        except (CniError, OSError) as err:
            raise Fault(grpc.StatusCode.UNKNOWN, f"failed to destroy network for sandbox "
                                                 f"{sb.id!r}: {err}") from None
        self.crash.hit("network.after_teardown")

    def stop_sandbox(self, sandbox_id: str) -> None:
        sb = self.sandbox(sandbox_id)
        for c in self.containers_of(sandbox_id):
            self.stop_container(c.id, 0)
        with self._lock:
            if sandbox_id in self._sandboxes and sb.state is SandboxState.READY:
                sb = replace(self._sandboxes[sandbox_id], state=SandboxState.NOTREADY)
                self.store.save_sandbox(sb)
                self._sandboxes[sandbox_id] = sb
        self.crash.hit("stop_sandbox.after_record")
        self._teardown_network(sb)  # after the record: a crash leaves it to the next start

    def remove_sandbox(self, sandbox_id: str) -> None:
        with self._lock:
            if sandbox_id not in self._sandboxes:
                return  # idempotent, as the CRI asks
        for c in self.containers_of(sandbox_id):
            self.remove_container(c.id)
        self.crash.hit("remove_sandbox.after_containers")
        self._teardown_network(self.sandbox(sandbox_id))
        with self._lock:
            sb = self._sandboxes.pop(sandbox_id, None)
            if sb is not None:
                self._index.remove_sandbox(sb)
            self.store.delete_sandbox(sandbox_id)
        self.log.info("sandbox.removed", sandbox=sandbox_id)
        self.crash.hit("remove_sandbox.after_record")

    # --- containers ---
    def _mountable(self, config: pb.ContainerConfig) -> list[pb.Mount]:
        """The config's mounts, less the kubelet's termination-log file when this runtime
        cannot make a mount namespace (not root): every container gets that mount, and
        without root a pod with no volumes must still run (the message is then not collected;
        said in the log, once per container, and in its status: ``without_termination_log``)."""
        if self._host.root:
            return list(config.mounts)
        path = config.annotations.get(labels.TERMINATION_MESSAGE_PATH, "")
        keep = [m for m in config.mounts if not path or m.container_path != path]
        if len(keep) != len(config.mounts):
            self.log.warning("runtime.container.termination_log_skipped",
                             container=config.metadata.name, path=path,
                             reason="the embedded runtime runs without root: no mount "
                                    "namespace for the termination-log file; the container's "
                                    "termination message is not collected")
        return keep

    def create_container(self, sandbox_id: str, config: pb.ContainerConfig) -> str:
        sb = self.sandbox(sandbox_id)
        if sb.state is not SandboxState.READY:
            raise precondition(f"pod sandbox {sandbox_id} is not ready")
        md = config.metadata
        if not md.name:
            raise invalid("container config needs metadata.name")
        image = self.images.require(config.image.image)
        rec = self.images.record(config.image.image)
        if rec is None:
            argv = list(config.command) + list(config.args)
            if not argv:
                raise invalid(f"container {md.name!r}: no command (image 'host' has no "
                              "entrypoint)")
            env = dict(images.HOST_ENV)
            cwd = config.working_dir or images.HOST_WORKDIR
        else:
            if not self._host.root:
                raise precondition(
                    f"container {md.name!r}: image {config.image.image!r} runs in its own root "
                    f"filesystem (overlay mount, pivot_root), which needs root; the embedded "
                    f"runtime runs as uid {self._host.euid}. Use image 'host' or run podvisor "
                    "as root")
            argv = image_argv(rec.config, list(config.command), list(config.args))
            if not argv:
                raise invalid(f"container {md.name!r}: no command, and image "
                              f"{config.image.image!r} has no Entrypoint nor Cmd")
            env = dict(kv.split("=", 1) for kv in rec.config.get("Env") or [] if "=" in kv)
            cwd = config.working_dir or str(rec.config.get("WorkingDir") or "/")
        for kv in config.envs:
            if not kv.key or "=" in kv.key or "\0" in kv.key + kv.value:
                raise invalid(f"container {md.name!r}: bad environment variable {kv.key[:64]!r}")
            env[kv.key] = kv.value
        log_path = _log_path(sb.config.log_directory, config.log_path)
        doc: dict[str, Any] = {"argv": argv, "env": [f"{k}={v}" for k, v in env.items()],
                               "cwd": cwd, "log_path": log_path}
        mounts = _mounts(md.name, self._mountable(config))
        mounts += _devices(md.name, config.devices, rec is not None)
        if mounts:
            doc["mounts"] = mounts
        if (config.linux.security_context.privileged
                and not sb.config.linux.security_context.privileged):
            raise invalid(f"container {md.name!r}: no privileged container allowed in sandbox "
                          "(the sandbox is not privileged; containerd's rule)")
        doc["security"] = container_security(config, self._host, self._seccomp)
        if rec is not None:
            sc = config.linux.security_context
            if not sc.HasField("run_as_user") and not sc.run_as_username:
                ids = image_user(rec.config, [self.images.store.layer_dir(d)
                                              for d in reversed(rec.layers)])
                if ids is None:
                    raise invalid(f"container {md.name!r}: image user "
                                  f"{rec.config.get('User')!r} is not in the image's /etc/passwd")
                if ids[0] >= 0:
                    doc["security"]["uid"] = ids[0]
                    if not sc.HasField("run_as_group"):
                        doc["security"]["gid"] = ids[1]
                    doc["security"]["groups"] = [ids[1]]
            doc["rootfs"] = {"layers": rec.layers, "lower": [
                str(self.images.store.layer_dir(d)) for d in reversed(rec.layers)]}
        hostname = _pod_hostname(sb.config)
        if hostname:  # the pod's own hostname: a UTS namespace of the container's own
            if not self._host.root:
                raise precondition(
                    f"container {md.name!r}: the pod's hostname {hostname!r} needs a UTS "
                    f"namespace of its own, which needs root; the embedded runtime runs as "
                    f"uid {self._host.euid} (use hostNetwork: true, or run podvisor as root)")
            doc["hostname"] = hostname
        if sb.network is not None:  # joined by the container's process before its exec
            doc["netns"] = sb.network.netns
        if config.linux.HasField("resources"):
            current, lowering_allowed = oom.own_state()
            doc["oom_score_adj"] = oom.effective(config.linux.resources.oom_score_adj, current,
                                                 lowering_allowed)
        name = (sandbox_id, md.name, md.attempt)
        with self._lock:  # reserve the name; write the journal outside the lock
            holder = self._index.container_names.get(name)
            if holder is not None:
                raise Fault(grpc.StatusCode.ALREADY_EXISTS,
                            f"container name {md.name} attempt {md.attempt} is reserved "
                            f"for {holder}")
            c = Container(secrets.token_hex(32), sandbox_id, config, self.wall(), log_path,
                          image.id)
            self._index.container_names[name] = c.id
        if config.stdin or config.tty:  # kubectl run -it, kubectl attach -it
            if len(self.attach_path(c.id).encode()) > MAX_SOCKET_PATH:
                with self._lock:
                    del self._index.container_names[name]
                raise invalid(f"container {md.name!r}: stdin: the attach socket "
                              f"{self.attach_path(c.id)!r} is longer than a unix socket's path "
                              "may be (use a shorter rootDir)")
            doc["stdio"] = {"stdin": bool(config.stdin), "stdin_once": bool(config.stdin_once),
                            "tty": bool(config.tty), "attach": self.attach_path(c.id)}
        dirs: dict[str, str] = {}
        try:
            if rec is not None:
                doc["rootfs"].update(self._make_rootfs(c.id, sb.config))
            else:
                self._host_etc(c.id, sb.config, doc)
            dirs = self._make_cgroup(sb, c, config.linux.resources)
            if dirs:
                doc["cgroups"] = dirs
                doc["cgroup_join"] = self.cgroups.join_files(dirs)  # before the exec
            if doc["security"].get("seccomp"):  # exec'd commands load it too (seccomp_exec)
                doc["security"]["seccomp_exec"] = self._seccomp_loader(c.id,
                                                                       doc["security"]["seccomp"])
            spec = json.dumps(doc).encode()
            self.crash.hit("create.before_record")
            self.store.save_container(c, spec)
        except BaseException:
            with self._lock:
                del self._index.container_names[name]
            if dirs:
                self.cgroups.remove(dirs)
            shutil.rmtree(self._rootfs_root / c.id, ignore_errors=True)
            raise
        with self._lock:
            self._containers[c.id] = c
            self._specs[c.id] = spec
            self._index.add_container(c)
        self._publish(c, pb.CONTAINER_CREATED_EVENT)
        self.crash.hit("create.after_record")
        return c.id

    def start_container(self, container_id: str) -> None:
        with self._lock:
            c = self.container(container_id)
            if c.state is not ContainerState.CREATED or container_id in self._starting:
                raise precondition(f"container {container_id} is {c.state.value}, not created")
            self._starting.add(container_id)
        try:
            self._start(c)
        finally:
            with self._lock:
                self._starting.discard(container_id)
                self._early_exits.pop(container_id, None)

    def spec(self, container_id: str) -> dict[str, Any]:
        """What the container runs (argv, env, cwd, log_path), as given to its monitor."""
        with self._lock:
            spec = self._specs.get(container_id)
        if spec is None:
            raise not_found("container", container_id)
        data: dict[str, Any] = json.loads(spec)
        return data

    def _start(self, c: Container) -> None:
        with self._lock:
            spec = self._specs.get(c.id)
        if spec is None:
            raise not_found("container", c.id)  # removed meanwhile
        log_fd = self._open_log(c)

        def intent(monitor_pid: int, monitor_ticks: int) -> None:
            """Journaled before the container goes to its monitor (``_settle``)."""
            self.crash.hit("start.before_intent")
            self.store.save_start(c.id, monitor_pid, monitor_ticks)
            self.crash.hit("start.after_intent")

        try:
            result = self._spawner.spawn(self.store.state_prefix(c.id), log_fd, spec, intent)
        except SpawnError as err:
            self._record_exit(c.id, ExitInfo(128, self.wall(), "StartError", str(err)))
            raise Fault(grpc.StatusCode.INTERNAL, f"starting container {c.id}: {err}") from None
        finally:
            if log_fd >= 0:
                os.close(log_fd)
        if not result.ok:
            self._record_exit(c.id, ExitInfo(128, self.wall(), "StartError", result.error))
            raise invalid(f"failed to start container {c.id}: {result.error}")
        self.crash.hit("start.after_reply")
        started = StartInfo(result.monitor_pid, result.monitor_ticks, result.pid,
                            result.pid_ticks, result.started_at)
        with self._lock:
            c = self._containers.get(c.id, c)
            self._containers[c.id] = c = replace(c, started=started)
            early = self._early_exits.pop(c.id, None)
        self._publish(c, pb.CONTAINER_STARTED_EVENT)
        if early is not None:
            self._record_exit(c.id, early, on_disk=True)
        self._watcher.watch(c.id, started.monitor_pid, started.monitor_ticks)

    def stop_container(self, container_id: str, timeout: int) -> None:
        """Stop signal (default TERM) to the container's process group, KILL after ``timeout``."""
        c = self.container(container_id)
        if c.state is not ContainerState.RUNNING or c.started is None:
            return  # idempotent
        st = c.started
        if timeout > 0:
            signal_group(st.pid, st.pid_ticks, _stop_signal(c.config.stop_signal))
            self.crash.hit("stop.after_signal")
            if self._wait_exit(container_id, float(timeout)):
                self.crash.hit("stop.after_exit")
                return
        signal_group(st.pid, st.pid_ticks, signal.SIGKILL)
        self.crash.hit("stop.after_signal")
        if not self._wait_exit(container_id, KILL_WAIT):
            raise Fault(grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"container {container_id} did not exit {KILL_WAIT} s after SIGKILL")
        self.crash.hit("stop.after_exit")

    def remove_container(self, container_id: str) -> None:
        with self._lock:
            c = self._containers.get(container_id)
        if c is None:
            return  # idempotent, as the CRI asks
        self.stop_container(container_id, 0)
        self.crash.hit("remove.after_stop")
        # What is left in its cgroup is killed before the record goes (runc's order): a runtime
        # killed in between still has the record, and the retried removal finishes the job.
        dirs = self.cgroup_dirs(container_id)
        if dirs:
            failed = self.cgroups.remove(dirs)
            if failed:
                self.log.warning("container.cgroup.busy", container=container_id,
                                 folders=failed)
        self.crash.hit("remove.after_cgroups")
        with self._lock:
            gone = self._containers.pop(container_id, None)
            self._specs.pop(container_id, None)
            self._statuses.pop(container_id, None)
            if gone is None:
                return
            self._index.remove_container(gone)
            self.store.delete_container(container_id)
        self.crash.hit("remove.after_record")
        shutil.rmtree(self._rootfs_root / container_id, ignore_errors=True)
        self._publish(c, pb.CONTAINER_DELETED_EVENT)

    # --- image root filesystems ---
    def _make_rootfs(self, container_id: str, sandbox: pb.PodSandboxConfig) -> dict[str, Any]:
        """The container's writable layer and the pod's /etc files (the monitor mounts them)."""
        top = self._rootfs_root / container_id
        for sub in ("upper", "work", "merged", "etc"):
            (top / sub).mkdir(parents=True, exist_ok=True)
        hostname = sandbox.hostname or sandbox.metadata.name or "localhost"
        etc = top / "etc"
        (etc / "hostname").write_text(hostname + "\n")
        (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost "
                                   f"ip6-loopback\n127.0.1.1\t{hostname}\n")
        dns = sandbox.dns_config
        if dns.servers or dns.searches or dns.options:
            (etc / "resolv.conf").write_text(_resolv_text(dns))
        else:
            try:
                (etc / "resolv.conf").write_bytes(Path("/etc/resolv.conf").read_bytes())
            except OSError:
                (etc / "resolv.conf").write_text("")
        return {"upper": str(top / "upper"), "work": str(top / "work"),
                "merged": str(top / "merged"),
                "etc": {n: str(etc / n) for n in ("hostname", "hosts", "resolv.conf")}}

    def _seccomp_loader(self, container_id: str, filt: dict[str, Any]) -> list[str]:
        """The argv prefix that runs a command under the container's filter (ExecSync and
        Exec, as runc applies a container's filter to its exec'd processes): the C monitor's
        ``--seccomp-exec FILE --`` when it loads filters, else the Python loader; FILE holds the
        filter as monitor.c's SECCOMP fields."""
        path = self.store.seccomp_path(container_id)
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            f.write(b"\0".join(x.encode() for x in seccomp_fields(filt)) + b"\0")
        os.rename(tmp, path)
        if self._spawner.monitor_exe:
            return [self._spawner.monitor_exe, "--seccomp-exec", path, "--"]
        return [sys.executable, "-m", "podvisor.services.runtime.seccomp_exec", path, "--"]

    def attach_path(self, container_id: str) -> str:
        """The unix socket a container's monitor feeds its stdin from (``<root>/a/<16 hex of
        the id>``: short, since a socket's path has at most 107 bytes)."""
        return str(self._attach_dir / container_id[:16])

    def _host_etc(self, container_id: str, sandbox: pb.PodSandboxConfig,
                  doc: dict[str, Any]) -> None:
        """The ``host`` image: the pod's resolv.conf over the node's (a bind mount of
        ``rootfs/<id>/etc/resolv.conf``) when its DNS config says something else than the
        node's file, so a pod with the node's DNS needs no mount namespace."""
        dns = sandbox.dns_config
        if not (dns.servers or dns.searches or dns.options):
            return
        try:
            node = Path("/etc/resolv.conf").read_text(errors="replace")
        except OSError:
            node = ""
        if _resolv_parts(node) == (list(dns.servers), list(dns.searches), list(dns.options)):
            return
        path = self._rootfs_root / container_id / "etc" / "resolv.conf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_resolv_text(dns))
        if not any(m["container"] == "/etc/resolv.conf" for m in doc.get("mounts", ())):
            doc.setdefault("mounts", []).append({"host": str(path),
                                                 "container": "/etc/resolv.conf", "ro": False,
                                                 "propagation": "private"})

    def _sweep_rootfs(self) -> None:
        """Writable layers of containers that no longer exist (a crash between steps)."""
        if not self._rootfs_root.is_dir():
            return
        for p in self._rootfs_root.iterdir():
            if p.name not in self._containers:
                shutil.rmtree(p, ignore_errors=True)

    def layers_in_use(self) -> set[str]:
        """Diff ids of the layers under some container (RemoveImage keeps them)."""
        with self._lock:
            specs = list(self._specs.values())
        used: set[str] = set()
        for spec in specs:
            if b'"rootfs"' in spec:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    used.update(json.loads(spec)["rootfs"]["layers"])
        return used

    def rootfs_usage(self) -> int:
        """Bytes in the containers' writable layers."""
        total = 0
        if self._rootfs_root.is_dir():
            for dirpath, _dirs, files in os.walk(self._rootfs_root):
                for f in files:
                    with contextlib.suppress(OSError):
                        total += os.lstat(os.path.join(dirpath, f)).st_size
        return total

    # --- cgroups (cgroups.py) ---
    def cgroup_dirs(self, container_id: str) -> dict[str, str]:
        """The container's cgroup folders (controller -> folder), {} when it has none."""
        with self._lock:
            spec = self._specs.get(container_id)
        if spec is None or b'"cgroups"' not in spec:
            return {}
        dirs = json.loads(spec).get("cgroups") or {}
        return {str(k): str(v) for k, v in dirs.items()}

    def _make_cgroup(self, sb: Sandbox, c: Container,
                     res: pb.LinuxContainerResources) -> dict[str, str]:
        """Create the container's cgroup with ``res`` ({} when it asks for nothing); a
        refusal is logged and raised (CreateContainer fails with its reason)."""
        parent = sb.config.linux.cgroup_parent or DEFAULT_PARENT
        md = sb.config.metadata
        try:
            # in a pod cgroup (the sync loop's cgroupRoot): always one, for accounting
            return self.cgroups.create(f"{parent.rstrip('/')}/{c.id}", res,
                                       account=bool(sb.config.linux.cgroup_parent))
        except Fault as err:
            self.log.warning("container.resources.refused", pod=md.name, namespace=md.namespace,
                             container=c.config.metadata.name, reason=err.message)
            raise

    def update_resources(self, container_id: str, res: pb.LinuxContainerResources) -> None:
        """UpdateContainerResources: write the new limits into the container's cgroup; a
        container created without one gets one now, its running processes moved in."""
        c = self.container(container_id)
        if c.state is not ContainerState.RUNNING or c.started is None:
            raise precondition(f"container {container_id} is not running")
        dirs = self.cgroup_dirs(container_id)
        if dirs:
            self.cgroups.update(dirs, res)
            return
        dirs = self._make_cgroup(self.sandbox(c.sandbox_id), c, res)
        if not dirs:
            return
        try:
            for pid in group_members().get(c.started.pid, []):
                with contextlib.suppress(ProcessLookupError):
                    self.cgroups.join(dirs, pid)
            with self._lock:
                doc = json.loads(self._specs[container_id])
                doc["cgroups"] = dirs
                spec = json.dumps(doc).encode()
                self.store.save_container(c, spec)
                self._specs[container_id] = spec
        except OSError as err:
            self.cgroups.remove(dirs)
            raise precondition(f"cannot update the container's resources: {err}") from None
        except BaseException:
            self.cgroups.remove(dirs)
            raise

    def _exit_reason(self, container_id: str, info: ExitInfo) -> ExitInfo:
        """OOMKilled (as containerd reports it) when the container's process died of a signal
        or an error and the kernel's OOM killer killed in its cgroup; rewritten into exit.json,
        so it holds after the cgroup is gone."""
        if info.exit_code == 0 or info.reason == "OOMKilled":
            return info
        dirs = self.cgroup_dirs(container_id)
        if not dirs or not self.cgroups.oom_killed(dirs):
            return info
        info = replace(info, reason="OOMKilled")
        with contextlib.suppress(OSError):
            self.store.save_exit(container_id, info)
        return info

    def reopen_log(self, container_id: str) -> None:
        c = self.container(container_id)
        if c.state is not ContainerState.RUNNING or c.started is None:
            raise precondition(f"container {container_id} is not running")
        if not c.log_path:
            return
        st = c.started
        if not is_alive(st.monitor_pid, st.monitor_ticks):
            raise precondition(f"container {container_id}'s monitor is gone")
        os.kill(st.monitor_pid, signal.SIGHUP)
        deadline = SYSTEM_CLOCK.monotonic() + 2.0
        while not os.path.exists(c.log_path):
            if SYSTEM_CLOCK.monotonic() > deadline:
                raise Fault(grpc.StatusCode.INTERNAL, f"log {c.log_path} was not reopened")
            time.sleep(0.001)

    # --- internals ---
    def _open_log(self, c: Container) -> int:
        if not c.log_path:
            return -1
        try:
            os.makedirs(os.path.dirname(c.log_path), exist_ok=True)
            return os.open(c.log_path, LOG_FLAGS, 0o640)
        except OSError as err:
            raise invalid(f"cannot open log file {c.log_path!r}: {err.strerror} "
                          f"(errno {err.errno})") from None

    def _wait_exit(self, container_id: str, timeout: float) -> bool:
        def done() -> bool:
            c = self._containers.get(container_id)
            return c is None or c.exited is not None
        with self._exited:
            return self._exited.wait_for(done, timeout)

    def _record_exit(self, container_id: str, info: ExitInfo, on_disk: bool = False) -> None:
        """``on_disk``: ``info`` was read from ``exit.json`` (the monitor wrote it)."""
        info = self._exit_reason(container_id, info)
        with self._lock:
            c = self._containers.get(container_id)
            if c is None or c.exited is not None:
                return
            if not on_disk and self.store.read_exit(container_id) is None:
                with contextlib.suppress(OSError):
                    self.store.save_exit(container_id, info)
            self._containers[container_id] = c = replace(c, exited=info)
            self._exited.notify_all()
        self._publish(c, pb.CONTAINER_STOPPED_EVENT)  # first: the log line can wait
        self.log.info("container.exited", container=container_id, exit_code=info.exit_code,
                      reason=info.reason)

    def _on_exit_note(self, container_id: str, info: ExitInfo) -> None:
        """A monitor's exit note (watcher.py): sent after it wrote exit.json with ``info``."""
        with self._lock:
            c = self._containers.get(container_id)
            if c is None or c.exited is not None:
                return
            if c.started is None:  # the note beat the start's reply: _start records it
                if container_id in self._starting:
                    self._early_exits[container_id] = info
                return
        self._record_exit(container_id, info, on_disk=True)

    def _on_monitor_exit(self, container_id: str) -> None:
        with self._lock:
            c = self._containers.get(container_id)
            if c is None or c.exited is not None:
                return  # the exit note came first (the usual case)
        info = self.store.read_exit(container_id)
        if info is not None:
            self._record_exit(container_id, info, on_disk=True)
            return
        c = self._containers.get(container_id)
        if c is not None and c.started is not None:
            signal_group(c.started.pid, c.started.pid_ticks, signal.SIGKILL)
        self._record_exit(container_id, ExitInfo(
            255, self.wall(), "Unknown",
            "the container's monitor exited without recording an exit code"))

    def status_of(self, c: Container) -> pb.ContainerStatus:
        """``convert.container_status(c)``, built once per (immutable) record: events and
        ContainerStatus calls after a change share it. Callers must not modify it."""
        hit = self._statuses.get(c.id)
        if hit is None or hit[0] is not c:
            st = convert.container_status(c)
            hit = (c, st if self._host.root else without_termination_log(st))
            with self._lock:
                if c.id in self._containers:  # not for a record already removed
                    self._statuses[c.id] = hit
        return hit[1]

    def _publish(self, c: Container, kind: pb.ContainerEventType.ValueType) -> None:
        """One event to every GetContainerEvents subscriber. As the CRI asks (and containerd
        does), ``containers_statuses`` holds every container of the sandbox, read under the
        lock (one consistent snapshot): the event's own container first, except after a
        removal, when it is gone. A consumer can take the pod's state from the event alone,
        as the kubelet's Evented PLEG does."""
        if not self.events.active():
            return
        with self._lock:
            sb = self._sandboxes.get(c.sandbox_id)
            others = [x for x in self.containers_of(c.sandbox_id) if x.id != c.id]
            mine = [] if kind == pb.CONTAINER_DELETED_EVENT else [self._containers.get(c.id, c)]
        event = pb.ContainerEventResponse(
            container_id=c.id, container_event_type=kind, created_at=self.wall(),
            pod_sandbox_status=convert.sandbox_status(sb) if sb else None,
            containers_statuses=[self.status_of(x) for x in mine + others],
        )
        self.events.publish(event)


def _kill_and_wait(pid: int, ticks: int) -> None:
    """SIGKILL (pid, ticks), not a reused pid, and wait (bounded) until it is gone."""
    if not is_alive(pid, ticks):
        return
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if is_alive(pid, ticks):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            wait_readable(fd, KILL_WAIT)
    except OSError:
        pass
    finally:
        os.close(fd)


def _log_path(log_directory: str, log_path: str) -> str:
    if not log_path:
        return ""
    if os.path.isabs(log_path):
        return os.path.normpath(log_path)
    return os.path.normpath(os.path.join(log_directory, log_path)) if log_directory else ""


_PROPAGATION = {pb.PROPAGATION_PRIVATE: "private", pb.PROPAGATION_HOST_TO_CONTAINER: "rslave"}
HANDLERS = ("", "podvisor")  # the runtime handlers (RunPodSandbox's runtime_handler)


def _mounts(name: str, mounts: Iterable[pb.Mount]) -> list[dict[str, Any]]:
    """The config's bind mounts as the monitor takes them (applied in a private mount namespace
    when the container starts; see monitor.c ``apply_mounts``)."""
    out = []
    for m in mounts:
        where = f"container {name!r}: mount {m.host_path[:200]!r} on {m.container_path[:200]!r}"
        if not os.path.isabs(m.host_path) or not os.path.isabs(m.container_path):
            raise invalid(f"{where}: both paths must be absolute")
        if "\0" in m.host_path + m.container_path:
            raise invalid(f"{where}: a NUL byte in a path")
        if m.propagation == pb.PROPAGATION_BIDIRECTIONAL:  # mountPropagation: Bidirectional
            raise invalid(f"{where}: propagation PROPAGATION_BIDIRECTIONAL is not supported by "
                          "the embedded runtime: its containers' mounts are made on the node's "
                          "own root filesystem in a namespace that is a slave of the node's, so "
                          "it cannot give a mount the node's peer group as runc does (use "
                          "containerd for mountPropagation: Bidirectional)")
        if m.propagation not in _PROPAGATION:
            known = m.propagation in pb.MountPropagation.values()
            prop = pb.MountPropagation.Name(m.propagation) if known else m.propagation
            raise invalid(f"{where}: propagation {prop} is "
                          "not supported by the embedded runtime (private and host-to-container "
                          "are)")
        if m.recursive_read_only and not m.readonly:
            raise invalid(f"{where}: recursive read-only mount must be read-only")
        if m.recursive_read_only and m.propagation != pb.PROPAGATION_PRIVATE:
            raise invalid(f"{where}: recursive read-only mount requires private propagation")
        out.append({"host": os.path.normpath(m.host_path),
                    "container": os.path.normpath(m.container_path),
                    "ro": bool(m.readonly), "propagation": _PROPAGATION[m.propagation],
                    "rro": bool(m.recursive_read_only)})
    return out


def _devices(name: str, devices: Iterable[pb.Device], own_root: bool) -> list[dict[str, Any]]:
    """CRI ``devices`` (the kubelet's raw block volumes): each host device (its symlinks
    resolved, as containerd does) bound on its ``container_path`` after the volume mounts, so
    inside the tmpfs /dev the monitor makes for an image's root filesystem: the node appears
    there, with the host node's type and numbers, and the container opens it (the embedded
    runtime confines no devices: no devices cgroup rule to add). A container of image 'host'
    shares the node's /dev: its device must be at the same path there (nothing is made in
    the node's /dev). Without a devices cgroup a device cannot be made read-only (a read-only
    bind does not stop writes to a device node): ``permissions`` without ``w`` (a read-only
    claim) are refused, never given writable."""
    out = []
    for d in devices:
        where = f"container {name!r}: device {d.host_path[:200]!r} on {d.container_path[:200]!r}"
        if not os.path.isabs(d.host_path) or not os.path.isabs(d.container_path):
            raise invalid(f"{where}: both paths must be absolute")
        if "\0" in d.host_path + d.container_path:
            raise invalid(f"{where}: a NUL byte in a path")
        if d.permissions.strip("rwm") or not d.permissions:
            raise invalid(f"{where}: invalid permissions {d.permissions[:16]!r} (r, w, m)")
        if "w" not in d.permissions:
            raise precondition(f"{where}: permissions {d.permissions!r}: the embedded runtime "
                               "sets no devices cgroup, so it cannot give a device read-only "
                               "(a read-only claim's block volume: use containerd)")
        host = os.path.realpath(d.host_path)
        try:
            mode = os.stat(host).st_mode
        except OSError as err:
            raise invalid(f"{where}: error gathering device information: {err.strerror}") \
                from None
        if not (stat.S_ISBLK(mode) or stat.S_ISCHR(mode)):
            raise invalid(f"{where}: error gathering device information: not a device node")
        container = os.path.normpath(d.container_path)
        if not own_root:
            if os.path.realpath(container) == host:
                continue  # already there: the node's /dev is the container's
            raise invalid(f"{where}: a container of image 'host' shares the node's /dev, so "
                          "the embedded runtime can give it a device only at the device's own "
                          "path (use an image for its own /dev, or containerd)")
        out.append({"host": host, "container": container, "ro": False, "rro": False,
                    "propagation": "private"})
    return out


def _pod_hostname(sandbox: pb.PodSandboxConfig) -> str:
    """The hostname a pod with a network of its own asked for ("" on the node's network)."""
    ns = sandbox.linux.security_context.namespace_options
    return "" if ns.network == pb.NODE else sandbox.hostname


def _resolv_text(dns: pb.DNSConfig) -> str:
    lines = [f"nameserver {s}" for s in dns.servers]
    lines += [f"search {' '.join(dns.searches)}"] if dns.searches else []
    lines += [f"options {' '.join(dns.options)}"] if dns.options else []
    return "\n".join(lines) + "\n"


def _resolv_parts(text: str) -> tuple[list[str], list[str], list[str]]:
    """(nameservers, searches, options) of a resolv.conf, as the kubelet parses it."""
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "nameserver" and len(words) > 1:
            servers.append(words[1])
        elif words[0] == "search":
            searches = [w.removesuffix(".") for w in words[1:]]
        elif words[0] == "options":
            options = words[1:]
    return servers, searches, options


def _stop_signal(value: int) -> int:
    """CRI's ``stop_signal`` as a number (RUNTIME_DEFAULT: SIGTERM, the ``host`` image's);
    the real-time ones count from SIGRTMIN / SIGRTMAX (SIGRTMINPLUS1, SIGRTMAXMINUS2)."""
    if value == pb.RUNTIME_DEFAULT or value not in pb.Signal.values():
        return int(signal.SIGTERM)
    name = pb.Signal.Name(value)
    for base in ("SIGRTMIN", "SIGRTMAX"):
        if name.startswith(base):
            offset = name.removeprefix(base)
            n = int(offset.removeprefix("PLUS").removeprefix("MINUS") or 0)
            return int(getattr(signal, base)) + (-n if "MINUS" in offset else n)
    return int(getattr(signal, name, signal.SIGTERM))


def image_argv(config: Mapping[str, Any], command: list[str], args: list[str]) -> list[str]:
    """Kubernetes' rules: ``command`` replaces the image's Entrypoint (and drops its Cmd);
    ``args`` replaces its Cmd."""
    entry = [str(a) for a in config.get("Entrypoint") or []]
    cmd = [str(a) for a in config.get("Cmd") or []]
    if command:
        return command + args
    return entry + (args if args else cmd)


def image_user(config: Mapping[str, Any], layers_top_first: list[Path]
               ) -> tuple[int, int] | None:
    """The image config's User as (uid, gid): numbers as given, names from the image's
    /etc/passwd (and /etc/group); (-1, -1) when the image sets none; None when unknown."""
    user = str(config.get("User") or "")
    if not user:
        return (-1, -1)
    name, _, group = user.partition(":")

    def lookup(file: str, key: str, field: int) -> int | None:
        for layer in layers_top_first:
            path = layer / "etc" / file
            if path.exists():
                for line in path.read_text(errors="replace").splitlines():
                    parts = line.split(":")
                    if len(parts) > field and parts[0] == key and parts[field].isdigit():
                        return int(parts[field])
                return None
        return None

    if name.isdigit():
        uid, pw_gid = int(name), 0
        for layer in layers_top_first:
            path = layer / "etc" / "passwd"
            if path.exists():
                for line in path.read_text(errors="replace").splitlines():
                    parts = line.split(":")
                    if len(parts) > 3 and parts[2] == name and parts[3].isdigit():
                        pw_gid = int(parts[3])
                break
    else:
        found_uid = lookup("passwd", name, 2)
        found_gid = lookup("passwd", name, 3)
        if found_uid is None:
            return None
        uid, pw_gid = found_uid, found_gid or 0
    if not group:
        return (uid, pw_gid)
    if group.isdigit():
        return (uid, int(group))
    gid = lookup("group", group, 2)
    return None if gid is None else (uid, gid)
