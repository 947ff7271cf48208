"""Numbered control faults (codes follow supervisord's `xmlrpc.Faults` where one exists).

Commands raise `ControlFault(Fault.X, message)`; the control boundary turns it (and any other
exception, as FAILED) into a reply `{"ok": false, "fault": {"code", "name", "message"}}`.
"""

from __future__ import annotations

import enum

__all__ = ["ControlFault", "Fault"]


class Fault(enum.IntEnum):
    UNKNOWN_METHOD = 1
    INCORRECT_PARAMETERS = 2
    BAD_ARGUMENTS = 3
    SHUTDOWN_STATE = 6
    BAD_NAME = 10
    BAD_SIGNAL = 11
    NO_FILE = 20
    FAILED = 30
    ABNORMAL_TERMINATION = 40
    SPAWN_ERROR = 50
    ALREADY_STARTED = 60
    NOT_RUNNING = 70
    CANT_REREAD = 92
    TIMEOUT = 100
    NOT_AVAILABLE = 110  # the answering process (e.g. for `pods`) is not running


class ControlFault(Exception):
    def __init__(self, fault: Fault, message: str) -> None:
        super().__init__(f"{fault.name}: {message}")
        self.fault = fault
        self.message = message

    def to_wire(self) -> dict[str, object]:
        return {"code": int(self.fault), "name": self.fault.name, "message": self.message}
