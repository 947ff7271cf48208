"""One certificate kept valid (issue 26): client-go's ``certificate.Manager`` for the node's
client pair and, with ``serverTLSBootstrap``, for its serving pair.

- ``rotation_deadline``: ``notBefore + lifetime x U(0.7, 0.9)`` (client-go ``jitteryDuration``:
  ``wait.Jitter(d, 0.2) - 0.3 d``), drawn once per certificate.
- ``due``: no pair, an expired one, one that does not satisfy the template (a serving
  certificate missing a node address, ``certSatisfiesTemplate``), or, with rotation on, its
  deadline passed.
- ``attempt``: the key waiting in ``<prefix>.key.tmp`` or a new one (saved there first),
  ``csr.request``, ``csr.wait`` (an hour for the bootstrap request, 15 min for a rotation:
  client-go's ``certificateWaitTimeout``; a timeout starts over with the same key), then
  ``PairStore.update`` and ``on_update`` (the kubeconfig).
- Failures back off as client-go's rotation loop: 2 s doubling, five steps (jitter 0.1), then
  every 32 s; an unreachable API server only delays (the current pair keeps serving until it
  expires). The credentials of a request come from ``connection(current)``: the node's own
  while its pair is valid, the bootstrap token's otherwise (kubelet ``clientsetFn``).
Runs as a service loop worker (``step``); ``halt`` ends a wait for a certificate at once.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from podvisor.ipc.clock import Clock
from podvisor.services.apiserver import ApiConnection, ApiError, ApiUnreachable
from podvisor.services.certificates import csr
from podvisor.services.certificates.store import Pair, PairStore

__all__ = ["Manager", "rotation_deadline", "satisfies"]

BACKOFF = (2.0, 4.0, 8.0, 16.0, 32.0)
POLL = 32.0  # after the back-off steps: wait.PollInfinite(32 s)
BOOTSTRAP_WAIT = 3600.0
ROTATION_WAIT = 900.0
NO_TEMPLATE_RETRY = 5.0


def rotation_deadline(pair: Pair, rng: Callable[[], float]) -> float:
    lifetime = pair.not_after - pair.not_before
    return pair.not_before + lifetime * (0.7 + 0.2 * rng())


def satisfies(pair: Pair, template: csr.Template) -> bool:
    """client-go ``certSatisfiesTemplate``: same CN; the template's DNS names, IPs and
    organizations all in the certificate (extra ones are fine)."""
    return (pair.common_name == template.common_name
            and set(template.dns_names) <= set(pair.dns_names)
            and set(template.ip_addresses) <= set(pair.ip_addresses)
            and set(template.organizations) <= set(pair.organizations))


@dataclass
class Manager:
    kind: str  # "client" or "server", for the logs
    store: PairStore
    template: Callable[[], csr.Template | None]
    connection: Callable[[Pair | None], ApiConnection | None]  # None: no credentials to ask
    clock: Clock
    log: Any
    rotate: bool = True
    digested_name: bool = False  # the bootstrap request's node-csr-<digest> name
    current: Callable[[], Pair | None] | None = None  # default: the store's
    on_update: Callable[[Pair], None] = lambda pair: None
    ensure: Callable[[], None] = lambda: None  # every turn (the kubeconfig after a crash)
    crash: Callable[[str], None] = lambda point: None
    rng: Callable[[], float] = random.random
    stop: threading.Event = field(default_factory=threading.Event)
    deadline: float | None = None
    _deadline_for: int | None = None  # the serial the deadline was drawn for
    failures: int = 0
    rotations: int = 0
    pending: str = ""  # the CSR waited for, for the logs and the advice
    progress: float = 0.0  # monotonic time of the last turn (the process's stall check)
    _stream: Any = None  # the CSR watch open now (``halt`` closes it)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def pair(self) -> Pair | None:
        return self.current() if self.current is not None else self.store.current()

    def due(self, pair: Pair | None, template: csr.Template, now: float) -> bool:
        if pair is None or not pair.valid_at(now) or not satisfies(pair, template):
            return True
        if not self.rotate:
            return False
        if self._deadline_for != pair.serial or self.deadline is None:
            self.deadline = rotation_deadline(pair, self.rng)
            self._deadline_for = pair.serial
            self.log.info("certificates.deadline", kind=self.kind, serial=f"{pair.serial:x}",
                          not_after=pair.not_after, rotation_deadline=self.deadline)
        return now >= self.deadline

    def next_check(self, pair: Pair | None, now: float) -> float:
        """Seconds until ``due`` may turn true by time alone."""
        if pair is None:
            return NO_TEMPLATE_RETRY
        until = [pair.not_after - now]
        if self.rotate and self.deadline is not None:
            until.append(self.deadline - now)
        return max(0.05, min(min(until), 60.0))

    def attempt(self, pair: Pair | None, template: csr.Template) -> Pair | None:
        """One request through to a stored pair; None when stopped or timed out."""
        now = self.clock.wall()
        usable = pair if pair is not None and pair.valid_at(now) else None
        conn = self.connection(usable)
        if conn is None:
            raise csr.CsrFailed(f"the {self.kind} certificate is missing or expired and there "
                                "are no credentials to request one (set bootstrapKubeconfig)")
        key = self.store.pending_key()
        if key is None:
            key = csr.new_key()
            self.store.save_pending_key(key)
        self.crash("csr.after_key")
        name = csr.digested_name(key, template) if self.digested_name else ""
        name, uid = csr.request(conn, key, template, name=name, now=now)
        self.crash("csr.after_create")
        if name != self.pending:
            self.pending = name
            self.log.info("certificates.csr_pending", kind=self.kind, csr=name,
                          signer=template.signer,
                          advice=f"kubectl certificate approve {name}")
        wait = BOOTSTRAP_WAIT if usable is None else ROTATION_WAIT
        cert = csr.wait(conn, name, uid, self.stop, self.clock.monotonic() + wait, self.clock,
                        self._watching)
        if cert is None:
            return None
        stored = self.store.update(cert, key, self.clock.wall())
        self.pending = ""
        self.rotations += 1
        self.log.info("certificates.issued", kind=self.kind, csr=name,
                      serial=f"{stored.serial:x}", not_before=stored.not_before,
                      not_after=stored.not_after, file=str(stored.path))
        self.on_update(stored)
        self.store.prune(self.clock.wall())
        return stored

    def turn(self) -> float:
        """Check and, when due, get a new pair; seconds until the next turn."""
        self.progress = self.clock.monotonic()
        try:
            self.ensure()
        except (OSError, ValueError) as exc:
            self.log.warning("certificates.ensure_failed", kind=self.kind, reason=str(exc))
        pair = self.pair()
        template = self.template()
        if template is None:
            return NO_TEMPLATE_RETRY  # the kubelet: no serving template before an address
        now = self.clock.wall()
        if not self.due(pair, template, now):
            return self.next_check(pair, now)
        try:
            got = self.attempt(pair, template)
        except (ApiError, ApiUnreachable, csr.CsrFailed, OSError, ValueError) as exc:
            if isinstance(exc, csr.CsrFailed):  # never from that request: a new key next
                self.pending = ""
                self.store.discard_pending_key()
            delay = BACKOFF[self.failures] if self.failures < len(BACKOFF) else POLL
            delay *= 1 + 0.1 * self.rng()
            self.failures += 1
            self.log.warning("certificates.request_failed", kind=self.kind, reason=str(exc),
                             retry_in=round(delay, 1), failures=self.failures)
            return delay
        if got is not None:
            self.failures = 0
        return 0.05

    def step(self, now: float) -> float | None:
        """The service loop worker's step (main.py): a turn, then the next one's time; None
        once halted."""
        if self.stop.is_set():
            return None
        return now + self.turn()

    def halt(self) -> None:
        """End the wait for a certificate at once (the process is stopping): any thread."""
        self.stop.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()

    def _watching(self, stream: Any | None) -> None:
        with self._lock:
            self._stream = stream
        if stream is not None and self.stop.is_set():
            stream.close()
