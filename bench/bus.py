"""Bus benchmark: podvisor's bus (PUB -> XSUB/XPUB proxy -> SUB, envelope codec) against raw
pyzmq + msgpack (PUB -> SUB, one frame) measured in the same run.

Prints throughput (msg/s) for 200-byte msgpack dicts and p50/p99 latency at 1k msg/s, and the
ratios podvisor/raw. Figures, not assertions.

    python bench/bus.py [--messages 200000] [--rate-seconds 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq

from podvisor.ipc.bus import HWM, BusProxy, Publisher, Subscriber
from podvisor.ipc.messages import Probe
from podvisor.ipc.paths import RunPaths

PAYLOAD = {"pod": "web-node1", "container": "nginx", "state": "RUNNING", "restarts": 3,
           "image": "host", "id": "c" * 64, "exit": None, "ts": 1.0}


def _raw_pub(addr: str, n: int, rate: float, go: Any) -> None:
    zctx = zmq.Context()
    s = zctx.socket(zmq.PUB)
    s.setsockopt(zmq.SNDHWM, HWM)
    s.connect(addr)
    go.wait()
    _send_loop(lambda i: s.send(msgpack.packb({**PAYLOAD, "n": i, "t": time.monotonic()})), n, rate)
    s.close(linger=5000)


def _pv_pub(root: str, n: int, rate: float, go: Any) -> None:
    zctx = zmq.Context()
    pub = Publisher(zctx, RunPaths(Path(root)), "bench")
    go.wait()
    _send_loop(
        lambda i: pub.publish(Probe(n=i, payload={**PAYLOAD, "t": time.monotonic()})), n, rate
    )
    pub.socket.close(linger=5000)


def _proxy(root: str, stop: Any) -> None:
    zctx = zmq.Context()
    proxy = BusProxy(zctx, RunPaths(Path(root)))
    proxy.start()
    stop.wait()
    proxy.stop()


def _send_loop(send: Any, n: int, rate: float) -> None:
    start = time.monotonic()
    for i in range(n):
        if rate:
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        send(i)


def _receive(recv_one: Any, n: int, idle: float = 2.0) -> tuple[int, float, list[float]]:
    """Receive until n messages or ``idle`` seconds of silence; (count, seconds, latencies)."""
    got, lat, first, last = 0, [], 0.0, 0.0
    while got < n:
        item = recv_one(idle)
        if item is None:
            break
        now = time.monotonic()
        first = first or now
        last = now
        lat.append(now - item)
        got += 1
    return got, (last - first) or 1e-9, lat


def _subscribed(sock: zmq.Socket[bytes]) -> None:
    time.sleep(0.3)  # benchmark, not a test: let subscriptions reach the publisher first


Result = tuple[int, float, list[float]]


def _raw_run(sub: zmq.Socket[bytes], pub_addr: str, n: int, rate: float) -> Result:
    """Receive ``n`` raw messages on ``sub`` from a raw publisher process sending to pub_addr."""
    go = mp.Event()
    p = mp.Process(target=_raw_pub, args=(pub_addr, n, rate, go))
    p.start()
    _subscribed(sub)
    go.set()

    def recv_one(idle: float) -> float | None:
        try:
            data = sub.recv(zmq.NOBLOCK)
        except zmq.Again:
            if not sub.poll(int(idle * 1000)):
                return None
            data = sub.recv()
        return float(msgpack.unpackb(data)["t"])

    res = _receive(recv_one, n)
    p.join()
    sub.close(linger=0)
    return res


def _raw_sub(zctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, HWM)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    return sub


def _with_proxy(fn: Any) -> Result:
    """Run ``fn(paths)`` while a podvisor bus proxy runs in its own process (as the supervisor's
    thread would), then stop the proxy."""
    root = tempfile.mkdtemp(prefix="pvb", dir="/tmp")
    paths = RunPaths(Path(root))
    paths.ensure()
    stop = mp.Event()
    proxy = mp.Process(target=_proxy, args=(root, stop))
    proxy.start()
    try:
        return fn(paths)  # type: ignore[no-any-return]
    finally:
        stop.set()
        proxy.join()
        shutil.rmtree(root, ignore_errors=True)


def run_raw(n: int, rate: float) -> Result:
    tmp = tempfile.mkdtemp(prefix="pvb", dir="/tmp")
    sub = _raw_sub(zmq.Context())
    sub.bind(f"ipc://{tmp}/raw.sock")
    try:
        return _raw_run(sub, f"ipc://{tmp}/raw.sock", n, rate)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_raw_via_proxy(n: int, rate: float) -> Result:
    """Raw pyzmq + msgpack, but through podvisor's proxy process: isolates the cost of the hop."""
    def run(paths: RunPaths) -> Result:
        sub = _raw_sub(zmq.Context())
        sub.connect(paths.bus_sub)
        return _raw_run(sub, paths.bus_pub, n, rate)
    return _with_proxy(run)


def run_podvisor(n: int, rate: float) -> Result:
    def run(paths: RunPaths) -> Result:
        sub = Subscriber(zmq.Context(), paths, ["bus."])
        go = mp.Event()
        p = mp.Process(target=_pv_pub, args=(str(paths.root), n, rate, go))
        p.start()
        _subscribed(sub.socket)
        go.set()

        def recv_one(idle: float) -> float | None:
            env = sub.recv(idle)
            return None if env is None else float(env.message.payload["t"])  # type: ignore[attr-defined]

        res = _receive(recv_one, n)
        p.join()
        sub.close()
        return res
    return _with_proxy(run)


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] * 1000 if len(xs) > 2 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rate-seconds", type=float, default=3.0)
    ap.add_argument("--json", action="store_true",
                    help="also print the figures as one JSON object on the last line")
    a = ap.parse_args()
    mp.set_start_method("spawn")
    print(f"payload: {len(msgpack.packb(PAYLOAD))} bytes msgpack dict; "
          f"load average {os.getloadavg()[0]:.2f}")
    res = {}
    delivered: dict[str, float] = {}
    runs = (("raw pyzmq+msgpack", run_raw), ("raw via the proxy", run_raw_via_proxy),
            ("podvisor bus", run_podvisor))
    for name, fn in runs:
        got, secs, _ = fn(a.messages, 0.0)
        tput = got / secs
        n_rate = int(1000 * a.rate_seconds)
        _, _, lat = fn(n_rate, 1000.0)
        res[name] = (tput, _pct(lat, 50), _pct(lat, 99))
        delivered[name] = got / a.messages
        print(f"{name:20s} throughput {tput:10.0f} msg/s ({got}/{a.messages} delivered)  "
              f"latency@1k/s p50 {res[name][1]:.3f} ms p99 {res[name][2]:.3f} ms")
    raw, pv = res["raw pyzmq+msgpack"], res["podvisor bus"]
    print(f"ratio podvisor/raw: throughput {pv[0] / raw[0]:.2f}x (target >= 0.5), "
          f"p99 latency {pv[2] / raw[2]:.2f}x (target <= 2)")
    if a.json:
        print(json.dumps({name: {"throughput": r[0], "p50_ms": r[1], "p99_ms": r[2],
                                 "delivered": delivered[name]}
                          for name, r in res.items()}, sort_keys=True))


if __name__ == "__main__":
    main()
