"""The common layer: what every podvisor process shares.

Depends on nothing of podvisor's but ``podvisor.ipc``; ``supervisor`` and every subsystem under
``services`` may import it (the import contracts in ``pyproject.toml`` hold that, checked by
``lint-imports`` in ``make test``). Modules: ``child`` (ChildContext, its fake, StopEvent),
``service`` (the one service loop), ``web`` (aiohttp on a thread beside it), ``config``/``values``
(the config schema every process reads), ``logs`` (the logger protocol and JSON logging), the clock
(``podvisor.ipc.clock``, re-exported), ``labels`` (CRI label keys), ``endpoint``
(``runtimeEndpoint`` resolution), ``timefmt`` (RFC 3339), ``quantity`` (Kubernetes quantities),
``podlist`` (the ``/pods`` list)."""

from podvisor.common.child import ChildContext, FakeChildContext, StopEvent
from podvisor.common.config import Config
from podvisor.common.logs import EventLog, EventLogger, Log, MemoryLogger
from podvisor.ipc.clock import SYSTEM_CLOCK, Clock, FakeClock, SystemClock

__all__ = ["SYSTEM_CLOCK", "ChildContext", "Clock", "Config", "EventLog", "EventLogger",
           "FakeChildContext", "FakeClock", "Log", "MemoryLogger", "StopEvent", "SystemClock"]
