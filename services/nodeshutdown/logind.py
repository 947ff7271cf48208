"""systemd-logind's delay inhibitor lock over D-Bus (the kubelet's ``systemd/inhibit_linux.go``),
with jeepney (pure Python: no libdbus, no GLib).

``connect_logind()`` opens the system bus (``DBUS_SYSTEM_BUS_ADDRESS``, else
``/run/dbus/system_bus_socket``) and returns None when it is not there or no
``org.freedesktop.login1`` owns a name on it (this machine: no systemd): then graceful node
shutdown is only ``podvisorctl shutdown --node`` or SIGTERM with ``shutdownOnSignal``.
``Logind.inhibit()`` takes the lock (what ``shutdown``, mode ``delay``, who ``podvisor``):
logind hands a file descriptor and holds the machine's shutdown until it is closed or
``InhibitDelayMaxSec`` passes; ``prepare_for_shutdown()`` reads the bus without blocking and
says whether ``PrepareForShutdown(true)`` came. Not thread-safe: one thread (the service loop's).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from jeepney import DBusAddress, MatchRule, MessageType, new_method_call
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import DBusConnection, open_dbus_connection
from jeepney.low_level import HeaderFields
from jeepney.wrappers import Properties

__all__ = ["INHIBIT_WHO", "INHIBIT_WHY", "Logind", "connect_logind"]

LOGIND = "org.freedesktop.login1"
MANAGER = "org.freedesktop.login1.Manager"
PATH = "/org/freedesktop/login1"
INHIBIT_WHO = "podvisor"
INHIBIT_WHY = "podvisor needs time for critical node shutdown"
TIMEOUT = 5.0
DRAIN_MAX = 100  # messages read per wake-up


class Logind:
    """A connection to logind's Manager on the system bus."""

    def __init__(self, conn: DBusConnection) -> None:
        self.conn = conn
        self.addr = DBusAddress(PATH, bus_name=LOGIND, interface=MANAGER)
        self.lock_fd: int | None = None
        rule = MatchRule(type="signal", interface=MANAGER, member="PrepareForShutdown",
                         path=PATH)
        conn.send_and_get_reply(message_bus.AddMatch(rule), timeout=TIMEOUT)

    def fileno(self) -> int:
        """Readable when a message (a signal) is in."""
        return int(self.conn.sock.fileno())

    def inhibit_delay_max(self) -> float:
        """``InhibitDelayMaxSec`` in seconds (the property is in microseconds)."""
        reply = self.conn.send_and_get_reply(Properties(self.addr).get("InhibitDelayMaxSec"),
                                             timeout=TIMEOUT)
        _sig, usec = reply.body[0]
        return int(usec) / 1e6

    def inhibit(self) -> None:
        """Take the delay lock (again: a lock already held stays)."""
        if self.lock_fd is not None:
            return
        msg = new_method_call(self.addr, "Inhibit", "ssss",
                              ("shutdown", INHIBIT_WHO, INHIBIT_WHY, "delay"))
        reply = self.conn.send_and_get_reply(msg, timeout=TIMEOUT)
        if reply.header.message_type is MessageType.error:
            raise OSError(f"logind Inhibit failed: {reply.body}")
        self.lock_fd = reply.body[0].to_raw_fd()

    def release(self) -> None:
        """Close the lock's fd: logind goes on with the shutdown."""
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    def prepare_for_shutdown(self) -> bool | None:
        """Drain what arrived: True/False for the last ``PrepareForShutdown(b)``, None if
        none came."""
        seen: bool | None = None
        for _ in range(DRAIN_MAX):  # bounded: the service loop polls the fd again
            try:
                msg: Any = self.conn.receive(timeout=0)
            except TimeoutError:
                break
            fields = msg.header.fields
            if msg.header.message_type is MessageType.signal and \
                    fields.get(HeaderFields.member) == "PrepareForShutdown":
                seen = bool(msg.body[0])
        return seen

    def close(self) -> None:
        self.release()
        with contextlib.suppress(OSError):
            self.conn.close()


def connect_logind(bus: str = "SYSTEM") -> Logind | None:
    """logind on the system bus, or None when there is no bus or no logind on it."""
    try:
        conn = open_dbus_connection(bus, enable_fds=True)
    except (OSError, ValueError, KeyError):
        return None
    try:
        reply = conn.send_and_get_reply(message_bus.NameHasOwner(LOGIND), timeout=TIMEOUT)
        if not reply.body[0]:
            conn.close()
            return None
        return Logind(conn)
    except (OSError, TimeoutError):
        conn.close()
        return None
