"""CSI drivers found through the kubelet's plugin-registration socket folder
(``<rootDir>/plugins_registry``), as the kubelet's plugin watcher and csi plugin do.

Each socket there serves the ``pluginregistration.Registration`` service (the driver's
node-driver-registrar): ``GetInfo`` names the plugin (type ``CSIPlugin``, its name, its CSI
endpoint: the socket itself when empty, the CSI versions it speaks: one ``1.x`` needed); the
driver is then asked ``NodeGetInfo`` on that endpoint, the node's CSINode object gets its entry
(``nodeID``, ``topologyKeys``, ``allocatable.count`` from ``max_volumes_per_node``), the Node
its ``csi.volume.kubernetes.io/nodeid`` annotation and topology labels, and the plugin is told
``NotifyRegistrationStatus`` (registered, or the error). A socket that goes away deregisters
its driver (its CSINode entry and annotation are removed). The folder is listed at every pass
(a plain relist: no inotify here). The first pass also drops CSINode entries of drivers with
no socket (registered before a restart, gone since).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from podvisor.services.volumes.apitypes import dig
from podvisor.services.volumes.csiclient import CsiClient, CsiError, NodeInfo
from podvisor.services.volumes.stubs import pluginregistration_pb2 as regpb
from podvisor.services.volumes.stubs import pluginregistration_pb2_grpc as regrpc

CSI_PLUGIN = "CSIPlugin"
NODE_ID_ANNOTATION = "csi.volume.kubernetes.io/nodeid"
STORAGE = "/apis/storage.k8s.io/v1"
DIAL_TIMEOUT = 10.0
RETRY, RETRY_MAX = 2.0, 30.0


class NodeApi(Protocol):
    def get(self, path: str) -> Mapping[str, Any] | None: ...

    def create(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...

    def replace(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """PUT; raises OSError (a 409 among them: the caller reads again)."""
        ...

    def merge_patch(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...


@dataclass
class Registered:
    name: str
    endpoint: str
    socket: str
    client: CsiClient
    info: NodeInfo


def _supported(versions: list[str]) -> bool:
    return any(v.lstrip("v").split(".")[0] == "1" for v in versions)


class Registry:
    """The registered drivers (``client(name)``) and their socket folder's watcher. ``scan``
    belongs to one thread (the volume manager's worker); ``client`` may be read from it."""

    def __init__(self, folder: Path, node: str, api: NodeApi | None,
                 log: Callable[..., None] = lambda event, **fields: None) -> None:
        self.folder = folder
        self.node = node
        self.api = api
        self.log = log
        self.drivers: dict[str, Registered] = {}
        # socket -> (the error it was told, when to try again: None = never, a refusal)
        self._failed: dict[str, tuple[str, float | None, float]] = {}
        self._pruned = False

    def client(self, driver: str) -> CsiClient:
        found = self.drivers.get(driver)
        if found is None:
            raise LookupError(driver)
        return found.client

    def close(self) -> None:
        for found in self.drivers.values():
            found.client.close()

    def sockets(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.folder))
        except OSError:
            return []
        out = []
        for name in names:
            path = str(self.folder / name)
            try:
                if not name.startswith(".") and stat.S_ISSOCK(os.stat(path).st_mode):
                    out.append(path)
            except OSError:
                continue
        return out

    def scan(self, now: float) -> bool:
        """One pass: register new sockets (and retry those whose registration failed for a
        passing reason: the API server or the driver not answering, 2 s doubling to 30 s),
        deregister gone ones. True when a driver came or went."""
        present = set(self.sockets())
        changed = False
        for name, found in list(self.drivers.items()):
            if found.socket not in present:
                self._deregister(name)
                changed = True
        self._failed = {s: e for s, e in self._failed.items() if s in present}
        known = {f.socket for f in self.drivers.values()} | {
            s for s, (_, at, _) in self._failed.items() if at is None or now < at}
        for socket in sorted(present - known):
            changed = self._register(socket, now) or changed
        if not self._pruned and self.api is not None:
            self._pruned = self._prune()
        return changed

    def _register(self, socket: str, now: float) -> bool:
        channel = grpc.insecure_channel(f"unix://{socket}")
        try:
            stub = regrpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            try:
                info = stub.GetInfo(regpb.InfoRequest(), timeout=DIAL_TIMEOUT)
            except grpc.RpcError as err:
                self.log("volumes.plugin.unreachable", socket=socket, error=str(err.details()
                         if hasattr(err, "details") else err))
                return False  # asked again at the next pass
            error = self._admit(info)
            passing = False  # a refusal is for good; a failure to finish is retried
            client: CsiClient | None = None
            node_info: NodeInfo | None = None
            if not error:
                endpoint = info.endpoint or socket
                client = CsiClient(endpoint)
                try:
                    node_info = client.node_info()
                    self._add_to_node(info.name, node_info)
                except (CsiError, OSError) as err:
                    error = f"RegisterPlugin error -- plugin registration failed with err: {err}"
                    passing = True
                    client.close()
                    client = None
            with contextlib.suppress(grpc.RpcError):  # told again at its next registration
                stub.NotifyRegistrationStatus(regpb.RegistrationStatus(
                    plugin_registered=not error, error=error), timeout=DIAL_TIMEOUT)
        finally:
            channel.close()
        if error or client is None or node_info is None:
            before = self._failed.get(socket)
            delay = min(before[2] * 2, RETRY_MAX) if before is not None else RETRY
            self._failed[socket] = (error, now + delay if passing else None, delay)
            self.log("volumes.plugin.refused", socket=socket, plugin=info.name, error=error,
                     retry_in=delay if passing else None)
            return False
        self.drivers[info.name] = Registered(info.name, info.endpoint or socket, socket, client,
                                             node_info)
        self.log("volumes.plugin.registered", plugin=info.name, endpoint=info.endpoint or socket,
                 node_id=node_info.node_id)
        return True

    def _admit(self, info: regpb.PluginInfo) -> str:
        if info.type != CSI_PLUGIN:
            return f"plugin type {info.type!r} is not supported (podvisor takes {CSI_PLUGIN})"
        if not info.name:
            return "the plugin has no name"
        if not _supported(list(info.supported_versions)):
            return (f"none of the versions specified {list(info.supported_versions)} are "
                    "supported (podvisor speaks CSI 1.x)")
        if info.name in self.drivers:
            return f"a plugin named {info.name!r} is already registered"
        return ""

    def _deregister(self, name: str) -> None:
        found = self.drivers.pop(name)
        found.client.close()
        try:
            self._remove_from_node(name)
        except OSError as err:
            self.log("volumes.plugin.deregister_failed", plugin=name, error=str(err))
        self.log("volumes.plugin.deregistered", plugin=name)

    # -- the CSINode and Node ----------------------------------------------------------------
    def _csinode_path(self) -> str:
        return f"{STORAGE}/csinodes/{self.node}"

    def ensure_csinode(self) -> Mapping[str, Any]:
        """The node's CSINode (made, owned by the Node, when missing)."""
        assert self.api is not None
        found = self.api.get(self._csinode_path())
        if found is not None:
            return found
        node = self.api.get(f"/api/v1/nodes/{self.node}")
        owner = [{"apiVersion": "v1", "kind": "Node", "name": self.node,
                  "uid": str(dig(node, "metadata", "uid") or "")}] if node is not None else []
        return self.api.create(f"{STORAGE}/csinodes", {
            "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": self.node, **({"ownerReferences": owner} if owner else {})},
            "spec": {"drivers": []}})

    def _update_csinode(self, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
                        ) -> None:
        assert self.api is not None
        for attempt in range(3):
            obj = dict(self.ensure_csinode())
            drivers = dig(obj, "spec", "drivers")
            new = change([dict(d) for d in drivers] if isinstance(drivers, list) else [])
            if new == drivers:
                return
            obj["spec"] = {**(obj.get("spec") or {}), "drivers": new}
            try:
                self.api.replace(self._csinode_path(), obj)
                return
            except OSError:
                if attempt == 2:
                    raise

    def _add_to_node(self, name: str, info: NodeInfo) -> None:
        if self.api is None:
            return
        entry: dict[str, Any] = {"name": name, "nodeID": info.node_id,
                                 "topologyKeys": sorted(info.topology) or None}
        if info.max_volumes > 0:
            entry["allocatable"] = {"count": info.max_volumes}
        entry = {k: v for k, v in entry.items() if v is not None}
        self._update_csinode(lambda drivers: [*(d for d in drivers if d.get("name") != name),
                                              entry])
        ids = self._node_ids()
        ids[name] = info.node_id
        self.api.merge_patch(f"/api/v1/nodes/{self.node}", {"metadata": {
            "annotations": {NODE_ID_ANNOTATION: json.dumps(ids, sort_keys=True)},
            **({"labels": dict(info.topology)} if info.topology else {})}})

    def _node_ids(self) -> dict[str, str]:
        assert self.api is not None
        node = self.api.get(f"/api/v1/nodes/{self.node}")
        raw = dig(node, "metadata", "annotations", NODE_ID_ANNOTATION)
        try:
            ids = json.loads(raw) if isinstance(raw, str) else {}
        except ValueError:
            ids = {}
        return {str(k): str(v) for k, v in ids.items()} if isinstance(ids, dict) else {}

    def _remove_from_node(self, name: str) -> None:
        if self.api is None:
            return
        self._update_csinode(lambda drivers: [d for d in drivers if d.get("name") != name])
        ids = self._node_ids()
        if ids.pop(name, None) is not None:
            self.api.merge_patch(f"/api/v1/nodes/{self.node}", {"metadata": {"annotations": {
                NODE_ID_ANNOTATION: json.dumps(ids, sort_keys=True) if ids else None}}})

    def _prune(self) -> bool:
        """Drop CSINode entries of drivers not registered now (True when done)."""
        try:
            self._update_csinode(lambda drivers: [d for d in drivers
                                                  if d.get("name") in self.drivers])
        except OSError as err:
            self.log("volumes.csinode.failed", error=str(err))
            return False
        return True
