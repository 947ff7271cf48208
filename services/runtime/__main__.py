"""Standalone embedded runtime, for tests and benchmarks without the supervisor:

    python -m podvisor.services.runtime --root DIR --socket PATH [--network-plugin cni
        [--cni-conf-dir DIR] [--cni-bin-dir DIRS]]

Serves until SIGTERM/SIGINT; containers keep running after it exits (kill -9 included).
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path

from podvisor.common import crashpoints
from podvisor.services.runtime.cni import DEFAULT_BIN_DIRS
from podvisor.services.runtime.jsonlog import JsonLogger
from podvisor.services.runtime.server import NetworkSettings, RuntimeServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m podvisor.services.runtime")
    parser.add_argument("--root", required=True, type=Path, help="state directory")
    parser.add_argument("--socket", required=True, type=Path, help="unix socket to serve on")
    parser.add_argument("--network-plugin", choices=("host", "cni"), default="host",
                        help="the pod network (networkPlugin)")
    parser.add_argument("--cni-conf-dir", type=Path, default=None,
                        help="CNI config directory (default ROOT/cni/net.d)")
    parser.add_argument("--cni-bin-dir", default=DEFAULT_BIN_DIRS, help="CNI plugins")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    network = NetworkSettings(args.network_plugin,
                              str(args.cni_conf_dir or root / "cni" / "net.d"), args.cni_bin_dir)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())
    signal.signal(signal.SIGINT, lambda _s, _f: stop.set())
    server = RuntimeServer(root, args.socket.resolve(), JsonLogger("runtime"),
                           crash=crashpoints.from_env("runtime"), network=network)
    server.start()
    try:
        _until(stop)
    finally:
        server.stop()
    return 0


def _until(stop: threading.Event) -> None:
    """Block until a signal handler sets ``stop``. Through the signal wake-up fd: a signal that
    lands in one of gRPC's threads writes it too, where a bare ``stop.wait()`` could miss it."""
    r, w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    try:
        if not stop.is_set():  # a signal before the fd was set set it already
            os.read(r, 1)  # SIGTERM and SIGINT are the only signals handled here
    finally:
        signal.set_wakeup_fd(-1)
        os.close(r)
        os.close(w)


if __name__ == "__main__":
    raise SystemExit(main())
