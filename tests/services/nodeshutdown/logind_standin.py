"""A private D-Bus daemon and a stand-in systemd-logind on it, for the logind path of graceful
node shutdown (this machine runs no systemd).

``DbusDaemon`` runs Debian's ``dbus-daemon`` on a unix socket in a temp dir (a session-type
bus: any client may own names; fd passing on). ``StandInLogind`` owns
``org.freedesktop.login1`` on it and follows logind's documented API (``man
org.freedesktop.login1``) as far as the kubelet (and podvisor) use it: the Manager's
``Inhibit(what, who, why, mode) -> h`` hands the caller the write end of a pipe and holds the
lock until that end is closed everywhere (EOF on its read end), the ``InhibitDelayMaxSec``
property (``t``, microseconds) through ``org.freedesktop.DBus.Properties.Get``, and the
``PrepareForShutdown(b)`` signal. It runs on its own thread (one jeepney connection, used by
that thread only); the test asks it things through thread-safe calls.
"""

from __future__ import annotations

import os
import queue
import select
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jeepney import DBusAddress, MessageType, new_error, new_method_return, new_signal
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection
from jeepney.low_level import HeaderFields

CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""
LOGIND = "org.freedesktop.login1"
MANAGER = "org.freedesktop.login1.Manager"
PATH = "/org/freedesktop/login1"


class DbusDaemon:
    """``dbus-daemon --nofork --print-address`` with a config listening in ``directory``."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        conf = directory / "bus.conf"
        conf.write_text(CONFIG.format(socket=directory / "bus.sock"))
        self.proc = subprocess.Popen(
            ["dbus-daemon", "--config-file", str(conf), "--nofork", "--print-address"],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().strip()  # printed once it listens
        if not self.address:
            self.stop()
            raise RuntimeError("dbus-daemon printed no address")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass
class Inhibitor:
    what: str
    who: str
    why: str
    mode: str
    released: bool = False


class StandInLogind:
    """logind's Manager, as much of it as graceful node shutdown uses."""

    def __init__(self, address: str, inhibit_delay_max: float) -> None:
        self.delay_usec = int(inhibit_delay_max * 1_000_000)
        self.inhibitors: list[Inhibitor] = []
        self._locks: dict[int, Inhibitor] = {}  # read end of the lock's pipe -> inhibitor
        self._asks: queue.Queue[bool] = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.conn = open_dbus_connection(address, enable_fds=True)
        reply = self.conn.send_and_get_reply(message_bus.RequestName(LOGIND), timeout=5)
        assert reply.body[0] == 1, reply.body  # DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER
        self._thread = threading.Thread(target=self._run, name="stand-in-logind", daemon=True)
        self._thread.start()

    # --- the test's side (thread-safe) -------------------------------------------------------
    def held(self) -> list[Inhibitor]:
        with self._lock:
            return [i for i in self.inhibitors if not i.released]

    def released(self) -> list[Inhibitor]:
        with self._lock:
            return [i for i in self.inhibitors if i.released]

    def prepare_for_shutdown(self, active: bool = True) -> None:
        self._asks.put(active)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for fd in self._locks:
            os.close(fd)
        self.conn.close()

    # --- logind's thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            while not self._asks.empty():
                signal = new_signal(DBusAddress(PATH, interface=MANAGER), "PrepareForShutdown",
                                    "b", (self._asks.get(),))
                self.conn.send(signal)
            ready, _, _ = select.select([self.conn.sock, *self._locks], [], [], 0.05)
            for fd in ready:
                if fd in self._locks and os.read(fd, 64) == b"":
                    with self._lock:
                        self._locks.pop(fd).released = True
                    os.close(fd)
            while True:
                try:
                    msg = self.conn.receive(timeout=0)
                except TimeoutError:
                    break
                if msg.header.message_type is MessageType.method_call:
                    self._answer(msg)

    def _answer(self, msg: Any) -> None:
        fields = msg.header.fields
        member, iface = fields.get(HeaderFields.member), fields.get(HeaderFields.interface)
        if iface == "org.freedesktop.DBus.Properties" and member == "Get":
            if tuple(msg.body) == (MANAGER, "InhibitDelayMaxSec"):
                self.conn.send(new_method_return(msg, "v", (("t", self.delay_usec),)))
                return
        elif iface == MANAGER and member == "Inhibit":
            what, who, why, mode = msg.body
            r, w = os.pipe()
            inhibitor = Inhibitor(what, who, why, mode)
            with self._lock:
                self.inhibitors.append(inhibitor)
                self._locks[r] = inhibitor
            self.conn.send(new_method_return(msg, "h", (w,)))
            os.close(w)  # the caller's copy is now the only one: its close is the release
            return
        self.conn.send(new_error(msg, "org.freedesktop.DBus.Error.UnknownMethod"))
