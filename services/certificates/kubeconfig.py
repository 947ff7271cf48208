"""The node's kubeconfig files, read and written as the kubelet does (issue 26).

``read_kubeconfig`` flattens the current context (cluster and user, relative paths made
absolute against the file's folder). ``write_kubeconfig`` writes what
``writeKubeconfigFromBootstrapping`` writes: the cluster of the bootstrap kubeconfig (server, CA
file or CA data) and a user whose ``client-certificate`` and ``client-key`` are both
``<certDir>/kubelet-client-current.pem``; atomically (tmp + fsync + rename, mode 0600), so a
reader sees the old file or the new one. Since the user names the symlink, rotation never
rewrites it.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podvisor.services.certificates.store import Pair, describe, load_pair, write_atomic

__all__ = ["Kubeconfig", "client_pair", "read_kubeconfig", "write_kubeconfig"]


@dataclass(frozen=True)
class Kubeconfig:
    path: Path
    cluster: dict[str, Any]
    user: dict[str, Any]

    def _file(self, key: str) -> Path | None:
        value = self.user.get(key)
        if not value:
            return None
        path = Path(value)
        return path if path.is_absolute() else self.path.parent / path

    @property
    def cert_file(self) -> Path | None:
        return self._file("client-certificate")

    @property
    def key_file(self) -> Path | None:
        return self._file("client-key")

    @property
    def token(self) -> str:
        return str(self.user.get("token") or "")


def read_kubeconfig(path: Path) -> Kubeconfig:
    """The current context's cluster and user (``OSError``/``ValueError``)."""
    import yaml

    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a kubeconfig")

    def named(section: str, name: str) -> dict[str, Any]:
        for entry in doc.get(section) or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                inner = entry.get(section[:-1]) or {}
                return dict(inner) if isinstance(inner, dict) else {}
        raise ValueError(f"{path}: no {section[:-1]} {name!r}")

    contexts = doc.get("contexts") or []
    current = doc.get("current-context") or (contexts[0].get("name") if contexts else "")
    context = named("contexts", str(current))
    cluster = named("clusters", str(context.get("cluster", "")))
    user = named("users", str(context.get("user", "")))
    for section in (cluster, user):
        for key in ("certificate-authority", "client-certificate", "client-key"):
            if section.get(key) and not os.path.isabs(section[key]):
                section[key] = str(path.parent / section[key])
    return Kubeconfig(path, cluster, user)


def client_pair(config: Kubeconfig) -> Pair | None:
    """The client certificate the kubeconfig authenticates with, if any and readable."""
    try:
        if config.user.get("client-certificate-data"):
            cert = base64.b64decode(config.user["client-certificate-data"])
            key = base64.b64decode(config.user.get("client-key-data") or "")
            return describe(cert, key, config.path)
        if config.cert_file is not None:
            return load_pair(config.cert_file, config.key_file)
    except (OSError, ValueError):
        return None
    return None


def write_kubeconfig(path: Path, cluster: dict[str, Any], pem: Path) -> None:
    import yaml

    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "default-cluster", "cluster": {
               k: v for k, v in cluster.items()
               if k in ("server", "certificate-authority", "certificate-authority-data",
                        "insecure-skip-tls-verify", "tls-server-name")}}],
           "users": [{"name": "default-auth", "user": {
               "client-certificate": str(pem), "client-key": str(pem)}}],
           "contexts": [{"name": "default-context", "context": {
               "cluster": "default-cluster", "user": "default-auth",
               "namespace": "default"}}],
           "current-context": "default-context"}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, yaml.safe_dump(doc, sort_keys=False).encode())
