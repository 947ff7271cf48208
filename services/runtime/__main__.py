"""Standalone embedded runtime, for tests and benchmarks without the supervisor:

    python -m podvisor.services.runtime --root DIR --socket PATH

Serves until SIGTERM/SIGINT; containers keep running after it exits (kill -9 included).
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from podvisor.common import crashpoints
from podvisor.services.runtime.jsonlog import JsonLogger
from podvisor.services.runtime.server import RuntimeServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m podvisor.services.runtime")
    parser.add_argument("--root", required=True, type=Path, help="state directory")
    parser.add_argument("--socket", required=True, type=Path, help="unix socket to serve on")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())
    signal.signal(signal.SIGINT, lambda _s, _f: stop.set())
    server = RuntimeServer(args.root.resolve(), args.socket.resolve(), JsonLogger("runtime"),
                           crash=crashpoints.from_env("runtime"))
    server.start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
