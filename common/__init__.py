"""Pieces every podvisor process shares (the common layer).

Depends on nothing of podvisor's but ``podvisor.ipc``; ``supervisor`` and every subsystem under
``services`` may import it (the import contracts in ``pyproject.toml`` hold that, checked by
``lint-imports`` in ``make test``)."""

from podvisor.ipc.clock import SYSTEM_CLOCK, Clock, FakeClock, SystemClock

__all__ = ["SYSTEM_CLOCK", "Clock", "FakeClock", "SystemClock"]
