"""The one error type every RuntimeClient raises: a CRI call that failed, with its gRPC code."""

from __future__ import annotations

import grpc


class CriError(Exception):
    """A CRI call failed. ``code`` is the gRPC status code (NOT_FOUND, DEADLINE_EXCEEDED, ...).

    Timeouts on the client side surface as ``DEADLINE_EXCEEDED``; an unreachable runtime as
    ``UNAVAILABLE``.
    """

    def __init__(self, method: str, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{method}: {code.name}: {message}")
        self.method = method
        self.code = code
        self.message = message

    @property
    def not_found(self) -> bool:
        return bool(self.code == grpc.StatusCode.NOT_FOUND)

    @property
    def unimplemented(self) -> bool:
        return bool(self.code == grpc.StatusCode.UNIMPLEMENTED)

    @property
    def unavailable(self) -> bool:
        """The runtime could not be reached, or went away during the call (its answer is
        lost: the call may or may not have taken effect): UNAVAILABLE, or gRPC's UNKNOWN
        "Stream removed" (the connection closed under a call in flight, as when the runtime
        is killed while it serves one)."""
        return bool(self.code == grpc.StatusCode.UNAVAILABLE or (
            self.code == grpc.StatusCode.UNKNOWN and self.message.startswith("Stream removed")))

    @property
    def name_reserved(self) -> bool:
        """containerd refused RunPodSandbox or CreateContainer because the name is held by an
        earlier call for the same attempt that is still running or being undone (its caller,
        a killed sync loop, went away): the name is free, or the object listed, moments
        later."""
        return "failed to reserve" in self.message and "is reserved" in self.message


def from_rpc_error(method: str, err: grpc.RpcError) -> CriError:
    """Turn a grpc.RpcError (also a grpc.Call) into a CriError."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return CriError(method, code or grpc.StatusCode.UNKNOWN, details or "")
