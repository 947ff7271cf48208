"""The per-container monitor (conmon / containerd-shim style).

A monitor is forked by the zygote (never a child of the runtime), leaves the runtime's session,
forks the container in its own session/process group (the container dies with its monitor:
``die_with_monitor``), copies the container's stdout and
stderr into the CRI log file, waits for it, and writes the exit code and finish time atomically
into the container's state files. It outlives the runtime: its only links to it are its state
files, the reply pipe (used once, to report exec success or failure), SIGHUP
(reopen the log file) and one datagram to the runtime's exit socket when the container is gone
(best effort; see watcher.py). It exits when the container's process has exited and its output
is drained.

Its state files, named by the ``state`` prefix it is handed (``<runtime root>/containers/<id>``,
store.py):
  <state>.started.json  one write of a new file: {"monitor_pid", "monitor_ticks", "pid",
                        "pid_ticks", "started_at"}
  <state>.exit.json     tmp + rename: {"exit_code", "finished_at", "reason", "message"}
Its stderr is the zygote's (the runtime's, so the agent's log): a traceback lands there.
Only the standard library is imported here: the zygote forks this code, so it stays small.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import select
import signal
import socket
import time
from typing import Any, NoReturn

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.runtime.procfs import start_ticks

MAX_LINE = 16 * 1024  # longer lines are split into P (partial) records, as containerd does
DRAIN_AFTER_EXIT = 2.0  # seconds to drain output after the container's process exited
LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    """tmp + rename; ``json.dumps`` (the C encoder: ``json.dump`` runs the pure-Python one)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    write_new(tmp, json.dumps(data).encode())
    os.rename(tmp, path)


def write_new(path: str, data: bytes) -> None:
    """Create (or truncate) ``path`` holding ``data``: one open, one write, one close."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def send_exit_note(notify: str, note: dict[str, Any]) -> None:
    """Tell the runtime at once (``watcher.py``); best effort: no runtime listening is fine,
    its pidfd of this monitor or, when it was down, ``exit.json`` tells it later."""
    if not notify:
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.sendto(json.dumps(note).encode(), notify)
    except OSError:
        pass


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


# <sys/mount.h>, <sched.h>
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE, _MS_SLAVE = 32, 4096, 16384, 1 << 18, 1 << 19
_CLONE_NEWNS = 0x00020000
# <linux/mount.h>: mount_setattr(2) (Linux 5.12; the same number on every architecture)
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 0x1


def recursive_read_only(dst: str) -> None:
    """Make the mount on ``dst`` and every mount under it read-only (``mount_setattr`` with
    ``AT_RECURSIVE`` and ``MOUNT_ATTR_RDONLY``, as runc's "rro"). Raises OSError."""
    import ctypes

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    libc = _libc()
    attr = MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
    if libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, dst.encode(), _AT_RECURSIVE,
                    ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
        err = ctypes.get_errno()
        raise OSError(_errno_text(f'mount "{dst}" recursively read-only', err))


def mount_setattr_works() -> bool:
    """Whether the kernel has ``mount_setattr`` (a call with no attributes on "/" changes
    nothing; ENOSYS: Linux before 5.12 or a seccomp filter refusing it)."""
    import ctypes

    libc = _libc()
    attr = (ctypes.c_uint64 * 4)()
    ok = libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, b"/", 0, ctypes.byref(attr),
                      ctypes.sizeof(attr)) == 0
    return ok or ctypes.get_errno() != errno.ENOSYS


def apply_mounts(mounts: list[dict[str, Any]]) -> None:
    """monitor.c's ``apply_mounts``, for this (single-threaded) monitor itself before it forks
    the container (a container without a security context: ``_spawn_container``), so the Python
    monitor shares its container's private mount namespace (its state files are reached by
    paths that no mount should hide)."""
    import ctypes  # only monitors of containers with mounts pay for it

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_void_p]

    def check(ok: bool, what: str) -> None:
        if not ok:
            err = ctypes.get_errno()
            raise OSError(f"{what}: {os.strerror(err)} (errno {err} "
                          f"{errno.errorcode.get(err, '')})")

    def mount(src: str | None, dst: str, flags: int) -> bool:
        return int(libc.mount(src and src.encode(), dst.encode(), None, flags, None)) == 0

    what = "a private mount namespace for the container's mounts"
    check(libc.unshare(_CLONE_NEWNS) == 0 and mount(None, "/", _MS_REC | _MS_SLAVE), what)
    for m in mounts:
        src, dst, ro = m["host"], m["container"], bool(m["ro"])
        what = f'mount "{src}" on "{dst}"' + (" read-only" if ro else "")
        try:
            if not os.path.exists(src):
                os.makedirs(src, 0o755, exist_ok=True)  # containerd's rule for a missing path
            if os.path.isdir(src):
                os.makedirs(dst, 0o755, exist_ok=True)
            elif not os.path.exists(dst):
                os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
                os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        except OSError as err:
            raise OSError(f"{what}: {err.strerror} (errno {err.errno} "
                          f"{errno.errorcode.get(err.errno or 0, '')})") from None
        prop = _MS_SLAVE if m["propagation"] == "rslave" else _MS_PRIVATE
        check(mount(src, dst, _MS_BIND | _MS_REC) and mount(None, dst, _MS_REC | prop), what)
        if ro:
            vfs = os.statvfs(dst)
            keep = vfs.f_flag & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC)  # ST_* == MS_* values
            check(mount(None, dst, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | keep), what)
        if m.get("rro"):
            recursive_read_only(dst)


# <linux/fs.h>: umount2 flags
_MNT_DETACH = 2
_PIVOT_ROOT_NR = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def apply_rootfs(rootfs: dict[str, Any], mounts: list[dict[str, Any]]) -> None:
    """In the container's forked child, before the security step: a private mount namespace,
    the image's layers under an overlay with the container's writable layer, /proc, /dev,
    /sys, the pod's /etc/hosts, /etc/resolv.conf and /etc/hostname, the volume mounts inside,
    then ``pivot_root`` into it (the old root detached). Raises OSError naming the step."""
    import ctypes

    libc = _libc()
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.syscall.restype = ctypes.c_long

    def check(ok: bool, what: str) -> None:
        if not ok:
            raise OSError(_errno_text(f"image root filesystem: {what}", ctypes.get_errno()))

    def mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None,
              what: str) -> None:
        check(libc.mount(src and src.encode(), dst.encode(), fstype and fstype.encode(), flags,
                         data and data.encode()) == 0, what)

    def mkfile(path: str) -> None:
        if not os.path.lexists(path):
            os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))

    new = rootfs["merged"]
    check(libc.unshare(_CLONE_NEWNS) == 0, "a private mount namespace")
    mount(None, "/", None, _MS_REC | _MS_SLAVE, None, "a private mount namespace")
    lower = ":".join(rootfs["lower"])
    mount("overlay", new, "overlay", 0,
          f"lowerdir={lower},upperdir={rootfs['upper']},workdir={rootfs['work']}",
          "the overlay of the image's layers")
    for sub in ("proc", "dev", "sys", "etc"):
        path = os.path.join(new, sub)
        if os.path.islink(path):
            os.unlink(path)
        os.makedirs(path, 0o755, exist_ok=True)
    mount("proc", new + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None, "/proc")
    mount("tmpfs", new + "/dev", "tmpfs", _MS_NOSUID, "mode=755,size=65536k", "/dev")
    for name in _DEVICES:
        dst = f"{new}/dev/{name}"
        if os.path.exists(f"/dev/{name}"):
            mkfile(dst)
            mount(f"/dev/{name}", dst, None, _MS_BIND, None, f"/dev/{name}")
    for sub in ("pts", "shm", "mqueue"):
        os.makedirs(f"{new}/dev/{sub}", 0o755, exist_ok=True)
    mount("tmpfs", new + "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=65536k",
          "/dev/shm")
    with contextlib.suppress(OSError):
        mount("devpts", new + "/dev/pts", "devpts", _MS_NOSUID | _MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=0620", "/dev/pts")
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
                         ("ptmx", "pts/ptmx")):
        with contextlib.suppress(FileExistsError):
            os.symlink(target, f"{new}/dev/{link}")
    mount("/sys", new + "/sys", None, _MS_BIND | _MS_REC, None, "/sys")
    mount(None, new + "/sys", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID
          | _MS_NODEV | _MS_NOEXEC, None, "/sys read-only")
    for name, src in sorted((rootfs.get("etc") or {}).items()):
        dst = f"{new}/etc/{name}"
        if os.path.islink(dst) or os.path.isdir(dst):
            continue  # the image's own choice (a symlink such as resolv.conf -> ...)
        mkfile(dst)
        mount(src, dst, None, _MS_BIND, None, f"/etc/{name}")
    if mounts:
        inside = [dict(m, container=new + "/" + m["container"].lstrip("/")) for m in mounts]
        _bind_mounts(inside)
    os.chdir(new)
    import platform
    nr = _PIVOT_ROOT_NR.get(platform.machine())
    if nr is None:
        raise OSError(f"image root filesystem: pivot_root: unknown on {platform.machine()}")
    check(libc.syscall(nr, b".", b".") == 0, "pivot_root")
    check(libc.umount2(b".", _MNT_DETACH) == 0, "detaching the old root")
    os.chdir("/")


def _bind_mounts(mounts: list[dict[str, Any]]) -> None:
    """The volume mounts of ``apply_mounts`` without making a new namespace."""
    import ctypes

    libc = _libc()

    def check(ok: bool, what: str) -> None:
        if not ok:
            raise OSError(_errno_text(what, ctypes.get_errno()))

    def mount(src: str | None, dst: str, flags: int) -> bool:
        return int(libc.mount(src and src.encode(), dst.encode(), None, flags, None)) == 0

    for m in mounts:
        src, dst, ro = m["host"], m["container"], bool(m["ro"])
        what = f'mount "{src}" on "{dst}"' + (" read-only" if ro else "")
        if not os.path.exists(src):
            os.makedirs(src, 0o755, exist_ok=True)
        if os.path.isdir(src):
            os.makedirs(dst, 0o755, exist_ok=True)
        elif not os.path.exists(dst):
            os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
            os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        prop = _MS_SLAVE if m["propagation"] == "rslave" else _MS_PRIVATE
        check(mount(src, dst, _MS_BIND | _MS_REC) and mount(None, dst, _MS_REC | prop), what)
        if ro:
            vfs = os.statvfs(dst)
            keep = vfs.f_flag & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
            check(mount(None, dst, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | keep), what)
        if m.get("rro"):
            recursive_read_only(dst)


# <sys/prctl.h>, <linux/capability.h>
_PR_CAPBSET_READ, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 23, 24, 38
_CAP_VERSION_3 = 0x20080522
_SECURITY_STEPS = ("dropping capabilities from the bounding set", "setgroups", "setgid",
                   "setuid", "capset", "no_new_privs")


@functools.cache
def _libc() -> Any:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_void_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    return libc


PR_SET_PDEATHSIG = 1
HOLD_ENV = "PODVISOR_MONITOR_HOLD"  # monitor.c ``hold_fifo``: fault-injection tests only


def die_with_monitor(monitor: int) -> None:
    """In the container's forked child, last before its exec (monitor.c does the same): the
    process dies with its monitor, whatever killed the monitor and when, so a monitor gone
    before it recorded started.json leaves no process that no record names (engine.py
    ``_settle``). Last, since a change of ids clears it; the getppid check closes the window
    of a monitor that died before the prctl."""
    if _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 \
            or os.getppid() != monitor:
        os._exit(127)


def hold(path: str) -> None:
    """Tests only (``PODVISOR_MONITOR_HOLD``): block on the FIFO ``path`` until its writer
    closes it, between the container's start and started.json."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            while os.read(fd, 64):
                pass
        finally:
            os.close(fd)


def _errno_text(what: str, err: int) -> str:
    return f"{what}: {os.strerror(err)} (errno {err} {errno.errorcode.get(err, '')})"


def apply_security_mounts(sec: dict[str, Any], had_mounts: bool) -> None:
    """monitor.c's ``apply_security_mounts``, in the container's child after ``apply_mounts``:
    masked paths (/dev/null over a file, a read-only tmpfs over a directory), read-only paths,
    the read-only root, in the container's private mount namespace (made here when there were
    no volume mounts). A missing path is skipped, as runc does."""
    if not (sec["masked"] or sec["readonly"] or sec["ro_root"]):
        return
    import ctypes

    libc = _libc()

    def mount(src: str | None, dst: str, fstype: str | None, flags: int, what: str) -> None:
        if libc.mount(src and src.encode(), dst.encode(), fstype and fstype.encode(), flags,
                      None) != 0:
            raise OSError(_errno_text(f"security context: mounting {what}", ctypes.get_errno()))

    def keep(path: str) -> int:
        return os.statvfs(path).f_flag & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC)

    if not had_mounts:
        if libc.unshare(_CLONE_NEWNS) != 0:
            raise OSError(_errno_text("security context: a private mount namespace",
                                      ctypes.get_errno()))
        mount(None, "/", None, _MS_REC | _MS_SLAVE, "a private mount namespace")
    for path in sec["masked"]:
        try:
            is_dir = os.path.isdir(path) if os.path.lexists(path) else None
        except OSError:
            is_dir = None
        if is_dir is None:
            continue
        if is_dir:
            mount("tmpfs", path, "tmpfs", _MS_RDONLY, path)
        else:
            mount("/dev/null", path, None, _MS_BIND, path)
    for path in sec["readonly"]:
        if not os.path.lexists(path):
            continue
        mount(path, path, None, _MS_BIND | _MS_REC, path)
        mount(None, path, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | keep(path), path)
    if sec["ro_root"]:
        mount(None, "/", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | keep("/"),
              "the read-only root filesystem")


def apply_security(sec: dict[str, Any]) -> None:
    """monitor.c's ``apply_security``, in the container's child right before exec: bounding
    set, groups, gid, uid, then (root) effective/permitted = the set, inheritable cleared; last
    no_new_privs. Raises OSError naming the step."""
    import ctypes

    libc = _libc()
    step = 0

    def fail() -> OSError:
        return OSError(_errno_text(f"security context: {_SECURITY_STEPS[step]}",
                                   ctypes.get_errno()))

    if sec["manage"]:
        caps = int(sec["caps"])
        for cap in range(64):
            have = libc.prctl(_PR_CAPBSET_READ, cap, 0, 0, 0)
            if have < 0:
                break
            if have == 1 and not caps >> cap & 1 and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0,
                                                                  0) != 0:
                raise fail()
        try:
            step = 1
            if len(sec["groups"]) > os.sysconf("SC_NGROUPS_MAX"):  # os.setgroups: ValueError
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))  # setgroups(2): EINVAL
            os.setgroups(sec["groups"])
            step = 2
            os.setresgid(sec["gid"], sec["gid"], sec["gid"])
            step = 3
            os.setresuid(sec["uid"], sec["uid"], sec["uid"])
        except OSError as err:
            raise OSError(_errno_text(f"security context: {_SECURITY_STEPS[step]}",
                                      err.errno or 0)) from None
        if sec["uid"] == 0:
            step = 4
            header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
            low, high = caps & 0xFFFFFFFF, caps >> 32
            data = (ctypes.c_uint32 * 6)(low, low, 0, high, high, 0)
            if libc.capset(header, data) != 0:
                raise fail()
    step = 5
    if sec["nnp"] and libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise fail()


def build_seccomp(filt: dict[str, Any]) -> Any:
    """monitor.c's ``build_seccomp``, in the monitor before it forks the container: the filter
    of seccomp.py built with libseccomp's Python binding (``pyseccomp``: ctypes over the
    system's libseccomp.so.2); the container's child only loads it (``load_seccomp``). A
    syscall this kernel does not know is skipped, as runc does. Raises OSError naming the
    step."""
    what = "libseccomp's Python binding (pyseccomp)"
    try:
        import pyseccomp as scmp

        what = "seccomp_init"
        f = scmp.SyscallFilter(filt["default"])
        for arch in filt["arches"]:
            what = f"architecture {arch}"
            try:
                f.add_arch(getattr(scmp.Arch, arch.upper()))
            except OSError as err:
                if err.errno != errno.EEXIST:
                    raise
        for attr, value in filt["attrs"]:
            what = f"filter attribute {attr}"
            f.set_attr(attr, value)
        for name, action, conditions in filt["rules"]:
            nr = scmp.resolve_syscall(scmp.Arch.NATIVE, name)
            if nr < 0:
                continue
            what = f"the rule for {name}"
            f.add_rule(action, nr, *(scmp.Arg(*cond) for cond in conditions))
    except (ImportError, RuntimeError, AttributeError) as err:
        raise OSError(f"security context: seccomp filter: {what}: {err}") from None
    except OSError as err:
        raise OSError(_errno_text(f"security context: seccomp filter: {what}",
                                  err.errno or 0)) from None
    return f


def load_seccomp(f: Any) -> None:
    """In the container's child (monitor.c ``load_seccomp``)."""
    try:
        f.load()
    except OSError as err:
        raise OSError(_errno_text("security context: seccomp", err.errno or 0)) from None


_CLONE_NEWUTS = 0x04000000


def apply_hostname(name: str) -> None:
    """monitor.c's ``apply_hostname``: a UTS namespace of the container's own with the pod's
    hostname, in the container's child."""
    if _libc().unshare(_CLONE_NEWUTS) != 0:
        import ctypes
        raise OSError(_errno_text(f'the pod\'s hostname "{name}" (a UTS namespace of its own)',
                                  ctypes.get_errno()))
    try:
        socket.sethostname(name)
    except OSError as err:
        raise OSError(_errno_text(f'the pod\'s hostname "{name}" (a UTS namespace of its own)',
                                  err.errno or 0)) from None


def join_cgroups(files: list[str]) -> None:
    """In a container's forked child, before anything else: write "0" (itself) into each of
    the container's cgroup files (cgroups.py ``join_files``), as monitor.c ``join_cgroups``
    does; the OSError names the file."""
    for path in files:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        except OSError as err:
            raise OSError(f'join cgroup "{path}": {err.strerror} (errno {err.errno} '
                          f"{errno.errorcode.get(err.errno or 0, '')})") from None


CLONE_NEWNET = 0x40000000


def join_netns(path: str | None) -> None:
    """In a container's forked child, after its cgroups and oom_score_adj, before its mounts:
    enter the sandbox's network namespace (``NETNS``; netns.py), as monitor.c ``join_netns``
    does; the OSError names the namespace."""
    if not path:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc().setns(fd, CLONE_NEWNET) != 0:
                err = ctypes_errno()
                raise OSError(err, os.strerror(err))
        finally:
            os.close(fd)
    except OSError as err:
        raise OSError(f'join network namespace "{path}": {err.strerror} (errno {err.errno} '
                      f"{errno.errorcode.get(err.errno or 0, '')})") from None


def ctypes_errno() -> int:
    import ctypes

    return ctypes.get_errno()


def write_oom_score_adj(value: int | None) -> None:
    """In a container's forked child, after joining its cgroups and before its mounts and ids
    change (a process whose ids changed is not dumpable: its /proc files belong to root): the
    container's ``oom_score_adj`` (clamped by the runtime, oom.py ``effective``), so the command
    has it from its first instruction, as monitor.c ``write_oom_score_adj`` does."""
    if value is None:
        return
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"%d" % value)
        finally:
            os.close(fd)
    except OSError as err:
        raise OSError(f"oom_score_adj {value}: {err.strerror} (errno {err.errno} "
                      f"{errno.errorcode.get(err.errno or 0, '')})") from None


def _fork_container(spec: dict[str, Any], out_w: int, err_w: int) -> int:
    """fork + exec (this monitor is single-threaded) for a container with a security context:
    its mounts, masks and ids are applied in the child (the monitor keeps its own view and
    ids); failures come back on a close-on-exec pipe, as OSError."""
    argv: list[str] = spec["argv"]
    env = dict(item.split("=", 1) for item in spec["env"])
    cwd = spec.get("cwd") or "/"
    sec = spec["security"]
    filt = build_seccomp(sec["seccomp"]) if sec.get("seccomp") else None
    feed = _open_feed(spec)
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    monitor = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs or exits
        try:
            join_cgroups(spec.get("cgroup_join") or [])
            write_oom_score_adj(spec.get("oom_score_adj"))
            join_netns(spec.get("netns"))
            if spec.get("hostname"):
                apply_hostname(spec["hostname"])
            if feed is not None:  # stdin, or a terminal (monitor_stdio.py)
                feed.child_stdio(out_w, err_w)
            else:
                os.setsid()
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
            for sig in (signal.SIGPIPE, signal.SIGHUP, signal.SIGINT, signal.SIGTERM,
                        signal.SIGCHLD, signal.SIGQUIT):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            if spec.get("rootfs"):  # the image's root: its own namespace, volumes inside
                apply_rootfs(spec["rootfs"], spec.get("mounts") or [])
            elif spec.get("mounts"):
                apply_mounts(spec["mounts"])
            apply_security_mounts(spec["security"],
                                  bool(spec.get("mounts") or spec.get("rootfs")))
            try:
                os.chdir(cwd)
            except OSError as err:
                raise OSError(f"chdir {cwd!r}: {err.strerror} (errno {err.errno})") from None
            # seccomp as runc orders it (monitor.c exec_container)
            if filt is not None and not sec["nnp"]:
                load_seccomp(filt)
            apply_security(sec)
            die_with_monitor(monitor)
            if filt is not None and sec["nnp"]:
                load_seccomp(filt)
            try:
                os.execvpe(argv[0], argv, env)
            except OSError as err:
                raise OSError(f'exec "{argv[0]}": {err.strerror} (errno {err.errno} '
                              f"{errno.errorcode.get(err.errno or 0, '')})") from None
        except BaseException as exc:  # everything goes to the parent
            with contextlib.suppress(BaseException):
                os.write(report_w, str(exc).encode()[:4000])
        os._exit(127)
    os.close(report_w)
    if feed is not None:
        feed.after_fork()
    try:
        message = b""
        while chunk := os.read(report_r, 4096):
            message += chunk
    finally:
        os.close(report_r)
    if message:
        os.waitpid(pid, 0)
        raise OSError(message.decode(errors="replace"))
    return pid


_FEED: Any = None  # this monitor's StdinFeed (monitor_stdio.py), when its container has stdin


def _open_feed(spec: dict[str, Any]) -> Any:
    """The container's stdin or terminal and its attach socket, before the fork (OSError)."""
    global _FEED
    io = spec.get("stdio")
    if not io:
        return None
    from podvisor.services.runtime.monitor_stdio import StdinFeed  # only such monitors pay

    _FEED = StdinFeed(io)
    _FEED.open()
    return _FEED


def _spawn_container(spec: dict[str, Any], out_w: int, err_w: int) -> int:
    """Start the container's process in its own session; exec errors (ENOENT, EACCES,
    E2BIG...) come back here as OSError."""
    if spec.get("security") or spec.get("rootfs") or spec.get("netns"):
        return _fork_container(spec, out_w, err_w)
    argv: list[str] = spec["argv"]
    env = dict(item.split("=", 1) for item in spec["env"])
    cwd = spec.get("cwd") or "/"
    if spec.get("mounts"):
        apply_mounts(spec["mounts"])
    try:
        os.chdir(cwd)  # the monitor's own cwd is irrelevant; the child inherits it
    except OSError as err:
        raise OSError(f"chdir {cwd!r}: {err.strerror} (errno {err.errno})") from None
    return _fork_exec(argv, env, spec.get("cgroup_join") or [], out_w, err_w,
                      spec.get("oom_score_adj"))


def _fork_exec(argv: list[str], env: dict[str, str], cgroups: list[str], out_w: int,
               err_w: int, oom_score_adj: int | None = None) -> int:
    """fork + exec (this monitor is single-threaded; not posix_spawn, which has no step
    between fork and exec): the child joins each of its cgroups (writes "0", itself, into each
    file of ``cgroups``: cgroups.py ``join_files``) before anything else, writes its
    oom_score_adj, sets its parent-death signal (``die_with_monitor``), then execs; a failure
    comes back over a pipe as OSError. monitor.c ``exec_container`` does the same."""
    rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
    monitor = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs or exits
        what = ""
        try:
            for path in cgroups:
                what = f'join cgroup "{path}"'
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)
            if oom_score_adj is not None:  # write_oom_score_adj, with this child's report
                what = f"oom_score_adj {oom_score_adj}"
                fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, b"%d" % oom_score_adj)
                finally:
                    os.close(fd)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.setsid()
            for sig in (signal.SIGPIPE, signal.SIGHUP, signal.SIGINT, signal.SIGTERM,
                        signal.SIGCHLD, signal.SIGQUIT):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            die_with_monitor(monitor)
            what = f'exec "{argv[0]}"'
            os.execvpe(argv[0], argv, env)
        except OSError as err:
            os.write(rep_w, f"{what}: {err.strerror} (errno {err.errno} "
                            f"{errno.errorcode.get(err.errno or 0, '')})".encode())
        finally:
            os._exit(127)
    os.close(rep_w)
    report = b""
    while chunk := os.read(rep_r, 4096):
        report += chunk
    os.close(rep_r)
    if report:
        os.waitpid(pid, 0)
        raise OSError(report.decode(errors="replace"))
    return pid


def _start(spec: dict[str, Any]) -> tuple[int, int, int]:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = _spawn_container(spec, out_w, err_w)
    os.close(out_w)
    os.close(err_w)
    if _FEED is not None and _FEED.tty:  # the terminal's output is the container's stdout
        os.close(out_r)
        out_r = _FEED.fd
    return pid, out_r, err_r


def _pump(pid: int, out_r: int, err_r: int, log: _LogWriter) -> tuple[int, int]:
    """Copy output until the process exited and its pipes closed; returns (exit code, finish ns)."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGHUP, lambda _s, _f: None)
    pidfd = os.pidfd_open(pid)
    streams = {out_r: b"stdout", err_r: b"stderr"}
    feed = _FEED
    result: tuple[int, int] | None = None
    deadline = float("inf")
    while streams and SYSTEM_CLOCK.monotonic() < deadline:
        timeout = None if result is None else max(deadline - SYSTEM_CLOCK.monotonic(), 0) * 1000
        poller = select.poll()
        for fd in (*streams, wake_r, *((pidfd,) if result is None else ())):
            poller.register(fd, select.POLLIN)
        feeding = feed is not None and result is None and feed.fd >= 0
        if feeding:
            _register_feed(poller, feed)
            if feed.tty and feed.pending:  # the master's POLLOUT is no news: retry the write
                timeout = 10 if timeout is None else min(timeout, 10)
        events = poller.poll(timeout)
        if feeding:
            _feed_events(feed, dict(events))
        for fd, _ev in events:
            if fd == pidfd:
                _, status = os.waitpid(pid, 0)
                result = (exit_code_of(status), time.time_ns())
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)  # the rest of the container's group
                deadline = SYSTEM_CLOCK.monotonic() + DRAIN_AFTER_EXIT
            elif fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                log.reopen()
            elif fd in streams:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:  # EIO: a terminal whose every slave is closed
                    data = b""
                if data:
                    log.feed(streams[fd], data)
                else:
                    log.feed(streams.pop(fd), b"", final=True)
                    if feed is not None and fd == feed.fd:  # no stdin past the terminal
                        feed.fd = -1
                    os.close(fd)
        if result is None and not streams:
            _, status = os.waitpid(pid, 0)
            result = (exit_code_of(status), time.time_ns())
    if result is None:  # pragma: no cover - the loop only ends after waitpid
        _, status = os.waitpid(pid, 0)
        result = (exit_code_of(status), time.time_ns())
    return result


def _register_feed(poller: Any, feed: Any) -> None:
    if feed.listener is not None:
        poller.register(feed.listener.fileno(), select.POLLIN)
    if feed.client is not None and not feed.pending:
        poller.register(feed.client.fileno(), select.POLLIN)
    if feed.pending and not feed.tty:
        poller.register(feed.fd, select.POLLOUT)


def _feed_events(feed: Any, events: dict[int, int]) -> None:
    """What the poll said of the attach socket, its client and the stdin pipe."""
    if feed.listener is not None and feed.listener.fileno() in events:
        feed.accept()
    if feed.client is not None and feed.client.fileno() in events:
        feed.read_client()
    if feed.pending:
        feed.flush()


def warm_up() -> int:
    """Run in a spare monitor right after the fork, before any request: do what does not
    depend on the container (leave the zygote's session, stdin/stdout to /dev/null, signal
    dispositions) and touch what a start touches (copy-on-write faults, lazy imports), so the
    start itself is quick. Returns our start ticks."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _libc()  # ctypes loaded once here, not in each container's child (die_with_monitor)
    json.loads(json.dumps({"argv": ["x"], "env": ["A=b"], "ok": True}))
    rfc3339nano(time.time_ns())
    return start_ticks(os.getpid()) or 0


def run_monitor(
    state: str, spec: dict[str, Any], reply_fd: int, log_fd: int, my_ticks: int,
    notify: str = "",
) -> NoReturn:
    """The monitor's whole life, in a (spare) child of the zygote that was handed a container
    (``warm_up`` already ran). Records started.json, then
    replies (the runtime keeps what the reply says); at the end records exit.json, then sends
    the exit note to ``notify``."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write("pv-monitor")  # what `ps -o comm`/`top` show for it
    for fd in (reply_fd, log_fd):
        if fd > 2:
            os.set_inheritable(fd, False)  # fds passed over SCM_RIGHTS arrive inheritable
    try:
        pid, out_r, err_r = _start(spec)
    except OSError as exc:
        with contextlib.suppress(OSError):  # EPIPE: the runtime died meanwhile
            os.write(reply_fd, json.dumps({"ok": False, "error": str(exc)}).encode())
        os._exit(0)
    if os.environ.get(HOLD_ENV):
        hold(os.environ[HOLD_ENV])
    started = {"monitor_pid": os.getpid(), "monitor_ticks": my_ticks, "pid": pid,
               "pid_ticks": start_ticks(pid) or 0, "started_at": time.time_ns()}
    # Durable before the caller hears "started": a runtime killed right after StartContainer
    # returned must find the container running, not created. A new file written by one
    # write() needs no tmp + rename: a reader sees it whole, or empty/absent (= not started,
    # exactly what it saw before the write).
    try:
        write_new(f"{state}.started.json", json.dumps(started).encode())
    except OSError as err:  # a start that cannot be recorded did not happen (monitor.c too)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            os.write(reply_fd, json.dumps({"ok": False, "error": (
                f"recording the container's start in {state}.started.json: {err.strerror} "
                f"(errno {err.errno} {errno.errorcode.get(err.errno or 0, '')})")}).encode())
        os._exit(0)
    # A runtime that died since it sent the start (EPIPE) finds started.json when it comes
    # back (engine.py ``_settle``): the monitor carries on with its container.
    with contextlib.suppress(OSError):
        os.write(reply_fd, json.dumps({"ok": True, **started}).encode())
    os.close(reply_fd)
    code, finished = _pump(pid, out_r, err_r, _LogWriter(log_fd, spec.get("log_path", "")))
    if _FEED is not None:
        _FEED.close()
    # Output drained first (the log is complete when the exit is known), exit.json next (the
    # durable record), then the note: the runtime records exactly what is on disk.
    record = {"exit_code": code, "finished_at": finished,
              "reason": "Completed" if code == 0 else "Error", "message": ""}
    write_json_atomic(f"{state}.exit.json", record)
    send_exit_note(notify, {"id": os.path.basename(state), **record})
    os._exit(0)
