"""``resource`` faults (issue 28): CPU or memory pressure from a stress child placed in the
cgroups of a subsystem or of a pod's container.

``StressChild.start`` runs ``python -m podvisor.supervisor.stress cpu|memory AMOUNT``, moves it
into the target's cgroups (every hierarchy the target's ``/proc/<pid>/cgroup`` names: v1 and
v2 alike; a pod's: those of the first process found in a cgroup folder ``pod<uid>``), then
tells it to begin (a byte on its stdin): ``cpu N`` spins N busy processes, ``memory M`` holds M
MiB touched (so they count against the cgroup's memory: under a pod's limit, its containers may
be OOM-killed: that is the pressure). The child dies with the supervisor (parent-death signal)
and when the fault ends (SIGKILL by PID, then reaped). A subsystem without a cgroup of its own
shares the agent's: the pressure is then on the whole agent, which is what a noisy neighbour in
that cgroup does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["StressChild", "cgroups_of", "pod_cgroups", "pod_uid"]

CGROUP_FS = Path("/sys/fs/cgroup")
PR_SET_PDEATHSIG = 1


def cgroups_of(pid: int) -> list[Path]:
    """The cgroup folders (one per mounted hierarchy) ``pid`` is in; [] when unknown."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers.startswith("name=") or path in ("", "/"):
            continue
        names = controllers.split(",") if controllers else ["unified", ""]
        for name in names:
            base = CGROUP_FS / name if name else CGROUP_FS
            folder = base / path.lstrip("/")
            if (folder / "cgroup.procs").exists():
                out.append(folder)
                break
    return out


def pod_uid(endpoint: str, name: str, node: str) -> str | None:
    """The UID of the ready pod sandbox named ``name`` (``namespace/name``; a static pod's
    ``<name>-<node>`` too), asked of the runtime (CRI ListPodSandbox)."""
    from podvisor.common import labels
    from podvisor.services.cri import CriError, new_runtime_client

    namespace, _, short = name.rpartition("/")
    cri = None
    try:
        cri = new_runtime_client(endpoint, timeout=5.0)
        for sandbox in cri.list_pod_sandbox():
            meta = sandbox.metadata
            if sandbox.state == 0 and meta.name in (short, f"{short}-{node}") and (
                    not namespace or meta.namespace == namespace):
                return str(sandbox.labels.get(labels.POD_UID) or meta.uid)
    except (CriError, OSError, ValueError):
        return None
    finally:
        if cri is not None:
            cri.close()
    return None


def pod_cgroups(uid: str) -> list[Path]:
    """The cgroups of a process of pod ``uid`` (one in a folder ``pod<uid>``); [] when none."""
    mark = f"/pod{uid}"
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if mark in Path(f"/proc/{entry.name}/cgroup").read_text():
                return cgroups_of(int(entry.name))
    return []


class StressChild:
    """One stress child; ``stop()`` is idempotent."""

    def __init__(self, kind: str, amount: int, cgroups: list[Path]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "podvisor.supervisor.stress", kind, str(amount)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for folder in cgroups:
                (folder / "cgroup.procs").write_text(f"{self.proc.pid}\n")
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"go")
            self.proc.stdin.close()
        except OSError:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main(argv: list[str]) -> int:
    """The child: wait for the go (its cgroups set), then press until killed."""
    kind, amount = argv[0], int(argv[1])
    _die_with_parent()
    os.setpgid(0, 0)  # its workers are one group: stopped together
    if os.getppid() == 1 or sys.stdin.buffer.read(2) != b"go":
        return 1
    if kind == "memory":
        hold = bytearray(amount * 1024 * 1024)
        for i in range(0, len(hold), 4096):  # touched: resident, charged to the cgroup
            hold[i] = 1
        signal.pause()
        return 0
    for _ in range(max(0, amount - 1)):
        if os.fork() == 0:
            _die_with_parent()
            break
    while True:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
