"""Descriptor limit: raise the soft RLIMIT_NOFILE to the hard limit at start.

The runtime holds descriptors that grow with the number of containers (a pidfd per container
for the exit watcher, a log descriptor while a container starts, gRPC connections), so the
usual soft limit of 1,024 stops it at roughly a thousand containers. Container runtimes
(containerd, dockerd) raise their soft limit to the hard one when they start; so do the agent's
supervisor (its children inherit it) and the runtime itself (when started alone). Processes the
runtime starts inherit the raised limit, as containers under dockerd do.
"""

from __future__ import annotations

import resource


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (old soft, new soft). Never
    fails: when the kernel refuses (a hard limit of RLIM_INFINITY above the kernel's nr_open),
    the soft limit stays where it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    for target in (hard, _nr_open()):
        if target != resource.RLIM_INFINITY and target <= soft:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue  # RLIM_INFINITY is refused above fs.nr_open: try that instead
        return soft, target
    return soft, soft


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open", encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0
