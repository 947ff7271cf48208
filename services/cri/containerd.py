"""A task containerd's CRI cannot remove, removed through containerd's own task API.

containerd 1.6 (and 1.7; containerd/containerd#11037, open upstream): a StartContainer whose
caller goes away (its context is cancelled: the sync loop was killed mid-call) after containerd
created the container's task, but before it read the task's pid, fails with "failed to create
containerd task: failed to get task pid: context canceled" and leaves the task behind, created
and never started: its ``runc init`` waits in the pod's cgroup for a start that never comes.
CRI reports the container exited, and every RemoveContainer of it (so every RemovePodSandbox of
its pod) answers FAILED_PRECONDITION "cannot delete running task": through CRI the pod can never
be removed, and a process of it outlives it.

The CRI is the record: a container it says is not running has no business with a live task. So
``remove_container`` (grpc_client.py) meets that answer by killing, reaping and deleting the
task with containerd's task service (same socket, namespace ``k8s.io``, the CRI plugin's) and
removing the container again. The three messages are encoded here by hand (each a container id,
plus the signal for Kill): containerd's API package is not a dependency.
"""

from __future__ import annotations

from typing import Any

import grpc

from podvisor.services.cri.errors import CriError, from_rpc_error

NAMESPACE = (("containerd-namespace", "k8s.io"),)  # the namespace of containerd's CRI plugin
_TASKS = "/containerd.services.tasks.v1.Tasks/"
_SIGKILL = 9


def stuck_task(err: CriError) -> bool:
    """RemoveContainer's answer when the container's task outlived what CRI knows of it."""
    return (err.code == grpc.StatusCode.FAILED_PRECONDITION
            and "cannot delete running task" in err.message)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _container_id(container_id: str) -> bytes:
    """Field 1 (container_id, a string) of KillRequest, WaitRequest and DeleteTaskRequest."""
    data = container_id.encode()
    return b"\x0a" + _varint(len(data)) + data


def kill_request(container_id: str, signal: int = _SIGKILL) -> bytes:
    """KillRequest{container_id: 1, signal: 3} (exec_id and all left empty: the init)."""
    return _container_id(container_id) + b"\x18" + _varint(signal)


def clear_task(channel: grpc.Channel, container_id: str, timeout: float) -> None:
    """Kill the container's task (its init), wait for it to exit, delete it. A task already gone
    or already stopped is fine; any other failure raises CriError (method ``Tasks/<name>``)."""
    for name, request in (("Kill", kill_request(container_id)),
                          ("Wait", _container_id(container_id)),
                          ("Delete", _container_id(container_id))):
        call: Any = channel.unary_unary(_TASKS + name)
        try:
            call(request, timeout=timeout, metadata=NAMESPACE)
        except grpc.RpcError as err:
            failed = from_rpc_error(f"Tasks/{name}", err)
            if failed.not_found:
                continue  # Kill: "process already finished"; Wait/Delete: no task any more
            raise failed from None
