"""Events to the API server as core/v1 Events, aggregated and rate-limited like client-go's
EventCorrelator (``tools/record/events_cache.go``):

- **Aggregation**: an event equal to one sent within ``AGGREGATE_WINDOW`` (10 min) -- same
  involved object, type, reason, message, source -- is not created again: the existing Event
  is merge-PATCHed with the new ``count`` and ``lastTimestamp``.
- **Spam filter**: a token bucket per (source, involved object): burst 25, one token every
  5 min; an event without a token is dropped (counted in ``dropped``).
The involved object is the event's pod (kind Pod, its namespace, name and UID), or the Node for
node-level events and manifests (which are not API objects; the file goes into the message).
Times come in as parameters; ``send`` raises ``ApiUnreachable`` (the caller retries later).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from podvisor.common.timefmt import rfc3339
from podvisor.services.apiserver import MERGE_PATCH, ApiConnection, ApiError

AGGREGATE_WINDOW = 600.0
BURST = 25
REFILL = 300.0  # seconds per token


@dataclass
class _Sent:
    name: str
    namespace: str
    count: int
    first: float
    last: float


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class ApiEventSink:
    conn: ApiConnection
    node: str
    node_uid: str = ""
    sent: dict[tuple[Any, ...], _Sent] = field(default_factory=dict)
    buckets: dict[tuple[Any, ...], _Bucket] = field(default_factory=dict)
    dropped: int = 0
    posted: int = 0
    patched: int = 0

    def involved(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj.get("kind") == "Pod" and obj.get("name"):
            out = {"kind": "Pod", "apiVersion": "v1", "name": obj["name"],
                   "namespace": obj.get("namespace") or "default"}
            if obj.get("uid"):
                out["uid"] = obj["uid"]
            if obj.get("fieldPath"):
                out["fieldPath"] = obj["fieldPath"]
            return out
        return {"kind": "Node", "apiVersion": "v1", "name": self.node, "namespace": "",
                **({"uid": self.node_uid} if self.node_uid else {})}

    def _allow(self, key: tuple[Any, ...], now: float) -> bool:
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = _Bucket(BURST, now)
        bucket.tokens = min(BURST, bucket.tokens + (now - bucket.at) / REFILL)
        bucket.at = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def send(self, event: dict[str, Any], now: float) -> str:
        """Create or count up one event; returns "created", "counted", "dropped" or
        "rejected"."""
        obj = event.get("object") or {}
        involved = self.involved(obj)
        message = str(event.get("message", ""))
        if involved["kind"] == "Node" and obj.get("file"):
            message = f"{obj['file']}: {message}"
        ident = tuple(sorted((k, str(v)) for k, v in involved.items()))
        key = (ident, event.get("type"), event.get("reason"), message, event.get("source"))
        for k in [k for k, s in self.sent.items() if now - s.last > AGGREGATE_WINDOW]:
            del self.sent[k]
        if not self._allow((event.get("source"), ident), now):
            self.dropped += 1
            return "dropped"
        count = max(1, int(event.get("count", 1)))
        ns = involved["namespace"] or "default"
        previous = self.sent.get(key)
        if previous is not None:
            previous.count += count
            previous.last = now
            try:
                self.conn.request("PATCH", f"/api/v1/namespaces/{previous.namespace}/events/"
                                  f"{previous.name}", content_type=MERGE_PATCH,
                                  body={"count": previous.count,
                                        "lastTimestamp": rfc3339(now)})
                self.patched += 1
                return "counted"
            except ApiError:
                del self.sent[key]  # gone (TTL'd by the server): create it again
        name = f"{involved['name']}.{int(now * 1e9) + self.posted:x}"  # unique per sink
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": name, "namespace": ns},
                "involvedObject": involved, "reason": event.get("reason", ""),
                "message": message, "type": event.get("type", "Normal"),
                "source": {"component": "kubelet", "host": self.node},
                "reportingComponent": "kubelet", "reportingInstance": self.node,
                "firstTimestamp": rfc3339(now), "lastTimestamp": rfc3339(now), "count": count}
        try:
            self.conn.request("POST", f"/api/v1/namespaces/{ns}/events", body=body)
        except ApiError:
            return "rejected"  # e.g. the namespace is gone: nothing to retry
        self.sent[key] = _Sent(name, ns, count, now, now)
        self.posted += 1
        return "created"
