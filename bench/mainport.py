"""The main port's scrape path with many pods: `/metrics` and `/stats/summary` latency, and the
CPU they cost at a 10 s scrape interval (target: < 0.2 % of a core).

A real `podvisor run` agent (bench/pods_agent.py: embedded runtime, static pods running
`sleep`), its main port on 127.0.0.1 with a token file; N pods started, then each endpoint
scraped K times over one keep-alive HTTPS session. CPU is the server process's user+system time
(and, for `/stats/summary`, the embedded runtime's, which answers ListContainerStats) over the
K scrapes, per scrape, as a share of one core at one scrape per 10 s. Prints figures, asserts
nothing.

    .venv/bin/python bench/mainport.py [-n 110] [-k 30]
"""

from __future__ import annotations

import argparse
import functools
import socket
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from pods_agent import Agent, kill_descendants, poll  # noqa: E402

TOKEN = "bench-token"
INTERVAL = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def scrape(session: requests.Session, url: str, k: int, pids: list[int]) -> dict[str, Any]:
    session.get(url, timeout=30).raise_for_status()  # warm: connection, first rate sample
    times: list[float] = []
    cpu0 = cpu_of(pids)
    for _ in range(k):
        t0 = time.perf_counter()
        resp = session.get(url, timeout=30)
        times.append(time.perf_counter() - t0)
        resp.raise_for_status()
    per_scrape = (cpu_of(pids) - cpu0) / k
    return {"p50": pct(times, 0.5), "p99": pct(times, 0.99), "bytes": len(resp.content),
            "cpu_ms": per_scrape * 1000, "core_pct": per_scrape / INTERVAL * 100}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=110, help="pods (default 110, the kubelet's max)")
    ap.add_argument("-k", type=int, default=30, help="scrapes per endpoint")
    args = ap.parse_args(argv)
    port = free_port()
    root_tokens = Path("/tmp") / f"pvbench-tokens-{port}.csv"
    root_tokens.write_text(f"{TOKEN},bench,1\n", encoding="utf-8")
    agent = Agent(free_port(), {"port": port, "authentication": {"tokenFile": str(root_tokens)}})
    try:
        agent.wait_ready()
        for i in range(args.n):
            agent.drop(agent.stage(f"m{i:03d}"))
        poll(lambda: agent.pod_count() >= args.n and len(agent.running_names()) >= args.n,
             600.0, 0.5, f"{args.n} pods running")
        rows = {r["name"]: r for r in agent.control.call("status")["processes"]}
        server, runtime = rows["server"]["pid"], rows["runtime"]["pid"]
        session = requests.Session()
        # per request: an environment CA bundle (REQUESTS_CA_BUNDLE) would win over
        # session.verify
        session.request = functools.partial(  # type: ignore[method-assign]
            session.request, verify=str(agent.paths.root / "pki" / "kubelet.crt"))
        session.headers["Authorization"] = f"Bearer {TOKEN}"
        base = f"https://127.0.0.1:{port}"
        poll(lambda: session.get(base + "/healthz", timeout=5).ok, 30.0, 0.1, "main port")
        print(f"main port scrape path, {args.n} pods, {args.k} scrapes each "
              f"(CPU at one scrape per {INTERVAL:g} s; target < 0.2 % of a core)")
        print(f"{'endpoint':<16}{'p50 ms':>9}{'p99 ms':>9}{'body KiB':>10}"
              f"{'CPU ms/scrape':>15}{'% of a core':>13}")
        for path, pids in (("/metrics", [server]), ("/stats/summary", [server, runtime])):
            r = scrape(session, base + path, args.k, pids)
            print(f"{path:<16}{r['p50'] * 1000:>9.1f}{r['p99'] * 1000:>9.1f}"
                  f"{r['bytes'] / 1024:>10.1f}{r['cpu_ms']:>15.2f}{r['core_pct']:>12.3f}%")
        print("  (/stats/summary CPU includes the embedded runtime's ListContainerStats)")
    finally:
        leftovers = agent.stop()
        root_tokens.unlink(missing_ok=True)
        if leftovers:
            print(f"  killed leftovers: {leftovers}")
        extra = kill_descendants()
        if extra:
            print(f"  killed descendants: {extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
