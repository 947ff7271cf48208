"""The engine's indexes: the lookups CRI calls need without scanning every record.

A kubelet lists a pod's sandboxes and containers by the ``io.kubernetes.pod.uid`` label (every
sync, every pod), checks name reservations on each create, and asks for a sandbox's containers;
with 200 pods each of those was a scan of all records. Guarded by the engine's lock.
"""

from __future__ import annotations

from cri_api.v1 import api_pb2 as pb

from podvisor.common import labels
from podvisor.services.runtime.model import Container, Sandbox

POD_UID_LABEL = labels.POD_UID
ID_LENGTH = 64  # secrets.token_hex(32): a filter ID this long is a full ID, not a prefix


def sandbox_name(config: pb.PodSandboxConfig) -> tuple[str, str, str, int]:
    m = config.metadata
    return (m.name, m.namespace, m.uid, m.attempt)


def container_name(c: Container) -> tuple[str, str, int]:
    return (c.sandbox_id, c.config.metadata.name, c.config.metadata.attempt)


class Index:
    """Lookups the CRI calls need without scanning every record; guarded by the engine's lock.
    Dicts used as ordered sets (creation order, like the maps they index). A name is reserved
    (``*_names``) before its record's files are written, outside the lock."""

    def __init__(self) -> None:
        self.sandbox_names: dict[tuple[str, str, str, int], str] = {}
        self.container_names: dict[tuple[str, str, int], str] = {}  # (sandbox, name, attempt)
        self.sandboxes_by_uid: dict[str, dict[str, None]] = {}
        self.containers_by_uid: dict[str, dict[str, None]] = {}
        self.by_sandbox: dict[str, dict[str, None]] = {}

    def add_sandbox(self, sb: Sandbox) -> None:
        self.sandbox_names[sandbox_name(sb.config)] = sb.id
        _add(self.sandboxes_by_uid, sb.config.labels.get(POD_UID_LABEL), sb.id)

    def remove_sandbox(self, sb: Sandbox) -> None:
        if self.sandbox_names.get(sandbox_name(sb.config)) == sb.id:
            del self.sandbox_names[sandbox_name(sb.config)]
        _discard(self.sandboxes_by_uid, sb.config.labels.get(POD_UID_LABEL), sb.id)

    def add_container(self, c: Container) -> None:
        self.container_names[container_name(c)] = c.id
        _add(self.containers_by_uid, c.config.labels.get(POD_UID_LABEL), c.id)
        _add(self.by_sandbox, c.sandbox_id, c.id)

    def remove_container(self, c: Container) -> None:
        if self.container_names.get(container_name(c)) == c.id:
            del self.container_names[container_name(c)]
        _discard(self.containers_by_uid, c.config.labels.get(POD_UID_LABEL), c.id)
        _discard(self.by_sandbox, c.sandbox_id, c.id)


def _add(index: dict[str, dict[str, None]], key: str | None, item: str) -> None:
    if key is not None:
        index.setdefault(key, {})[item] = None


def _discard(index: dict[str, dict[str, None]], key: str | None, item: str) -> None:
    if key is None or key not in index:
        return
    index[key].pop(item, None)
    if not index[key]:
        del index[key]
