"""Process ``certificates``: TLS bootstrap and certificate rotation (issue 26; KUBELET.md, "TLS
bootstrap"). Runs when ``kubeconfig`` is set with ``bootstrapKubeconfig``,
``rotateCertificates`` or ``serverTLSBootstrap``.

- **client** (``kubelet-client``): when the kubeconfig is missing or its certificate expired,
  a CSR ``node-csr-<digest>`` (signer ``kubernetes.io/kube-apiserver-client-kubelet``) with the
  bootstrap kubeconfig's credentials; once signed, the pair goes to ``certDir`` and the
  kubeconfig is written to name ``kubelet-client-current.pem``. With ``rotateCertificates``, a
  new pair is requested with the node's own credentials at the rotation deadline.
- **server** (``kubelet-server``, ``serverTLSBootstrap``): a CSR for signer
  ``kubernetes.io/kubelet-serving`` with the Node's addresses (read from the Node in the API,
  as the kubelet takes them from its own node status) as SANs, requested with the node's
  credentials, rotated the same way; the main port picks it up on its next handshake.
Every other process reads the files and picks a new pair up by itself
(``services/apiserver/client.py``, ``services/server/dyntls.py``): nothing is signalled, and a
kill -9 of this process at any step leaves the current pair in place (``store.py``).
Each manager runs as a service loop worker (``Manager.step``); the loop heartbeats and raises a
worker's failure, so the process exits and is restarted.
"""

from __future__ import annotations

import threading
from pathlib import Path

from podvisor.common.child import ChildContext
from podvisor.common.config import cert_dir
from podvisor.common.crashpoints import from_env
from podvisor.common.service import ServiceLoop
from podvisor.services.apiserver import ApiConnection, ApiError, ApiUnreachable, node_addresses
from podvisor.services.certificates import csr, wanted
from podvisor.services.certificates.kubeconfig import (
    client_pair,
    read_kubeconfig,
    write_kubeconfig,
)
from podvisor.services.certificates.manager import Manager
from podvisor.services.certificates.store import CLIENT_PREFIX, SERVER_PREFIX, Pair, PairStore

__all__ = ["run"]


class Connections:
    """One ``ApiConnection`` per kubeconfig, made on first use."""

    def __init__(self) -> None:
        self._conns: dict[str, ApiConnection] = {}
        self._lock = threading.Lock()

    def get(self, path: str) -> ApiConnection:
        with self._lock:
            if path not in self._conns:
                self._conns[path] = ApiConnection(path)
            return self._conns[path]

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()


def _client_manager(ctx: ChildContext, store: PairStore, conns: Connections) -> Manager:
    config = ctx.config
    kubeconfig = Path(config.kubeconfig)
    bootstrap = Path(config.bootstrap_kubeconfig) if config.bootstrap_kubeconfig else None

    def current() -> Pair | None:
        """The kubeconfig's certificate (the store's after a bootstrap or rotation)."""
        try:
            return client_pair(read_kubeconfig(kubeconfig))
        except (OSError, ValueError):
            return store.current()

    def connection(pair: Pair | None) -> ApiConnection | None:
        if pair is not None:
            return conns.get(str(kubeconfig))
        return conns.get(str(bootstrap)) if bootstrap is not None else None

    def on_update(pair: Pair) -> None:
        """The kubeconfig names the symlink; write it when it does not (yet)."""
        try:
            if (read_kubeconfig(kubeconfig).cert_file or Path()) == store.current_path:
                return
        except (OSError, ValueError):
            pass
        source = bootstrap if bootstrap is not None and bootstrap.exists() else kubeconfig
        cluster = read_kubeconfig(source).cluster
        write_kubeconfig(kubeconfig, cluster, store.current_path)
        ctx.log.info("certificates.kubeconfig_written", kubeconfig=str(kubeconfig),
                     pair=str(store.current_path))

    def ensure() -> None:
        """A pair in the store and no usable kubeconfig (a crash between the two writes, or
        a kubeconfig removed): write it."""
        pair = store.current()
        if pair is None or not pair.valid_at(ctx.clock.wall()):
            return
        try:
            mine = client_pair(read_kubeconfig(kubeconfig))
        except (OSError, ValueError):
            mine = None
        if mine is None or not mine.valid_at(ctx.clock.wall()):
            on_update(pair)

    template = csr.Template(config.node_name, csr.CLIENT_SIGNER, csr.CLIENT_USAGES)
    return Manager("client", store, lambda: template, connection, ctx.clock, ctx.log,
                   rotate=config.rotate_certificates, digested_name=True, current=current,
                   on_update=on_update, ensure=ensure, crash=from_env("certificates").hit)


def _server_manager(ctx: ChildContext, store: PairStore, conns: Connections) -> Manager:
    config = ctx.config
    node_path = f"/api/v1/nodes/{config.node_name}"
    seen: list[csr.Template | None] = [None]

    def template() -> csr.Template | None:
        """The Node's addresses (kubelet ``addressesToHostnamesAndIPs``): Hostname and DNS
        ones as DNS names (a Hostname that is an IP as an IP), Internal/External IPs as IPs;
        none without an IP yet. The last one read serves while the API is unreachable."""
        try:
            node = conns.get(config.kubeconfig).request("GET", node_path)
        except (ApiError, ApiUnreachable):
            return seen[0]
        dns: set[str] = set()
        ips: set[str] = set()
        for kind, value in node_addresses(node):
            if not value:
                continue
            if kind in ("InternalIP", "ExternalIP") or (kind == "Hostname" and _is_ip(value)):
                ips.add(value)
            elif kind in ("Hostname", "InternalDNS", "ExternalDNS"):
                dns.add(value)
        seen[0] = csr.Template(config.node_name, csr.SERVING_SIGNER, csr.SERVING_USAGES,
                               tuple(sorted(dns)), tuple(sorted(ips))) if ips else None
        return seen[0]

    return Manager("server", store, template, lambda pair: conns.get(config.kubeconfig),
                   ctx.clock, ctx.log, rotate=True, crash=from_env("certificates").hit)


def _is_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def run(ctx: ChildContext) -> None:
    config = ctx.config
    if not wanted(config):
        ctx.log.info("certificates.disabled", reason="none of bootstrapKubeconfig, "
                     "rotateCertificates, serverTLSBootstrap is set (or no kubeconfig)")
        return
    directory = cert_dir(config)
    conns = Connections()
    managers: list[Manager] = []
    client_store = PairStore(directory, CLIENT_PREFIX, from_env("certificates").hit)
    client_store.recover()
    if config.bootstrap_kubeconfig or config.rotate_certificates:
        managers.append(_client_manager(ctx, client_store, conns))
    if config.server_tls_bootstrap:
        server_store = PairStore(directory, SERVER_PREFIX, from_env("certificates").hit)
        server_store.recover()
        managers.append(_server_manager(ctx, server_store, conns))
    loop = ServiceLoop(ctx)
    for manager in managers:
        loop.worker(manager.step, stall=None, name=f"certificates-{manager.kind}")
    ctx.log.info("certificates.started", cert_dir=str(directory),
                 managers=[m.kind for m in managers])
    try:
        loop.run(lambda now: None)  # the work is the workers'
    finally:
        for manager in managers:
            manager.halt()  # a wait for a certificate ends now, not at its deadline
        loop.close()
        conns.close()
