"""The Node's life in the API server: registration, status reports and the node Lease.

- ``register()``: reads the API server's ``/version`` first (``version.py``: the kubeletVersion
  the skew policy allows; an API server too old is refused, ``SkewRefused``), then POSTs the
  Node with its labels (``nodeLabels`` + the kubelet's own), ``registerWithTaints`` and
  ``providerID``; ``409 AlreadyExists`` (a restart, or a node that was there before)
  reconciles, as the kubelet does, only its default labels (hostname, os, arch): nodeLabels,
  taints and providerID are registration-time settings.
- ``report_status(now)``: the status is computed every ``nodeStatusUpdateFrequency``; it is
  PATCHed (strategic merge on ``nodes/<name>/status``) when it changed (heartbeat times aside)
  or when the last report is ``nodeStatusReportFrequency`` old; up to 5 tries per turn.
- ``renew_lease(now)``: ``kube-node-lease/<node>`` with ``holderIdentity`` = node,
  ``leaseDurationSeconds``, owned by the Node; renewed by PUT with its resourceVersion (a 409
  re-reads it and tries once more), created when missing.
Times come in as parameters (wall seconds): the caller reads the clock.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from podvisor.common.timefmt import rfc3339, rfc3339_micro
from podvisor.services.apiserver import (
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    ApiConnection,
    ApiError,
    ApiMeta,
    ApiUnreachable,
)
from podvisor.services.node.status import (
    MachineFacts,
    NodeShape,
    RuntimeFacts,
    default_labels,
    new_node,
    node_status,
    pressure_taints,
    with_times,
)
from podvisor.services.node.version import VersionChoice, choose

Obj = dict[str, Any]
STATUS_TRIES = 5
LEASE_NS = "kube-node-lease"


@dataclass
class NodeSettings:
    name: str
    max_pods: int = 110
    port: int = 10250
    report_frequency: float = 300.0
    lease_duration: int = 40
    shape: NodeShape = field(default_factory=NodeShape)


@dataclass
class NodeAgent:
    conn: ApiConnection
    settings: NodeSettings
    machine: Callable[[], MachineFacts]  # read once, on first use (after the API answers)
    runtime: Callable[[], RuntimeFacts]
    log: Any
    version: VersionChoice | None = None
    _facts: MachineFacts | None = None
    uid: str = ""
    registered: bool = False
    reported: Obj | None = None  # the last status PATCHed (with times)
    reported_at: float = float("-inf")
    lease: Obj | None = None
    counters: dict[str, int] = field(default_factory=lambda: {
        "status_patches": 0, "lease_renewals": 0})
    # the node conditions the eviction manager holds True (its ``pressure`` map)
    pressure: Callable[[], Sequence[str]] = lambda: ()
    tainted: tuple[str, ...] | None = None  # the pressure the Node's taints last matched

    @property
    def _path(self) -> str:
        return f"/api/v1/nodes/{self.settings.name}"

    @property
    def facts(self) -> MachineFacts:
        if self._facts is None:
            self._facts = self.machine()
        return self._facts

    def check_version(self) -> VersionChoice:
        """The kubeletVersion for this API server (raises ``SkewRefused``)."""
        choice = choose(self.conn.request("GET", "/version"))
        if self.version is None or choice != self.version:
            self.log.info("node.version", node=self.settings.name,
                          kubelet_version=choice.kubelet_version, api_server=choice.server)
            if choice.warning:
                self.log.warning("node.version_skew", node=self.settings.name,
                                 reason=choice.warning)
        self.version = choice
        return choice

    def register(self) -> None:
        self.check_version()
        body = new_node(self.settings.name, self.facts, self.settings.shape)
        try:
            node = self.conn.request("POST", "/api/v1/nodes", body=body)
            self.log.info("node.registered", node=self.settings.name)
        except ApiError as exc:
            if exc.status != 409:
                raise
            labels = default_labels(self.settings.name, self.facts)
            node = self.conn.request("PATCH", self._path, body={"metadata": {"labels": labels}},
                                     content_type=MERGE_PATCH)
            self.log.info("node.reconciled", node=self.settings.name)
        self.uid = ApiMeta.of(node).uid
        self.reported = node.get("status") or None
        self.registered = True

    def report_status(self, now: float) -> bool:
        """Compute the status; PATCH it when due. True when a PATCH went through."""
        version = self.version or self.check_version()
        pressure = tuple(self.pressure())
        computed = node_status(self.settings.name, self.facts, self.runtime(),
                               max_pods=self.settings.max_pods, port=self.settings.port,
                               kubelet_version=version.kubelet_version,
                               shape=self.settings.shape, pressure=pressure)
        if pressure != self.tainted:
            self.sync_taints(pressure)
        before = self.reported or {}
        changed = _strip_times(computed) != _strip_times({k: before.get(k) for k in computed})
        if not changed and now - self.reported_at < self.settings.report_frequency:
            return False
        status = with_times(computed, self.reported, rfc3339(now))
        error: Exception | None = None
        for _ in range(STATUS_TRIES):
            try:
                node = self.conn.request("PATCH", self._path + "/status",
                                         body={"status": status},
                                         content_type=STRATEGIC_MERGE_PATCH)
            except ApiUnreachable as exc:
                raise exc
            except ApiError as exc:
                error = exc
                if exc.status == 404:  # the Node was deleted: register again
                    self.registered = False
                    raise
                continue
            self.reported = node.get("status") or status
            self.reported_at = now
            self.counters["status_patches"] += 1
            if changed:
                ready = next(c for c in status["conditions"] if c["type"] == "Ready")
                self.log.info("node.status", node=self.settings.name, ready=ready["status"],
                              reason=ready["reason"])
            return True
        assert error is not None
        raise error

    def sync_taints(self, pressure: tuple[str, ...]) -> None:
        """The Node's pressure taints (``node.kubernetes.io/memory-pressure`` etc.,
        NoSchedule) as ``pressure`` says, other taints untouched: the node lifecycle
        controller's taint-by-condition, done here so a node without that controller (the
        tests' API server) is tainted too. A conflict (someone wrote the Node meanwhile) is
        retried at the next status turn."""
        node = self.conn.request("GET", self._path)
        spec = node.get("spec")
        taints = spec.get("taints") if isinstance(spec, dict) else None
        taints = taints if isinstance(taints, list) else []
        wanted = pressure_taints(taints, pressure)
        if wanted != taints:
            try:
                self.conn.request("PATCH", self._path, content_type=MERGE_PATCH, body={
                    "metadata": {"resourceVersion": ApiMeta.of(node).resource_version},
                    "spec": {"taints": wanted or None}})
            except ApiError as exc:
                if exc.status != 409:
                    raise
                return
            self.log.info("node.taints", node=self.settings.name,
                          taints=[t["key"] for t in wanted], pressure=list(pressure))
        self.tainted = pressure

    def renew_lease(self, now: float) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{self.settings.name}"
        for attempt in range(2):
            if self.lease is None:
                try:
                    self.lease = self.conn.request("GET", path)
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    self.lease = self._create_lease(now)
                    self.counters["lease_renewals"] += 1
                    return
            lease = copy.deepcopy(self.lease)
            spec = lease.setdefault("spec", {})
            spec["holderIdentity"] = self.settings.name
            spec["leaseDurationSeconds"] = self.settings.lease_duration
            spec["renewTime"] = rfc3339_micro(now)
            if self.uid:
                lease.setdefault("metadata", {})["ownerReferences"] = [self._owner()]
            try:
                self.lease = self.conn.request("PUT", path, body=lease)
                self.counters["lease_renewals"] += 1
                return
            except ApiError as exc:
                self.lease = None  # re-read it
                if exc.status not in (409, 404) or attempt:
                    raise

    def _owner(self) -> Obj:
        return {"apiVersion": "v1", "kind": "Node", "name": self.settings.name,
                "uid": self.uid}

    def _create_lease(self, now: float) -> Obj:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.settings.name, "namespace": LEASE_NS,
                             **({"ownerReferences": [self._owner()]} if self.uid else {})},
                "spec": {"holderIdentity": self.settings.name,
                         "leaseDurationSeconds": self.settings.lease_duration,
                         "renewTime": rfc3339_micro(now)}}
        return self.conn.request(
            "POST", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases", body=body)


def _strip_times(status: Obj) -> Obj:
    out = dict(status)
    out["conditions"] = sorted(({k: v for k, v in c.items()
                                 if k not in ("lastHeartbeatTime", "lastTransitionTime")}
                                for c in status.get("conditions") or []),
                               key=lambda c: str(c.get("type")))
    for key in ("images", "volumesInUse", "volumesAttached", "phase"):
        out.pop(key, None)
    return out
