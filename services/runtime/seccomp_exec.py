"""``python -m podvisor.services.runtime.seccomp_exec FILE -- CMD...``: run CMD under a
container's seccomp filter (the Python twin of ``pv-monitor --seccomp-exec``), for ExecSync and
Exec in a container with a profile when the C monitor is not built with libseccomp. FILE holds
the filter as monitor.c's SECCOMP fields (engine.py ``_seccomp_loader``). Errors go to stderr,
exit code 127 (the command did not run)."""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

from podvisor.services.runtime.monitor import build_seccomp, load_seccomp


def read_filter(data: bytes) -> dict[str, Any]:
    """monitor.c ``parse_seccomp`` for a file written by ``seccomp_fields``."""
    fields = data.split(b"\0")[:-1]
    at = iter(f.decode() for f in fields)
    if next(at) != "SECCOMP":
        raise ValueError("not a seccomp filter")
    default = int(next(at))
    arches = [next(at) for _ in range(int(next(at)))]
    flat = [int(next(at)) for _ in range(int(next(at)))]
    rules = []
    for _ in range(int(next(at))):
        name, action, n = next(at), int(next(at)), int(next(at))
        rules.append([name, action, [[int(next(at)) for _ in range(4)] for _ in range(n)]])
    return {"default": default, "arches": arches,
            "attrs": [flat[i:i + 2] for i in range(0, len(flat), 2)], "rules": rules}


def main(argv: list[str]) -> NoReturn:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: seccomp_exec FILE -- CMD...\n")
        os._exit(2)
    try:
        with open(argv[1], "rb") as f:
            filt = build_seccomp(read_filter(f.read()))
        load_seccomp(filt)
        os.execvp(argv[3], argv[3:])
    except (OSError, ValueError, StopIteration) as err:
        sys.stderr.write(f"seccomp_exec: {err}\n")
        sys.stderr.flush()
    os._exit(127)


if __name__ == "__main__":
    main(sys.argv)
