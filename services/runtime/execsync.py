"""ExecSync: run a command in a running container's context (its env and working dir)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.faults import Fault, invalid, precondition

MAX_OUTPUT = 16 * 1024 * 1024 - 64 * 1024  # stay under the kubelet's 16 MiB message limit


def exec_sync(spec: dict[str, Any], cmd: Sequence[str], timeout: int,
              pid: int = 0) -> pb.ExecSyncResponse:
    """``spec``: the container's (``Engine.spec``); ``pid``: its main process, whose mount
    namespace the command joins (with util-linux ``nsenter``) when the container has mounts,
    so probes and hooks see what the container sees. The runtime is multi-threaded, so no
    setns between fork and exec here."""
    if not cmd:
        raise invalid("exec: empty command")
    env = dict(item.split("=", 1) for item in spec["env"])
    argv, cwd = list(cmd), spec.get("cwd") or "/"
    if spec.get("mounts"):
        nsenter = shutil.which("nsenter")
        if nsenter is None:
            raise precondition("exec in a container with mounts needs nsenter (util-linux) "
                               "on the runtime's PATH")
        argv = [nsenter, f"--mount=/proc/{pid}/ns/mnt", f"--wd={cwd}", "--", *argv]
        cwd = "/"
    try:
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )
    except OSError as err:
        raise invalid(f'exec "{cmd[0]}": {err.strerror} (errno {err.errno})') from None
    try:
        out, err_out = proc.communicate(timeout=timeout if timeout > 0 else None)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise Fault(grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"exec {list(cmd)!r} timed out after {timeout} s") from None
    except BaseException:
        _kill_group(proc)
        raise
    code = proc.returncode
    return pb.ExecSyncResponse(stdout=out[:MAX_OUTPUT], stderr=err_out[:MAX_OUTPUT],
                               exit_code=128 - code if code < 0 else code)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
