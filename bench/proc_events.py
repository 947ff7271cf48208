"""Exec events from the kernel's process connector, for bench/pods.py (not a test).

A neutral observer for "the replacement is running": the kernel reports every execve with its
CLOCK_MONOTONIC timestamp (the clock of `time.monotonic()`), so podvisor and supervisord are
timed by the same witness, and neither is polled (polling an agent 1,000 times a second loads the
very process being timed). Needs CAP_NET_ADMIN (root); `ExecWatcher.open()` returns None
otherwise and the bench falls back to polling.

Wire format (linux/connector.h, linux/cn_proc.h): nlmsghdr (16 bytes) + cn_msg (20 bytes) +
proc_event {u32 what, u32 cpu, u64 timestamp_ns, union {...}}; for PROC_EVENT_EXEC the union
starts with {pid_t process_pid, pid_t process_tgid}.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_EVENT_EXEC = 0x00000002
NLMSG_DONE = 3
_NLMSGHDR = struct.Struct("=IHHII")
_CN_MSG = struct.Struct("=IIIIHH")
_EVENT = struct.Struct("=IIQ")
_EXEC = struct.Struct("=ii")


@dataclass(frozen=True)
class Exec:
    ts: float  # CLOCK_MONOTONIC seconds (time.monotonic())
    pid: int
    argv: tuple[str, ...]


def _argv(pid: int) -> tuple[str, ...]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


class ExecWatcher:
    """Records every exec on the machine (timestamp, pid, argv) on a reader thread."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._cond = threading.Condition()
        self._execs: list[Exec] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._read, name="proc-connector", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls) -> ExecWatcher | None:
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
            sock.bind((os.getpid(), CN_IDX_PROC))
            body = struct.pack("=I", PROC_CN_MCAST_LISTEN)
            cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(body), 0)
            hdr = _NLMSGHDR.pack(_NLMSGHDR.size + len(cn) + len(body), NLMSG_DONE, 0, 0,
                                 os.getpid())
            sock.send(hdr + cn + body)
        except OSError:
            return None
        sock.settimeout(0.2)
        return cls(sock)

    def _read(self) -> None:
        offset = _NLMSGHDR.size + _CN_MSG.size
        while not self._stopped:
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            if len(data) < offset + _EVENT.size + _EXEC.size:
                continue
            what, _cpu, ts_ns = _EVENT.unpack_from(data, offset)
            if what != PROC_EVENT_EXEC:
                continue
            pid, _tgid = _EXEC.unpack_from(data, offset + _EVENT.size)
            record = Exec(ts_ns / 1e9, pid, _argv(pid))
            with self._cond:
                self._execs.append(record)
                self._cond.notify_all()

    def wait(self, match: Callable[[Exec], bool], after: float, timeout: float) -> Exec:
        """The first exec at or after `after` (monotonic) that `match`es."""
        deadline = time.monotonic() + timeout

        def found() -> Exec | None:
            return next((e for e in self._execs if e.ts >= after and match(e)), None)
        with self._cond:
            hit = self._cond.wait_for(found, max(0.0, deadline - time.monotonic()))
            self._execs = [e for e in self._execs if e.ts >= after]
        if hit is None:
            raise TimeoutError(f"no matching exec within {timeout} s")
        return hit

    def close(self) -> None:
        self._stopped = True
        self._thread.join(1.0)
        with contextlib.suppress(OSError):
            self._sock.close()
