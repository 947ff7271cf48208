"""The runtime's one error type; the gRPC layer turns it into a status code and message."""

from __future__ import annotations

import grpc


class Fault(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def not_found(kind: str, ident: str) -> Fault:
    return Fault(grpc.StatusCode.NOT_FOUND, f"{kind} {ident!r} not found")


def invalid(message: str) -> Fault:
    return Fault(grpc.StatusCode.INVALID_ARGUMENT, message)


def precondition(message: str) -> Fault:
    return Fault(grpc.StatusCode.FAILED_PRECONDITION, message)
