"""containerd's default seccomp profile (RuntimeDefault), as data: moby's default profile as
containerd 1.6.20 carries it (``contrib/seccomp/seccomp_default.go``, the containerd these
machines run), so a container gets the same allow-list from the embedded runtime as from
containerd. ``default_profile(caps, machine)`` builds it for one container the way
``DefaultProfile`` does: every other syscall fails with EPERM (``SCMP_ACT_ERRNO``); the base
list, ``personality`` with five values, ``ptrace`` (kernel >= 4.8, so always here), the
machine's own calls, the calls of each capability in the container's bounding set, and without
CAP_SYS_ADMIN ``clone`` only without namespace flags and ``clone3`` failing with ENOSYS (so
glibc falls back to ``clone``). The profile is in the OCI runtime spec's form (what a Localhost
profile file holds too, seccomp.py).
"""

from __future__ import annotations

import errno
from typing import Any

ALLOWED = (
    "accept", "accept4", "access", "adjtimex", "alarm", "bind", "brk", "capget", "capset",
    "chdir", "chmod", "chown", "chown32", "clock_adjtime", "clock_adjtime64", "clock_getres",
    "clock_getres_time64", "clock_gettime", "clock_gettime64", "clock_nanosleep",
    "clock_nanosleep_time64", "close", "close_range", "connect", "copy_file_range", "creat",
    "dup", "dup2", "dup3", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old",
    "epoll_pwait", "epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2",
    "execve", "execveat", "exit", "exit_group", "faccessat", "faccessat2", "fadvise64",
    "fadvise64_64", "fallocate", "fanotify_mark", "fchdir", "fchmod", "fchmodat", "fchown",
    "fchown32", "fchownat", "fcntl", "fcntl64", "fdatasync", "fgetxattr", "flistxattr",
    "flock", "fork", "fremovexattr", "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs",
    "fstatfs64", "fsync", "ftruncate", "ftruncate64", "futex", "futex_time64", "futex_waitv",
    "futimesat", "getcpu", "getcwd", "getdents", "getdents64", "getegid", "getegid32",
    "geteuid", "geteuid32", "getgid", "getgid32", "getgroups", "getgroups32", "getitimer",
    "getpeername", "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom",
    "getresgid", "getresgid32", "getresuid", "getresuid32", "getrlimit", "get_robust_list",
    "getrusage", "getsid", "getsockname", "getsockopt", "get_thread_area", "gettid",
    "gettimeofday", "getuid", "getuid32", "getxattr", "inotify_add_watch", "inotify_init",
    "inotify_init1", "inotify_rm_watch", "io_cancel", "ioctl", "io_destroy", "io_getevents",
    "io_pgetevents", "io_pgetevents_time64", "ioprio_get", "ioprio_set", "io_setup",
    "io_submit", "io_uring_enter", "io_uring_register", "io_uring_setup", "ipc", "kill",
    "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self", "lchown",
    "lchown32", "lgetxattr", "link", "linkat", "listen", "listxattr", "llistxattr", "_llseek",
    "lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64", "madvise", "membarrier",
    "memfd_create", "memfd_secret", "mincore", "mkdir", "mkdirat", "mknod", "mknodat", "mlock",
    "mlock2", "mlockall", "mmap", "mmap2", "mprotect", "mq_getsetattr", "mq_notify", "mq_open",
    "mq_timedreceive", "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64",
    "mq_unlink", "mremap", "msgctl", "msgget", "msgrcv", "msgsnd", "msync", "munlock",
    "munlockall", "munmap", "nanosleep", "newfstatat", "_newselect", "open", "openat",
    "openat2", "pause", "pidfd_open", "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc",
    "pkey_free", "pkey_mprotect", "poll", "ppoll", "ppoll_time64", "prctl", "pread64",
    "preadv", "preadv2", "prlimit64", "process_mrelease", "pselect6", "pselect6_time64",
    "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv",
    "recv", "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg", "remap_file_pages",
    "removexattr", "rename", "renameat", "renameat2", "restart_syscall", "rmdir", "rseq",
    "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn",
    "rt_sigsuspend", "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_tgsigqueueinfo",
    "sched_getaffinity", "sched_getattr", "sched_getparam", "sched_get_priority_max",
    "sched_get_priority_min", "sched_getscheduler", "sched_rr_get_interval",
    "sched_rr_get_interval_time64", "sched_setaffinity", "sched_setattr", "sched_setparam",
    "sched_setscheduler", "sched_yield", "seccomp", "select", "semctl", "semget", "semop",
    "semtimedop", "semtimedop_time64", "send", "sendfile", "sendfile64", "sendmmsg", "sendmsg",
    "sendto", "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32",
    "setgroups", "setgroups32", "setitimer", "setpgid", "setpriority", "setregid",
    "setregid32", "setresgid", "setresgid32", "setresuid", "setresuid32", "setreuid",
    "setreuid32", "setrlimit", "set_robust_list", "setsid", "setsockopt", "set_thread_area",
    "set_tid_address", "setuid", "setuid32", "setxattr", "shmat", "shmctl", "shmdt", "shmget",
    "shutdown", "sigaltstack", "signalfd", "signalfd4", "sigprocmask", "sigreturn", "socket",
    "socketcall", "socketpair", "splice", "stat", "stat64", "statfs", "statfs64", "statx",
    "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "sysinfo", "tee", "tgkill",
    "time", "timer_create", "timer_delete", "timer_getoverrun", "timer_gettime",
    "timer_gettime64", "timer_settime", "timer_settime64", "timerfd_create", "timerfd_gettime",
    "timerfd_gettime64", "timerfd_settime", "timerfd_settime64", "times", "tkill", "truncate",
    "truncate64", "ugetrlimit", "umask", "uname", "unlink", "unlinkat", "utime", "utimensat",
    "utimensat_time64", "utimes", "vfork", "vmsplice", "wait4", "waitid", "waitpid", "write",
    "writev",
)

# by machine (platform.machine()), as containerd's switch on GOARCH

BY_MACHINE = {
    "x86_64": ("arch_prctl", "modify_ldt",),
    "aarch64": (
        "arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint",
        "cacheflush", "set_tls",
    ),
    "armv7l": (
        "arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint",
        "cacheflush", "set_tls",
    ),
    "ppc64le": ("sync_file_range2", "swapcontext",),
    "i686": ("modify_ldt",),
    "s390x": ("s390_pci_mmio_read", "s390_pci_mmio_write", "s390_runtime_instr",),
    "riscv64": ("riscv_flush_icache",),
}

# allowed when the container's bounding set holds the capability
BY_CAPABILITY = {
    "DAC_READ_SEARCH": ("open_by_handle_at",),
    "SYS_ADMIN": (
        "bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen",
        "fspick", "lookup_dcookie", "mount", "mount_setattr", "move_mount",
        "name_to_handle_at", "open_tree", "perf_event_open", "quotactl", "quotactl_fd",
        "setdomainname", "sethostname", "setns", "syslog", "umount", "umount2", "unshare",
    ),
    "SYS_BOOT": ("reboot",),
    "SYS_CHROOT": ("chroot",),
    "SYS_MODULE": ("delete_module", "init_module", "finit_module",),
    "SYS_PACCT": ("acct",),
    "SYS_PTRACE": (
        "kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev",
        "ptrace",
    ),
    "SYS_RAWIO": ("iopl", "ioperm",),
    "SYS_TIME": ("settimeofday", "stime", "clock_settime", "clock_settime64",),
    "SYS_TTY_CONFIG": ("vhangup",),
    "SYS_NICE": ("get_mempolicy", "mbind", "set_mempolicy",),
    "SYSLOG": ("syslog",),
    "BPF": ("bpf",),
    "PERFMON": ("perf_event_open",),
}

NOT_ADMIN_CLONE = ("clone",)

NOT_ADMIN_ENOSYS = ("clone3",)


# containerd's arches(): the architectures the filter covers on each machine.
ARCHES = {
    "x86_64": ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"),
    "aarch64": ("SCMP_ARCH_ARM", "SCMP_ARCH_AARCH64"),
    "s390x": ("SCMP_ARCH_S390", "SCMP_ARCH_S390X"),
    "riscv64": ("SCMP_ARCH_RISCV64",),
}
PERSONALITY = (0x0, 0x0008, 0x20000, 0x20008, 0xFFFFFFFF)
# CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET |
# CLONE_NEWCGROUP: clone without CAP_SYS_ADMIN may make none of these.
CLONE_NAMESPACES = 0x7E020000


def _allow(names: tuple[str, ...], args: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"names": list(names), "action": "SCMP_ACT_ALLOW", "args": args or []}


def default_profile(caps: set[str], machine: str) -> dict[str, Any]:
    """``DefaultProfile`` for a container whose bounding set is ``caps`` (names without
    ``CAP_``) on ``machine`` (``platform.machine()``)."""
    rules = [_allow(ALLOWED)]
    rules += [_allow(("personality",), [{"index": 0, "value": v, "op": "SCMP_CMP_EQ"}])
              for v in PERSONALITY]
    rules.append(_allow(("ptrace",)))
    if machine in BY_MACHINE:
        rules.append(_allow(BY_MACHINE[machine]))
    rules += [_allow(names) for cap, names in BY_CAPABILITY.items() if cap in caps]
    if "SYS_ADMIN" not in caps:
        index = 1 if machine.startswith("s390") else 0
        rules.append(_allow(NOT_ADMIN_CLONE, [{"index": index, "value": CLONE_NAMESPACES,
                                               "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]))
        rules.append({"names": list(NOT_ADMIN_ENOSYS), "action": "SCMP_ACT_ERRNO",
                      "errnoRet": errno.ENOSYS, "args": []})
    return {"defaultAction": "SCMP_ACT_ERRNO", "architectures": list(ARCHES.get(machine, ())),
            "syscalls": rules}
