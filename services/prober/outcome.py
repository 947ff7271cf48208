"""What a probe handler answers, and socket helpers shared by the handlers."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from podvisor.services.prober.worker import Result


@dataclass(frozen=True)
class Outcome:
    result: Result
    message: str = ""


def set_linger_zero(sock: socket.socket) -> None:
    """Close with an RST: no TIME_WAIT left on the node per probe (kubernetes #89898)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
