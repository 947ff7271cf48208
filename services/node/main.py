"""Process ``node``: the Node and its Lease in the API server (runs when ``kubeconfig`` is set).

The service loop's worker registers the Node, renews the Lease every
``nodeLeaseRenewInterval`` and computes the status every ``nodeStatusUpdateFrequency`` (see
``agent.py``); the loop's thread heartbeats and watches it (a step that makes no progress for
``STALL_LIMIT`` is a hang: the process exits and the supervisor restarts it, which registers
again: 409 -> reconcile).
The Lease is renewed first after a (re)start, so a kill -9 costs at most one restart's delay of
its ``leaseDurationSeconds`` (40 s).
"""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlparse

from podvisor.common.child import ChildContext
from podvisor.common.endpoint import cri_endpoint
from podvisor.common.service import ServiceLoop, Worker
from podvisor.ipc.maps import (
    HOST_NETWORK_REASON,
    NODE_SHUTDOWN,
    PRESSURE,
    PRESSURE_KEY,
    VOLUMES,
    NodePressure,
    NodeShutdownState,
)
from podvisor.ipc.volumemaps import NODE_KEY, NodeVolumes
from podvisor.services.apiserver import ApiConnection, ApiError, ApiUnreachable
from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.node.agent import NodeAgent, NodeSettings
from podvisor.services.node.status import (
    RuntimeFacts,
    RuntimeHandlerFacts,
    keep_handlers,
    machine_facts,
    node_shape,
)
from podvisor.services.node.version import SkewRefused

STALL_LIMIT = 60.0
SHUTTING_DOWN = "node is shutting down"  # the kubelet's ShutdownStatus() error: Ready's message
RETRY = 1.0  # after a failed request, try again this soon (capped by the periods)


def _endpoint(ctx: ChildContext) -> str:
    return cri_endpoint(ctx.config.runtime_endpoint, ctx.paths.cri_socket,
                        ctx.config.cri_proxy)


def runtime_probe(endpoint: str) -> RuntimeFacts:
    """CRI Version + Status -> containerRuntimeVersion and Ready's reason (kubelet wording)."""
    client = new_runtime_client(endpoint, timeout=2.0)
    try:
        version = client.version()
        status = client.status()
    except (CriError, OSError) as exc:
        return RuntimeFacts("", f"container runtime is down: {exc}")
    finally:
        close = getattr(client, "close", None)
        if close is not None:
            close()
    conds = {c.type: c for c in status.status.conditions}
    name = f"{version.runtime_name}://{version.runtime_version}"
    handlers = tuple(RuntimeHandlerFacts(h.name, h.features.recursive_read_only_mounts,
                                         h.features.user_namespaces)
                     for h in status.runtime_handlers)
    runtime = conds.get("RuntimeReady")
    if runtime is None or not runtime.status:
        why = f"{runtime.reason}: {runtime.message}" if runtime else "no RuntimeReady condition"
        return RuntimeFacts(name, f"container runtime not ready: {why}", handlers=handlers)
    network = conds.get("NetworkReady")
    if network is not None and not network.status:
        return RuntimeFacts(name, "container runtime network not ready: NetworkReady=false "
                                  f"reason:{network.reason} message:{network.message}",
                            handlers=handlers)
    if network is not None and network.reason == HOST_NETWORK_REASON:
        return RuntimeFacts(name, "", f"host network mode: {network.message}", handlers)
    return RuntimeFacts(name, "", handlers=handlers)


def _conditions(value: NodePressure | None) -> tuple[str, ...]:
    return value.conditions if value is not None else ()


class NodeService:
    """The node process: the agent's requests run on the service loop's worker, built once."""

    def __init__(self, ctx: ChildContext) -> None:
        config = ctx.config
        self.ctx = ctx
        self.clock = ctx.clock
        shape = node_shape(config)  # raises when nodeIP is no address of this host
        self.conn = conn = ApiConnection(config.kubeconfig)
        endpoint = _endpoint(ctx)
        self.agent = NodeAgent(
            conn, NodeSettings(config.node_name, config.max_pods, config.port,
                               config.node_status_report_frequency,
                               config.node_lease_duration_seconds, shape),
            lambda: machine_facts(config.root_dir, urlparse(conn.host).hostname or ""),
            lambda: self._runtime(endpoint), ctx.log, volumes=self._volumes)
        self.shutting_down = False  # a graceful node shutdown began (the node-shutdown map)
        self.loop = ServiceLoop(ctx)
        # the eviction manager's node conditions (read on the worker's thread: one lookup)
        pressure = self.loop.replica(PRESSURE)
        self.agent.pressure = lambda: _conditions(pressure.get(PRESSURE_KEY))
        self.loop.replica(NODE_SHUTDOWN, self._on_shutdown)
        self.loop.closing(self.conn)
        self.volumes = self.loop.replica(VOLUMES)  # volumesInUse, volumesAttached
        self.loop.on_faults(self.conn.faults.set)  # injected api faults (issue 28)
        self.worker: Worker[object] = self.loop.worker(self.step, stall=STALL_LIMIT,
                                                       name="node")
        self.next_lease = self.next_status = self.clock.monotonic()
        self.failing = ""
        self.handlers: tuple[RuntimeHandlerFacts, ...] = ()  # as the runtime last listed them

    def _volumes(self) -> NodeVolumes | None:
        """The volume manager's ``_node`` entry (read from the worker: one dict lookup)."""
        value = self.volumes.get(NODE_KEY)
        return value if isinstance(value, NodeVolumes) else None

    def _runtime(self, endpoint: str) -> RuntimeFacts:
        facts = keep_handlers(runtime_probe(endpoint), self.handlers)
        self.handlers = facts.handlers
        if self.shutting_down:  # the kubelet: NotReady, KubeletNotReady, "node is shutting down"
            return replace(facts, not_ready=SHUTTING_DOWN, note="")
        return facts

    def _on_shutdown(self, key: str, old: NodeShutdownState | None,
                     new: NodeShutdownState | None) -> None:
        """A graceful node shutdown began: the Node goes NotReady at once."""
        if new is not None and new.active and not self.shutting_down:
            self.ctx.log.info("node.shutting_down", trigger=new.trigger)
            self.shutting_down = True
            self.next_status = self.clock.monotonic()
            self.worker.wake()

    def run(self) -> None:
        self.loop.run(lambda now: None)  # the work is the worker's

    def step(self, now: float) -> float:
        """One turn of the worker: register, renew the Lease, report the status, as due;
        returns when the next is due."""
        config = self.ctx.config
        try:
            if not self.agent.registered:
                self.agent.register()
            if now >= self.next_lease:
                self.agent.renew_lease(self.clock.wall())
                self.next_lease = now + config.node_lease_renew_interval
            if now >= self.next_status:
                self.agent.report_status(self.clock.wall())
                self.next_status = now + config.node_status_update_frequency
            if self.failing:
                self.ctx.log.info("node.api_recovered", node=config.node_name)
                self.failing = ""
        except (ApiError, ApiUnreachable, SkewRefused) as exc:
            if str(exc) != self.failing:
                if isinstance(exc, SkewRefused):
                    self.ctx.log.error("node.version_refused", node=config.node_name,
                                       reason=str(exc))
                else:
                    self.ctx.log.warning("node.api_failed", node=config.node_name,
                                         reason=str(exc))
                self.failing = str(exc)
            retry = self.clock.monotonic() + RETRY  # what was due and failed goes again soon
            self.next_lease = max(self.next_lease, retry)
            self.next_status = max(self.next_status, retry)
        return min(self.next_lease, self.next_status)

    def close(self) -> None:
        self.loop.close()


def run(ctx: ChildContext) -> None:
    config = ctx.config
    if not config.kubeconfig or not config.register_node:
        ctx.log.info("node.disabled", reason="kubeconfig is not set" if not config.kubeconfig
                     else "registerNode is false")
        return
    service = NodeService(ctx)
    try:
        service.run()
    finally:
        service.close()
