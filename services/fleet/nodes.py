"""The fleet's nodes from a cluster: its Node objects (``kubeconfig`` in the fleet config).

A Node's ops URL is its annotation ``ops.podvisor.io/url`` when set, else
``nodeOpsScheme://<InternalIP>:nodeOpsPort`` (the ops port is not among a Node's
``daemonEndpoints``); its credentials are the fleet config's ``credentialsFile``. Listed at
start and every ``relist``; a node that left the cluster leaves the page.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from podvisor.services.apiserver import ApiMeta, node_addresses
from podvisor.services.fleet.config import FleetConfig, NodeSpec

__all__ = ["URL_ANNOTATION", "cluster_nodes", "node_specs"]

URL_ANNOTATION = "ops.podvisor.io/url"


def node_specs(items: Iterable[dict[str, Any]], cfg: FleetConfig) -> list[NodeSpec]:
    """NodeSpecs from Node objects as the API's JSON (pure)."""
    user, password = cfg.credentials or ("admin", "")
    out = []
    for node in items:
        meta = ApiMeta.of(node)
        name = meta.name
        url = meta.annotations.get(URL_ANNOTATION, "")
        if not url:
            ip = next((address for kind, address in node_addresses(node)
                       if kind == "InternalIP" and address), None)
            if not ip:
                continue
            host = f"[{ip}]" if ":" in str(ip) else ip
            url = f"{cfg.node_ops_scheme}://{host}:{cfg.node_ops_port}"
        if name:
            out.append(NodeSpec(name, url.rstrip("/"), user, password))
    return out


def cluster_nodes(cfg: FleetConfig) -> list[NodeSpec]:
    """List the cluster's Nodes (blocking: run on a worker thread)."""
    from kubernetes import client, config

    api = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=cfg.kubeconfig)
    try:
        raw: Any = client.CoreV1Api(api).list_node(_preload_content=False)
        items = json.loads(raw.data).get("items") or []
    finally:
        api.close()
    return node_specs(items, cfg)

