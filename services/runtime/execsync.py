"""ExecSync: run a command in a running container's context (its env, working dir, network
and mount namespaces, user, groups, capabilities and no_new_privs)."""

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
from podvisor.services.runtime.security import names_of

MAX_OUTPUT = 16 * 1024 * 1024 - 64 * 1024  # stay under the kubelet's 16 MiB message limit


def exec_sync(spec: dict[str, Any], cmd: Sequence[str], timeout: int,
              pid: int = 0) -> pb.ExecSyncResponse:
    """``spec``: the container's (``Engine.spec``); ``pid``: its main process, whose mount
    namespace the command joins (with util-linux ``nsenter``) when the container has mounts,
    so probes and hooks see what the container sees. The runtime is multi-threaded, so no
    setns between fork and exec here."""
    argv, env, cwd = exec_command(spec, cmd, pid)
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


def exec_command(spec: dict[str, Any], cmd: Sequence[str],
                 pid: int) -> tuple[list[str], dict[str, str], str]:
    """The argv, environment and working directory that run ``cmd`` in the container's
    context (shared by ExecSync and the streaming Exec)."""
    if not cmd:
        raise invalid("exec: empty command")
    env = dict(item.split("=", 1) for item in spec["env"])
    sec = spec.get("security")
    loader = list(sec.get("seccomp_exec") or []) if sec else []
    # the container's seccomp filter, in runc's order: after no_new_privs when it is set, else
    # before the ids and capabilities change (a filter without no_new_privs needs
    # CAP_SYS_ADMIN)
    prefix = (security_prefix(sec) + loader if sec and sec["nnp"]
              else loader + security_prefix(sec))
    argv, cwd = prefix + list(cmd), spec.get("cwd") or "/"
    mounts = bool(spec.get("mounts") or has_private_mounts(sec))
    netns = str(spec.get("netns") or "")
    uts = bool(spec.get("hostname"))
    if mounts or netns or uts:
        nsenter = shutil.which("nsenter")
        if nsenter is None:
            raise precondition("exec in a container with mounts, a pod network or the pod's "
                               "hostname needs nsenter (util-linux) on the runtime's PATH")
        # the sandbox's network namespace (its file, as the container's monitor joined it),
        # then the container's UTS namespace (the pod's hostname) and mounts, as the
        # container's process sees them
        enter = [f"--net={netns}"] if netns else []
        if uts:
            enter.append(f"--uts=/proc/{pid}/ns/uts")
        if mounts:
            enter += [f"--mount=/proc/{pid}/ns/mnt", f"--wd={cwd}"]
            cwd = "/"
        argv = [nsenter, *enter, "--", *argv]
    return argv, env, cwd


def has_private_mounts(sec: dict[str, Any] | None) -> bool:
    """The container has a mount namespace of its own for its masked/read-only paths."""
    return bool(sec and (sec["masked"] or sec["readonly"] or sec["ro_root"]))


def security_prefix(sec: dict[str, Any] | None) -> list[str]:
    """util-linux ``setpriv`` with the container's security context (security.py): the command
    gets the same user, groups, capabilities (bounding set; root's effective = bounding after
    exec) and no_new_privs as the container's process. [] when there is nothing to apply."""
    if not sec or not (sec["manage"] or sec["nnp"]):
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise precondition("exec in a container with a security context needs setpriv "
                           "(util-linux) on the runtime's PATH")
    argv = [setpriv]
    if sec["manage"]:
        groups = ",".join(map(str, sec["groups"]))
        bounding = ",".join(["-all", *(f"+{n.lower()}" for n in names_of(int(sec["caps"])))])
        argv += [f"--reuid={sec['uid']}", f"--regid={sec['gid']}",
                 f"--groups={groups}" if groups else "--clear-groups",
                 f"--bounding-set={bounding}", "--inh-caps=-all"]
    if sec["nnp"]:
        argv.append("--no-new-privs")
    return [*argv, "--"]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
