"""The runtime's network readiness, as the kubelet's ``runtimeState`` keeps it.

The CRI ``Status`` call reports conditions; ``NetworkReady=false`` (containerd without a CNI
config: "cni plugin not initialized") means sandboxes that need their own network namespace
cannot be created. The kubelet then marks the node NotReady and refuses to sync pods that are
not ``hostNetwork`` ("network is not ready: ..."), retrying them with its error back-off, while
host-network pods run as usual. podvisor does the same: the sync loop refreshes this state from
``Status`` at each housekeeping (every 2 s; the kubelet polls every 5 s) and holds the syncs of
non-hostNetwork pods while it is not ready; a sync about to create such a pod's sandbox before
the first check reads ``Status`` itself.

The same ``Status`` answer carries the runtime's handlers (``runtime_handlers``, with their
recursive read-only support): ``NetworkState.handlers`` keeps the last ones, as the kubelet's
``runtimeState.runtimeHandlers`` (runtimeclass.py reads them).

``NetworkState`` is thread-safe (pool threads refresh it, the loop thread reads it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.maps import RuntimeNetwork
from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.syncloop.runtimeclass import handlers_of

NETWORK_READY = "NetworkReady"
NOT_READY_PREFIX = "network is not ready"  # the kubelet's NetworkNotReadyErrorMsg


@dataclass(frozen=True)
class Network:
    ready: bool
    reason: str = ""
    message: str = ""

    def condition_text(self) -> str:
        """The kubelet's wording (its node condition message)."""
        if self.ready:
            return "container runtime network is ready"
        return (f"container runtime network not ready: NetworkReady=false "
                f"reason:{self.reason} message:{self.message}")

    def to_value(self) -> RuntimeNetwork:
        """The ``desired`` map's ``_runtime`` value."""
        return RuntimeNetwork(self.ready, self.reason, self.message, self.condition_text())


def network_of(resp: pb.StatusResponse) -> Network:
    """The NetworkReady condition of a Status answer; a runtime that does not report one is
    not ready (as the kubelet reads it)."""
    for cond in resp.status.conditions:
        if cond.type == NETWORK_READY:
            return Network(bool(cond.status), cond.reason, cond.message)
    return Network(False, "NetworkReadyMissing", "the runtime reports no NetworkReady condition")


class NetworkState:
    """The last known network readiness (None until the first successful ``refresh``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: Network | None = None
        self._handlers: dict[str, bool] | None = None

    @property
    def current(self) -> Network | None:
        with self._lock:
            return self._current

    def refresh(self, cri: RuntimeClient) -> Network | None:
        """Ask the runtime; returns the new state (None, and the old one kept, when the runtime
        did not answer: an unreachable runtime is the runtime back-off's business)."""
        try:
            resp = cri.status()
        except CriError:
            return None
        network = network_of(resp)
        with self._lock:
            self._current = network
            self._handlers = handlers_of(resp)
        return network

    def handlers(self, cri: RuntimeClient) -> dict[str, bool]:
        """The runtime's handlers (runtimeclass.py ``handlers_of``); asked from ``cri`` when
        not known yet (none when it does not answer)."""
        with self._lock:
            known = self._handlers
        if known is None:
            self.refresh(cri)
            with self._lock:
                known = self._handlers
        return dict(known or {})

    def not_ready(self, cri: RuntimeClient | None = None) -> Network | None:
        """The not-ready state, or None when ready. Unknown yet: asked from ``cri`` when given,
        else taken as ready (the sandbox call itself then says what is wrong)."""
        current = self.current
        if current is None and cri is not None:
            current = self.refresh(cri)
        return current if current is not None and not current.ready else None


def not_ready_error(network: Network) -> str:
    """The error a held pod's sync reports (the kubelet's wording)."""
    return f"{NOT_READY_PREFIX}: {network.condition_text()}"

