"""The per-container monitor (conmon / containerd-shim style).

A monitor is forked by the zygote (never a child of the runtime), leaves the runtime's session,
forks+execs the container in its own session/process group, copies the container's stdout and
stderr into the CRI log file, waits for it, and writes the exit code and finish time atomically
into the container's state directory. It outlives the runtime: its only links to it are files in
the state directory, the reply pipe (used once, to report exec success or failure) and SIGHUP
(reopen the log file). It exits when the container's process has exited and its output is
drained.

Files in the container state dir (written atomically: tmp + rename):
  spec.json     read:  {"argv", "env", "cwd", "log_path"}
  started.json  write: {"monitor_pid", "monitor_ticks", "pid", "pid_ticks", "started_at"}
  exit.json     write: {"exit_code", "finished_at", "reason", "message"}
Only the standard library is imported here: the zygote forks this code, so it stays small.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from typing import Any, NoReturn

from podvisor.services.runtime.procfs import start_ticks

MAX_LINE = 16 * 1024  # longer lines are split into P (partial) records, as containerd does
DRAIN_AFTER_EXIT = 2.0  # seconds to drain output after the container's process exited
LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.rename(tmp, path)


def rfc3339nano(ns: int) -> bytes:
    secs, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)).encode() + b".%09dZ" % frac


def exit_code_of(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


class _LogWriter:
    """Turns raw output into CRI log records: ``<RFC3339Nano> <stream> <F|P> <line>``."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self.partial: dict[bytes, bytes] = {b"stdout": b"", b"stderr": b""}

    def feed(self, stream: bytes, data: bytes, final: bool = False) -> None:
        buf = self.partial[stream] + data
        stamp = rfc3339nano(time.time_ns())
        out: list[bytes] = []
        *lines, rest = buf.split(b"\n")
        for line in lines:
            while len(line) > MAX_LINE:
                out.append(b"%s %s P %s\n" % (stamp, stream, line[:MAX_LINE]))
                line = line[MAX_LINE:]
            out.append(b"%s %s F %s\n" % (stamp, stream, line))
        while len(rest) > MAX_LINE:
            out.append(b"%s %s P %s\n" % (stamp, stream, rest[:MAX_LINE]))
            rest = rest[MAX_LINE:]
        if final and rest:
            out.append(b"%s %s F %s\n" % (stamp, stream, rest))
            rest = b""
        self.partial[stream] = rest
        if out and self.fd >= 0:
            with contextlib.suppress(OSError):  # a full disk must not kill the container
                os.write(self.fd, b"".join(out))

    def reopen(self) -> None:
        if not self.path:
            return
        try:
            fd = os.open(self.path, LOG_FLAGS, 0o640)
        except OSError:
            return
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = fd


def _exec_child(spec: dict[str, Any], out_w: int, err_w: int, exec_w: int) -> NoReturn:
    """In the forked child: become the container's process (own session), or report why not."""
    argv: list[str] = spec["argv"]
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, exec_w)
        os.closerange(exec_w + 1, 1 << 20)
        for sig in (signal.SIGPIPE, signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if spec.get("cwd"):
            os.chdir(spec["cwd"])
        env = dict(item.split("=", 1) for item in spec["env"])
        os.execvpe(argv[0], argv, env)
    except OSError as err:
        msg = f'exec "{argv[0]}": {err.strerror} (errno {err.errno} {_errname(err.errno)})'
        os.write(exec_w, msg.encode())
    except BaseException as err:
        os.write(exec_w, f'exec "{argv[0]}": {err!r}'.encode())
    os._exit(127)


def _errname(errno_: int | None) -> str:
    import errno as errno_mod

    return errno_mod.errorcode.get(errno_ or 0, "")


def _start(spec: dict[str, Any], state_dir: str) -> tuple[int, int, int]:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    exec_r, exec_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        _exec_child(spec, out_w, err_w, exec_w)
    for fd in (out_w, err_w, exec_w):
        os.close(fd)
    failure = b""
    while chunk := os.read(exec_r, 4096):
        failure += chunk
    os.close(exec_r)
    if failure:
        os.waitpid(pid, 0)
        raise OSError(failure.decode(errors="replace"))
    me = os.getpid()
    write_json_atomic(os.path.join(state_dir, "started.json"), {
        "monitor_pid": me, "monitor_ticks": start_ticks(me), "pid": pid,
        "pid_ticks": start_ticks(pid), "started_at": time.time_ns(),
    })
    return pid, out_r, err_r


def _pump(pid: int, out_r: int, err_r: int, log: _LogWriter) -> tuple[int, int]:
    """Copy output until the process exited and its pipes closed; returns (exit code, finish ns)."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGHUP, lambda _s, _f: None)
    pidfd = os.pidfd_open(pid)
    streams = {out_r: b"stdout", err_r: b"stderr"}
    poller = select.poll()
    for fd in (out_r, err_r, pidfd, wake_r):
        poller.register(fd, select.POLLIN)
    result: tuple[int, int] | None = None
    deadline = float("inf")
    while streams and time.monotonic() < deadline:
        timeout = None if result is None else max(deadline - time.monotonic(), 0) * 1000
        for fd, _ev in poller.poll(timeout):
            if fd == pidfd:
                poller.unregister(pidfd)
                _, status = os.waitpid(pid, 0)
                result = (exit_code_of(status), time.time_ns())
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)  # the rest of the container's group
                deadline = time.monotonic() + DRAIN_AFTER_EXIT
            elif fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                log.reopen()
            elif fd in streams:
                data = os.read(fd, 65536)
                if data:
                    log.feed(streams[fd], data)
                else:
                    log.feed(streams.pop(fd), b"", final=True)
                    poller.unregister(fd)
        if result is None and not streams:
            _, status = os.waitpid(pid, 0)
            result = (exit_code_of(status), time.time_ns())
    if result is None:  # pragma: no cover - the loop only ends after waitpid
        _, status = os.waitpid(pid, 0)
        result = (exit_code_of(status), time.time_ns())
    return result


def run_monitor(state_dir: str, reply_fd: int, log_fd: int) -> NoReturn:
    """The monitor's whole life. Called in a freshly forked child of the zygote."""
    os.setsid()
    err = os.open(os.path.join(state_dir, "monitor.err"), LOG_FLAGS, 0o600)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(err, 2)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(os.path.join(state_dir, "spec.json")) as f:
        spec = json.load(f)
    try:
        pid, out_r, err_r = _start(spec, state_dir)
    except OSError as exc:
        os.write(reply_fd, json.dumps({"ok": False, "error": str(exc)}).encode())
        os._exit(0)
    os.write(reply_fd, json.dumps({"ok": True, "pid": pid}).encode())
    os.close(reply_fd)
    code, finished = _pump(pid, out_r, err_r, _LogWriter(log_fd, spec.get("log_path", "")))
    reason = "Completed" if code == 0 else "Error"
    write_json_atomic(os.path.join(state_dir, "exit.json"), {
        "exit_code": code, "finished_at": finished, "reason": reason, "message": "",
    })
    os._exit(0)
