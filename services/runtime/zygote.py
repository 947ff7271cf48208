"""The zygote: a small pre-started, single-threaded process that forks container monitors.

Forking a monitor straight from the runtime would fork a multi-threaded gRPC process; starting a
fresh Python per container would cost tens of milliseconds. So the runtime starts this helper once
(``python -m podvisor.services.runtime.zygote FD``), connected by a SOCK_SEQPACKET socketpair.
The zygote keeps ``_SPARES`` *spare* monitors forked and warmed up and hands each spare's end of
its socket to the runtime (message ``spare PID TICKS`` + the fd, SCM_RIGHTS: the spare's pid and
start ticks, which the runtime journals as the start's intent before it sends the spare a
container, so a runtime restarted mid-start can find the monitor: engine.py ``_settle``). A
start then goes straight
from the runtime to a spare, with no hop through the zygote: an 8-byte length and two fds (the
write end of a reply pipe, the opened log file or none), then the JSON request
``{"state", "notify", "spec"}`` (spec inline: argv, env, cwd, log_path, mounts, cgroups,
cgroup_join; state: the prefix of the container's state files, store.py). The spare becomes the
container's monitor (``monitor.run_monitor``) and answers on the reply pipe. Once the reply is
in, the runtime tells the zygote ``used`` for each spare it took (``need`` when it holds none:
fork one now), and the zygote forks the replacement once idle for ``_REFILL_IDLE``: the fork
does not compete with the start. The zygote ignores SIGCHLD, so finished monitors are reaped
by the kernel; it exits when the runtime closes its end (runtime gone); a spare exits when the
runtime's end of its socket closes; monitors, in their own sessions, live on.

With the C monitor built (native.py) the zygote is the C one (``pv-monitor --zygote FD``, same
protocol, monitor.c): it forks small C spares, and the request is monitor.c's NUL-separated
fields instead of JSON. This module's zygote and Python monitors are the fallback.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from podvisor.common.crashpoints import NEVER, CrashPoints
from podvisor.services.runtime.monitor import run_monitor, warm_up
from podvisor.services.runtime.procfs import start_ticks

_SPARES = 2  # monitors kept forked and warm
_REFILL_IDLE = 0.003  # seconds without requests before forking a spare
_SPARE_WAIT = 10.0  # seconds a start waits for a spare when none is ready


@dataclass(frozen=True)
class SpawnResult:
    ok: bool
    error: str = ""
    monitor_pid: int = 0
    monitor_ticks: int = 0
    pid: int = 0
    pid_ticks: int = 0
    started_at: int = 0


class SpawnError(Exception):
    """The zygote or the monitor failed (not the container's exec: that is SpawnResult.error)."""


@dataclass(frozen=True)
class Spare:
    """A pre-forked monitor handed to the runtime: our end of its socket, its identity."""

    sock: socket.socket
    pid: int
    ticks: int


# Called with the spare's (pid, ticks) right before the container is sent to it: the runtime
# records the start's intent there (a raise cancels the start; the spare then exits unused).
BeforeSend = Callable[[int, int], None]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _spare_main(conn: socket.socket) -> NoReturn:
    """A pre-forked monitor waiting for its container: header (8-byte length) + fds, then the
    JSON request. EOF (the runtime closed our socket or exited) means: never used, just exit."""
    code = 0
    try:
        my_ticks = warm_up()
        header, fds, _flags, _addr = socket.recv_fds(conn, 8, 4)
        if not header:
            raise EOFError
        header += _recv_exact(conn, 8 - len(header)) if len(header) < 8 else b""
        body = _recv_exact(conn, struct.unpack("!Q", header)[0])
        conn.close()
        req = json.loads(body)
        reply_fd = fds[0] if fds else -1
        log_fd = fds[1] if len(fds) > 1 else -1
        run_monitor(req["state"], req["spec"], reply_fd, log_fd, my_ticks, req.get("notify", ""))
    except (EOFError, OSError):
        code = 0
    except BaseException:
        code = 70
    os._exit(code)


def _fork_spare() -> tuple[socket.socket, int]:
    """Fork a spare; returns our end of its socket and its pid."""
    gc.collect()
    gc.freeze()  # keep the collector from touching (copying) inherited objects
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        keep = theirs.fileno()  # drop every other fd: the runtime socket and other spares
        os.closerange(3, keep)
        os.closerange(keep + 1, max(1 << 20, os.sysconf("SC_OPEN_MAX")))
        _spare_main(theirs)
    theirs.close()
    return ours, pid


def serve(sock: socket.socket) -> None:
    """The zygote's loop. Runs until the runtime closes its end of ``sock``.

    Spares are forked only after ``_REFILL_IDLE`` seconds without a message (or at once on
    ``need``), so the fork does not compete for the CPU with a monitor starting its container.
    """
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    held = 0  # spares handed to the runtime and not reported used
    urgent = False
    while True:
        # ``need`` forks at once even when more than _SPARES are out (concurrent starts report
        # ``used`` only once their containers run)
        if urgent or (held < _SPARES and not poller.poll(_REFILL_IDLE * 1000)):
            spare, pid = _fork_spare()
            try:
                socket.send_fds(sock, [b"spare %d %d" % (pid, start_ticks(pid) or 0)],
                                [spare.fileno()])
            except OSError:
                return  # the runtime is gone
            finally:
                spare.close()  # the runtime holds the only other end now
            held += 1
            urgent = False
            continue
        try:
            msg = sock.recv(64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not msg:
            return
        if msg == b"used":
            held = max(0, held - 1)
        elif msg == b"need":
            urgent = True


class Spawner:
    """The runtime's side: starts the zygote lazily, holds the spares it hands over and sends
    starts straight to them. Thread-safe."""

    def __init__(self, reply_timeout: float = 10.0, notify: str = "",
                 monitor_exe: str = "", crash: CrashPoints = NEVER) -> None:
        """``notify``: the runtime's exit socket, passed on to each monitor ("" for none);
        ``monitor_exe``: the C zygote and monitor (monitor.c), "" for this module's Python
        ones; ``crash``: the runtime's crash points (``start.after_send``)."""
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._spares: list[Spare] = []
        self._crash = crash
        self._reply_timeout = reply_timeout
        self.notify = notify
        self.monitor_exe = monitor_exe
        # the zygote's (so every monitor's) stderr: this file when set, else the runtime's;
        # stdout is /dev/null
        self.stderr_path = ""
        self._native = False  # the running zygote is the C one

    def start(self) -> None:
        with self._lock:
            self._ensure()

    def _ensure(self) -> socket.socket:
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        self._close_zygote()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = str(theirs.fileno())
        self._native = bool(self.monitor_exe)
        err = open(self.stderr_path, "ab") if self.stderr_path else None  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                [self.monitor_exe, "--zygote", fd] if self._native
                else [sys.executable, "-m", "podvisor.services.runtime.zygote", fd],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
            )
        finally:
            if err is not None:
                err.close()
        theirs.close()
        self._sock = ours
        return ours

    def _collect(self, timeout: float) -> None:
        """Take the spares the zygote sent; wait up to ``timeout`` for the first one."""
        sock = self._ensure()
        flags = socket.MSG_CMSG_CLOEXEC
        if timeout > 0 and not wait_readable(sock.fileno(), timeout):
            return
        while True:
            try:  # (socket.recv_fds ignores its flags argument before Python 3.12)
                msg, anc, _f, _a = sock.recvmsg(64, socket.CMSG_SPACE(4),
                                                flags | socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close_zygote()
                return
            if not msg:
                self._close_zygote()
                return
            fds = [int.from_bytes(data[i:i + 4], sys.byteorder)
                   for level, kind, data in anc
                   if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                   for i in range(0, len(data) - 3, 4)]
            words = msg.split()  # b"spare PID TICKS"
            pid = int(words[1]) if len(words) == 3 and words[1].isdigit() else 0
            ticks = int(words[2]) if pid and words[2].isdigit() else 0
            for fd in fds:
                spare = socket.socket(fileno=fd)
                if not pid:  # a zygote that does not say who the spare is: unusable
                    spare.close()
                    continue
                spare.settimeout(self._reply_timeout)
                self._spares.append(Spare(spare, pid, ticks))

    def _tell(self, msg: bytes) -> None:
        try:
            self._ensure().send(msg)
        except OSError:
            self._close_zygote()

    def _take_spare(self) -> Spare:
        self._collect(0)
        for _attempt in range(2):  # a zygote found dead is restarted, once
            if self._spares:
                break
            self._tell(b"need")
            self._collect(_SPARE_WAIT)
        if not self._spares:
            raise SpawnError("no spare monitor from the zygote")
        return self._spares.pop(0)

    def spawn(self, state: str, log_fd: int, spec: bytes,
              before_send: BeforeSend | None = None) -> SpawnResult:
        """Hand the container to a spare monitor; wait for exec success or failure. ``state``:
        the prefix of its state files (store.py); ``spec``: what it runs (JSON);
        ``before_send``: called with the spare's (pid, ticks) before the container goes to it
        (again with the next spare's when one died before taking it)."""
        reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
        taken = 0
        try:
            fds = [reply_w] + ([log_fd] if log_fd >= 0 else [])
            with self._lock:
                for _attempt in range(3):
                    spare = self._take_spare()  # (re)starts the zygote: self._native is set
                    taken += 1
                    try:
                        body = self._request(state, spec)
                        if before_send is not None:
                            before_send(spare.pid, spare.ticks)
                        socket.send_fds(spare.sock, [struct.pack("!Q", len(body))], fds)
                        spare.sock.sendall(body)
                        self._crash.hit("start.after_send")
                        break
                    except OSError:
                        continue  # the spare died: take another
                    finally:
                        spare.sock.close()
                else:
                    raise SpawnError("spare monitors keep dying (see the runtime's log)")
            os.close(reply_w)
            reply_w = -1
            return _read_reply(reply_r, self._reply_timeout)
        finally:
            # Only now (the container is started) may the zygote fork the replacement: the
            # fork does not compete with this start for a CPU.
            if taken:
                with self._lock:
                    for _ in range(taken):
                        self._tell(b"used")
            os.close(reply_r)
            if reply_w >= 0:
                os.close(reply_w)

    def _request(self, state: str, spec: bytes) -> bytes:
        """The request body: JSON with the spec inline for a Python spare; for a C one the
        NUL-separated fields of monitor.c (STATE NOTIFY CWD LOG_PATH ARGC ARGV... ENVC ENV...
        and, when the container has mounts or cgroups, MOUNTC then SRC DST RO PROPAGATION per
        mount, then with cgroups ``CGROUPS`` N FILE..., cgroups.py ``join_files``, then with
        an oom_score_adj ``OOM`` VALUE, then with a pod network ``NETNS`` PATH, ..., with a
        seccomp filter ``SECCOMP``: monitor.c)."""
        if not self._native:
            return b'{"state": %s, "notify": %s, "spec": %s}' % (
                json.dumps(state).encode(), json.dumps(self.notify).encode(), spec)
        doc = json.loads(spec)
        argv, env = list(doc["argv"]), list(doc["env"])
        fields = [state, self.notify, doc.get("cwd") or "/", doc.get("log_path", ""),
                  str(len(argv)), *argv, str(len(env)), *env]
        mounts = doc.get("mounts") or []
        rootfs = doc.get("rootfs")
        if rootfs:  # volumes go inside the image's root (mounted before the pivot_root)
            mounts = [dict(m, container=rootfs["merged"] + "/" + m["container"].lstrip("/"))
                      for m in mounts]
        sec = doc.get("security")
        cgroups = list(doc.get("cgroup_join") or [])
        oom = doc.get("oom_score_adj")
        netns = doc.get("netns") or ""
        if mounts or sec or cgroups or rootfs or oom is not None or netns:
            fields.append(str(len(mounts)))
            for m in mounts:
                fields += [m["host"], m["container"],
                           "R" if m.get("rro") else "1" if m["ro"] else "0", m["propagation"]]
        if sec:
            fields += security_fields(sec)
        if cgroups:  # the files the container's process writes itself into before its exec
            fields += ["CGROUPS", str(len(cgroups)), *cgroups]
        if oom is not None:  # written by the container's process itself before its exec
            fields += ["OOM", str(int(oom))]
        if netns:  # the sandbox's network namespace, joined before the exec
            fields += ["NETNS", netns]
        if rootfs:
            etc = [x for name, src in sorted((rootfs.get("etc") or {}).items())
                   for x in (name, src)]
            fields += ["ROOTFS", rootfs["merged"], rootfs["upper"], rootfs["work"],
                       str(len(rootfs["lower"])), *rootfs["lower"], str(len(etc)), *etc]
        if sec and sec.get("seccomp"):
            fields += seccomp_fields(sec["seccomp"])
        if doc.get("hostname"):  # the pod's hostname, in a UTS namespace of its own
            fields += ["HOSTNAME", doc["hostname"]]
        if doc.get("stdio"):  # stdin, a terminal, the attach socket (monitor.c parse_stdio)
            io = doc["stdio"]
            fields += ["STDIO", *("1" if io[k] else "0" for k in ("stdin", "stdin_once", "tty")),
                       io["attach"]]
        if any("\0" in f for f in fields):
            raise SpawnError("a NUL byte in the container's command, environment or paths")
        return b"\0".join(f.encode() for f in fields) + b"\0"

    def _close_zygote(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """Close the sockets: the zygote and the spares see EOF and exit (monitors are not
        affected)."""
        with self._lock:
            for spare in self._spares:
                with contextlib.suppress(OSError):
                    spare.sock.close()
            self._spares.clear()
            self._close_zygote()


def security_fields(sec: dict[str, Any]) -> list[str]:
    """monitor.c's ``security`` section (parse_security) for the spec's ``security``."""
    flag = {True: "1", False: "0"}
    return ["security", str(sec["uid"]), str(sec["gid"]), str(len(sec["groups"])),
            *map(str, sec["groups"]), format(sec["caps"], "x"), flag[bool(sec["nnp"])],
            flag[bool(sec["ro_root"])], flag[bool(sec["manage"])],
            str(len(sec["masked"])), *sec["masked"], str(len(sec["readonly"])),
            *sec["readonly"]]


def seccomp_fields(filt: dict[str, Any]) -> list[str]:
    """monitor.c's ``SECCOMP`` section (parse_seccomp) for a filter of seccomp.py."""
    attrs = [str(x) for pair in filt["attrs"] for x in pair]
    out = ["SECCOMP", str(filt["default"]), str(len(filt["arches"])), *filt["arches"],
           str(len(attrs)), *attrs, str(len(filt["rules"]))]
    for name, action, conditions in filt["rules"]:
        out += [name, str(action), str(len(conditions))]
        out += [str(x) for cond in conditions for x in cond]
    return out


def wait_readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` becomes readable (or hung up) within ``timeout`` seconds. poll(), never
    select(): select() cannot watch a descriptor above 1023, and the runtime holds more than
    that with ~1,000 containers (each has its exit-notify and log descriptors)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000))  # (PEP 475: retried on signals)


def _read_reply(fd: int, timeout: float) -> SpawnResult:
    data = b""
    reply = None
    while reply is None:
        if not wait_readable(fd, timeout):
            raise SpawnError(f"container monitor did not answer within {timeout} s")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise SpawnError("container monitor exited before starting the container "
                             f"(see the agent's log); partial reply {data[:200]!r}")
        data += chunk
        try:
            reply = json.loads(data)
        except ValueError:
            continue  # more to come
    if reply.get("ok"):
        return SpawnResult(True, "", int(reply["monitor_pid"]), int(reply["monitor_ticks"]),
                           int(reply["pid"]), int(reply["pid_ticks"]), int(reply["started_at"]))
    return SpawnResult(ok=False, error=str(reply.get("error", "unknown error")))


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    serve(sock)


if __name__ == "__main__":
    main()
