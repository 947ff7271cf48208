"""The supervised processes' states for ``/metrics``: one ``status`` call on the control endpoint.

The server asks the supervisor at scrape time (a DEALER request on ``run/control.sock``, msgpack
``{"command": "status", "args": {}}``, the same wire ``podvisorctl`` speaks), so the figures are
the supervisor's own, never a copy that a restarted server would have to rebuild; the call runs
on a worker thread with its own socket, bounded by ``timeout``. ``None`` when the agent does not
answer (it is stopping): the scrape then leaves the process metrics out.
"""

from __future__ import annotations

from typing import Any

import msgpack
import zmq

__all__ = ["process_rows"]


def process_rows(zctx: zmq.Context[zmq.Socket[bytes]], endpoint: str,
                 timeout: float = 1.0) -> list[dict[str, Any]] | None:
    sock = zctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(msgpack.packb({"command": "status", "args": {}}))
        if not sock.poll(int(timeout * 1000)):
            return None
        reply = msgpack.unpackb(sock.recv_multipart()[-1])
    except (zmq.ZMQError, ValueError, msgpack.UnpackException):
        return None
    finally:
        sock.close(linger=0)
    if not isinstance(reply, dict) or not reply.get("ok"):
        return None
    result = reply.get("result")
    rows = result.get("processes") if isinstance(result, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else None
