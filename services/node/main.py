"""Process ``node``: the Node and its Lease in the API server (runs when ``kubeconfig`` is set).

A helper thread registers the Node, renews the Lease every ``nodeLeaseRenewInterval`` and
computes the status every ``nodeStatusUpdateFrequency`` (see ``agent.py``); the main thread
(the service loop) heartbeats and watches the helper (a helper that makes no progress for
``STALL_LIMIT`` is a hang: the process exits and the supervisor restarts it, which registers
again: 409 -> reconcile).
The Lease is renewed first after a (re)start, so a kill -9 costs at most one restart's delay of
its ``leaseDurationSeconds`` (40 s).
"""

from __future__ import annotations

import threading
from urllib.parse import urlparse

from podvisor.common.child import ChildContext
from podvisor.common.endpoint import cri_endpoint
from podvisor.common.service import ServiceLoop
from podvisor.services.apiserver import ApiConnection, ApiError, ApiUnreachable
from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.node.agent import NodeAgent, NodeSettings
from podvisor.services.node.status import RuntimeFacts, machine_facts, node_shape
from podvisor.services.node.version import SkewRefused

STALL_LIMIT = 60.0
RETRY = 1.0  # after a failed request, try again this soon (capped by the periods)


def _endpoint(ctx: ChildContext) -> str:
    return cri_endpoint(ctx.config.runtime_endpoint, ctx.paths.cri_socket)


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
    runtime = conds.get("RuntimeReady")
    if runtime is None or not runtime.status:
        why = f"{runtime.reason}: {runtime.message}" if runtime else "no RuntimeReady condition"
        return RuntimeFacts(name, f"container runtime not ready: {why}")
    network = conds.get("NetworkReady")
    if network is not None and not network.status:
        return RuntimeFacts(name, "container runtime network not ready: NetworkReady=false "
                                  f"reason:{network.reason} message:{network.message}")
    return RuntimeFacts(name, "")


def run(ctx: ChildContext) -> None:
    config = ctx.config
    if not config.kubeconfig or not config.register_node:
        ctx.log.info("node.disabled", reason="kubeconfig is not set" if not config.kubeconfig
                     else "registerNode is false")
        return
    shape = node_shape(config)  # raises when nodeIP is no address of this host
    conn = ApiConnection(config.kubeconfig)
    endpoint = _endpoint(ctx)
    agent = NodeAgent(conn, NodeSettings(config.node_name, config.max_pods, config.port,
                                         config.node_status_report_frequency,
                                         config.node_lease_duration_seconds, shape),
                      lambda: machine_facts(config.root_dir,
                                            urlparse(conn.host).hostname or ""),
                      lambda: runtime_probe(endpoint), ctx.log)
    progress = [ctx.clock.monotonic()]
    failure: list[BaseException] = []
    stop = threading.Event()

    def helper() -> None:
        try:
            _loop(ctx, agent, stop, progress)
        except BaseException as exc:  # the main thread re-raises it
            failure.append(exc)

    thread = threading.Thread(target=helper, name="node", daemon=True)
    loop = ServiceLoop(ctx)
    loop.closing(conn)
    thread.start()

    def step(now: float) -> float | None:
        if failure:
            raise failure[0]
        if now - progress[0] > STALL_LIMIT:
            raise RuntimeError(f"the node helper made no progress for {STALL_LIMIT}s")
        return None

    try:
        loop.run(step)
    finally:
        stop.set()
        thread.join(2)
        loop.close()


def _loop(ctx: ChildContext, agent: NodeAgent, stop: threading.Event,
          progress: list[float]) -> None:
    config = ctx.config
    clock = ctx.clock
    next_lease = next_status = clock.monotonic()
    failing = ""
    while not stop.is_set():
        progress[0] = now = clock.monotonic()
        try:
            if not agent.registered:
                agent.register()
            if now >= next_lease:
                agent.renew_lease(clock.wall())
                next_lease = now + config.node_lease_renew_interval
            if now >= next_status:
                agent.report_status(clock.wall())
                next_status = now + config.node_status_update_frequency
            if failing:
                ctx.log.info("node.api_recovered", node=config.node_name)
                failing = ""
        except (ApiError, ApiUnreachable, SkewRefused) as exc:
            if str(exc) != failing:
                if isinstance(exc, SkewRefused):
                    ctx.log.error("node.version_refused", node=config.node_name,
                                  reason=str(exc))
                else:
                    ctx.log.warning("node.api_failed", node=config.node_name, reason=str(exc))
                failing = str(exc)
            retry = clock.monotonic() + RETRY  # what was due and failed goes again soon
            next_lease, next_status = max(next_lease, retry), max(next_status, retry)
        wait = min(next_lease, next_status) - clock.monotonic()
        if wait > 0:
            stop.wait(wait)
