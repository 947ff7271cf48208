"""The supervised ``runtime`` process: serve runtime.v1 on ``paths.cri_socket`` with state under
``paths.runtime_dir`` (or, with ``criProxy`` and a remote ``runtimeEndpoint``, proxy that
runtime there: ``criproxy.py``), heartbeat while the server answers (``liveness.py``: a wedged
server gets the process restarted as hung), and return when ``ctx.stop`` is set."""

from __future__ import annotations

from podvisor.common import crashpoints
from podvisor.common.child import ChildContext
from podvisor.common.config import cni_conf_dir
from podvisor.common.endpoint import is_embedded
from podvisor.common.service import ServiceLoop
from podvisor.services.runtime.criproxy import CriProxy
from podvisor.services.runtime.liveness import ServerProbe
from podvisor.services.runtime.server import NetworkSettings, RuntimeServer

# The server is asked every PROBE_EVERY heartbeat intervals (a call waits DEADLINE intervals at
# most) and the process beats while its last answer is at most PROBE_EVERY + DEADLINE intervals
# old: a wedged server silences the process within ~7 intervals, then the supervisor's
# heartbeatTimeout runs. Asking every interval cost ~3x more idle CPU for a faster verdict.
PROBE_EVERY = 5.0
DEADLINE = 2.0


class RuntimeService:
    """The runtime process's loop beside its server: it asks the server (``ServerProbe``) and
    heartbeats only while the last answer is fresh."""

    def __init__(self, ctx: ChildContext, server: RuntimeServer | CriProxy) -> None:
        self.ctx = ctx
        interval = ctx.heartbeat_interval
        self.loop = ServiceLoop(ctx)
        self.probe = ServerProbe(server.socket_path, ctx.clock, every=PROBE_EVERY * interval,
                                 fresh=(PROBE_EVERY + DEADLINE) * interval,
                                 deadline=DEADLINE * interval)
        self.loop.beat_while(self.probe.answering)
        self.loop.on_faults(server.faults.set)  # injected cri faults (faultgate.py)
        self._answering: bool | None = None  # what was last logged (None: no answer yet)

    def run(self) -> None:
        self.loop.run(self.step)

    def step(self, now: float) -> float | None:
        answering = self.probe.answering(now)
        if answering and not self._answering:
            if self._answering is not None:
                self.ctx.log.info("runtime.server_answering")
            self._answering = True
        elif not answering and self._answering:
            self.ctx.log.warning("runtime.server_not_answering",
                                 seconds=round(now - self.probe.answered, 3))
            self._answering = False
        return self.probe.poke(now)

    def close(self) -> None:
        self.loop.close()


def run(ctx: ChildContext) -> None:
    server: RuntimeServer | CriProxy
    if is_embedded(ctx.config.runtime_endpoint):
        registries = ctx.config.image_registries or {}
        network = NetworkSettings(ctx.config.network_plugin, str(cni_conf_dir(ctx.config)),
                                  ctx.config.cni_bin_dir)
        server = RuntimeServer(ctx.paths.runtime_dir, ctx.paths.cri_socket, ctx.log,
                               registries, crashpoints.from_env("runtime"), network)
    else:  # criProxy: the remote runtime, proxied (criproxy.py)
        server = CriProxy(ctx.config.runtime_endpoint, ctx.paths.cri_socket, ctx.log)
    server.start()
    try:
        service = RuntimeService(ctx, server)
        try:
            service.run()
        finally:
            service.close()
    finally:
        server.stop()
