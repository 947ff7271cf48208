"""The fleet's config file (``podvisor fleet --config FLEET.yaml``).

::

    address: 127.0.0.1            # where the fleet page listens (default 127.0.0.1)
    port: 9100                    # (default 9100)
    username: admin               # the fleet page's own HTTP Basic user (default admin)
    passwordFile: fleet-password  # default: beside this file; written at random, 0600, if absent
    tlsCertFile: ...              # optional, with tlsPrivateKeyFile: HTTPS
    nodes:                        # the nodes, each its ops port and credentials
    - name: node-a
      url: http://10.0.0.1:9001
      credentialsFile: /etc/podvisor/node-a.cred   # "user:password" or a bare password (admin)
      caFile: /etc/podvisor/ca.pem                 # optional: the node's TLS CA
    kubeconfig: ~/.kube/config    # or (also): the cluster's Nodes
    nodeOpsScheme: http           #   their ops URL: the annotation ops.podvisor.io/url, else
    nodeOpsPort: 9001             #   SCHEME://<InternalIP>:PORT
    credentialsFile: all.cred     #   the credentials of nodes not listed (and the default)
    relist: 30s                   #   how often the Nodes are listed again

Relative paths are relative to the config file. Unknown keys and bad values are refused with
the key named (``FleetConfigError``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from podvisor.common.opspass import ensure_ops_password, read_credentials, read_ops_password

__all__ = ["FleetConfig", "FleetConfigError", "NodeSpec", "load_fleet_config"]

KEYS = {"address", "port", "username", "passwordFile", "tlsCertFile", "tlsPrivateKeyFile",
        "nodes", "kubeconfig", "nodeOpsScheme", "nodeOpsPort", "credentialsFile", "relist"}
NODE_KEYS = {"name", "url", "credentialsFile", "caFile"}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")


class FleetConfigError(ValueError):
    pass


@dataclass(frozen=True)
class NodeSpec:
    name: str
    url: str  # the node's ops port, http(s)://HOST:PORT
    username: str
    password: str
    ca_file: str | None = None


@dataclass(frozen=True)
class FleetConfig:
    address: str
    port: int
    username: str
    password: str
    nodes: tuple[NodeSpec, ...]
    tls_cert_file: str | None = None
    tls_private_key_file: str | None = None
    kubeconfig: str | None = None
    node_ops_scheme: str = "http"
    node_ops_port: int = 9001
    credentials: tuple[str, str] | None = None  # for the cluster's nodes
    relist: float = 30.0


def _path(base: Path, raw: object, key: str) -> Path:
    if not isinstance(raw, str) or not raw:
        raise FleetConfigError(f"{key}: want a file path, got {raw!r}")
    p = Path(raw).expanduser()
    return p if p.is_absolute() else base / p


def _creds(base: Path, raw: object, key: str) -> tuple[str, str]:
    path = _path(base, raw, key)
    try:
        return read_credentials(path)
    except (OSError, ValueError) as err:
        raise FleetConfigError(f"{key}: cannot read {path}: {err}") from None


def _duration(raw: object, key: str) -> float:
    if isinstance(raw, int | float) and not isinstance(raw, bool) and raw > 0:
        return float(raw)
    m = _DURATION.match(str(raw))
    if not m:
        raise FleetConfigError(f"{key}: want a duration such as 30s, got {raw!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def _port(raw: object, key: str) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 < raw < 65536:
        raise FleetConfigError(f"{key}: want a port number, got {raw!r}")
    return raw


def _node(base: Path, i: int, raw: object,
          default: tuple[str, str] | None) -> NodeSpec:
    key = f"nodes[{i}]"
    if not isinstance(raw, dict):
        raise FleetConfigError(f"{key}: want a mapping with name, url, credentialsFile")
    for k in raw:
        if k not in NODE_KEYS:
            raise FleetConfigError(f"{key}.{k}: unknown key")
    name, url = raw.get("name"), raw.get("url")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise FleetConfigError(f"{key}.name: want a node name, got {name!r}")
    if not isinstance(url, str) or not re.match(r"^https?://[^/]+/?$", url):
        raise FleetConfigError(f"{key}.url: want http(s)://HOST:PORT, got {url!r}")
    if "credentialsFile" in raw:
        creds = _creds(base, raw["credentialsFile"], f"{key}.credentialsFile")
    elif default is not None:
        creds = default
    else:
        raise FleetConfigError(f"{key}.credentialsFile: required (or a top-level "
                               "credentialsFile)")
    ca = str(_path(base, raw["caFile"], f"{key}.caFile")) if raw.get("caFile") else None
    return NodeSpec(name, url.rstrip("/"), creds[0], creds[1], ca)


def load_fleet_config(path: Path) -> FleetConfig:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise FleetConfigError(f"{path}: {err}") from None
    if not isinstance(raw, dict):
        raise FleetConfigError(f"{path}: want a mapping")
    for k in raw:
        if k not in KEYS:
            raise FleetConfigError(f"{k}: unknown key")
    base = path.resolve().parent
    default = _creds(base, raw["credentialsFile"], "credentialsFile") if raw.get(
        "credentialsFile") else None
    nodes_raw = raw.get("nodes") or []
    if not isinstance(nodes_raw, list):
        raise FleetConfigError("nodes: want a list")
    nodes = tuple(_node(base, i, n, default) for i, n in enumerate(nodes_raw))
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise FleetConfigError("nodes: duplicate name")
    kubeconfig = str(_path(base, raw["kubeconfig"], "kubeconfig")) if raw.get(
        "kubeconfig") else None
    if not nodes and kubeconfig is None:
        raise FleetConfigError("nodes: list the nodes, or give a kubeconfig")
    if kubeconfig is not None and default is None:
        raise FleetConfigError("credentialsFile: required with kubeconfig (the nodes' "
                               "credentials)")
    scheme = str(raw.get("nodeOpsScheme", "http"))
    if scheme not in ("http", "https"):
        raise FleetConfigError(f"nodeOpsScheme: want http or https, got {scheme!r}")
    pw_path = _path(base, raw.get("passwordFile", "fleet-password"), "passwordFile")
    try:
        ensure_ops_password(pw_path)
        password = read_ops_password(pw_path)
    except (OSError, ValueError) as err:
        raise FleetConfigError(f"passwordFile: {pw_path}: {err}") from None
    cert, key = raw.get("tlsCertFile"), raw.get("tlsPrivateKeyFile")
    if bool(cert) != bool(key):
        raise FleetConfigError("tlsCertFile: give both tlsCertFile and tlsPrivateKeyFile")
    username = raw.get("username", "admin")
    if not isinstance(username, str) or not username or ":" in username:
        raise FleetConfigError(f"username: want a user name, got {username!r}")
    address = raw.get("address", "127.0.0.1")
    if not isinstance(address, str) or not address:
        raise FleetConfigError(f"address: want an address, got {address!r}")
    out: dict[str, Any] = {
        "address": address, "port": _port(raw.get("port", 9100), "port"),
        "username": username, "password": password, "nodes": nodes,
        "tls_cert_file": str(_path(base, cert, "tlsCertFile")) if cert else None,
        "tls_private_key_file": str(_path(base, key, "tlsPrivateKeyFile")) if key else None,
        "kubeconfig": kubeconfig, "node_ops_scheme": scheme,
        "node_ops_port": _port(raw.get("nodeOpsPort", 9001), "nodeOpsPort"),
        "credentials": default, "relist": _duration(raw.get("relist", "30s"), "relist"),
    }
    return FleetConfig(**out)
