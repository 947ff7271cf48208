"""The CRI client layer: one narrow ``RuntimeClient`` interface over runtime.v1 gRPC.

- ``new_runtime_client(endpoint, timeout)``: the real client (``unix:///path``).
- ``new_instrumented_client(inner, registry)``: call/error counts and latency as Prometheus metrics.
- ``OnDemandRuntimeClient(connect)``: connected only between its first call and ``release()``
  (no gRPC threads in a process that calls the runtime once a minute).
- ``FakeRuntimeClient`` (``podvisor.services.cri.fake``): for unit tests only.
"""

from podvisor.services.cri.client import EventStream, RuntimeClient
from podvisor.services.cri.errors import CriError
from podvisor.services.cri.grpc_client import new_runtime_client, normalize_endpoint
from podvisor.services.cri.instrumented import new_instrumented_client
from podvisor.services.cri.ondemand import OnDemandRuntimeClient

__all__ = [
    "CriError",
    "EventStream",
    "OnDemandRuntimeClient",
    "RuntimeClient",
    "new_instrumented_client",
    "new_runtime_client",
    "normalize_endpoint",
]
