"""The main port's scrape path with many pods: `/metrics` and `/stats/summary` latency, and the
CPU they cost at a 10 s scrape interval (target: < 0.2 % of a core).

A real `podvisor run` agent (bench/pods_agent.py: embedded runtime, static pods running
`sleep`), its main port on 127.0.0.1 with a token file; N pods started, then each endpoint
scraped K times over one keep-alive HTTPS session. CPU is the server process's user+system time
(and, for `/stats/summary`, the embedded runtime's, which answers ListContainerStats) over the
K scrapes, less what the same processes spend over as long without scrapes (their background:
PLEG's relists, heartbeats), per scrape, as a share of one core at one scrape per 10 s; `-r R`
repeats the K scrapes R times and prints the median round (the machine is shared: the load
average is printed beside the figures), then the runtime's CPU per CRI call of the two calls a
scrape makes. Prints figures, asserts nothing.

    .venv/bin/python bench/mainport.py [-n 110] [-k 30] [-r 5]
"""

from __future__ import annotations

import argparse
import functools
import os
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


def scrape(session: requests.Session, url: str, k: int, pids: list[int], rounds: int = 1
           ) -> dict[str, Any]:
    """The median (by CPU) of ``rounds`` rounds of ``k`` scrapes."""
    session.get(url, timeout=30).raise_for_status()  # warm: connection, first rate sample
    results = sorted((_round(session, url, k, pids) for _ in range(rounds)),
                     key=lambda r: r["cpu_ms"])
    out = results[len(results) // 2]
    out["cpu_all"] = [round(r["core_pct"], 3) for r in results]
    return out


def _round(session: requests.Session, url: str, k: int, pids: list[int]) -> dict[str, Any]:
    times: list[float] = []
    cpu0 = [cpu_of([pid]) for pid in pids]
    start = time.perf_counter()
    for _ in range(k):
        t0 = time.perf_counter()
        resp = session.get(url, timeout=30)
        times.append(time.perf_counter() - t0)
        resp.raise_for_status()
    wall = time.perf_counter() - start
    busy = [cpu_of([pid]) - c0 for pid, c0 in zip(pids, cpu0, strict=True)]
    # what the same processes spend over as long with no scrape (PLEG's relists, heartbeats,
    # replica traffic): not the scrape path's
    idle0 = [cpu_of([pid]) for pid in pids]
    time.sleep(wall)
    idle = [cpu_of([pid]) - c0 for pid, c0 in zip(pids, idle0, strict=True)]
    each = [max(0.0, b - i) / k for b, i in zip(busy, idle, strict=True)]
    per_scrape = sum(each)
    return {"p50": pct(times, 0.5), "p99": pct(times, 0.99), "bytes": len(resp.content),
            "cpu_ms": per_scrape * 1000, "core_pct": per_scrape / INTERVAL * 100,
            "each_ms": [round(e * 1000, 1) for e in each]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=110, help="pods (default 110, the kubelet's max)")
    ap.add_argument("-k", type=int, default=30, help="scrapes per endpoint and round")
    ap.add_argument("-r", type=int, default=5, help="rounds (the median round is printed)")
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
        print(f"main port scrape path, {args.n} pods, {args.r} rounds of {args.k} scrapes each "
              f"(CPU at one scrape per {INTERVAL:g} s; target < 0.2 % of a core)")
        print("  load average before: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        print(f"{'endpoint':<16}{'p50 ms':>9}{'p99 ms':>9}{'body KiB':>10}"
              f"{'CPU ms/scrape':>15}{'% of a core':>13}")
        for path, pids in (("/metrics", [server]), ("/stats/summary", [server, runtime])):
            r = scrape(session, base + path, args.k, pids, args.r)
            print(f"{path:<16}{r['p50'] * 1000:>9.1f}{r['p99'] * 1000:>9.1f}"
                  f"{r['bytes'] / 1024:>10.1f}{r['cpu_ms']:>15.2f}{r['core_pct']:>12.3f}%"
                  f"   rounds: {r['cpu_all']}; ms per process: {r['each_ms']}")
        print("  (/stats/summary CPU includes the embedded runtime's ListContainerStats; ms per "
              "process: the server's, then the runtime's)")
        for name, call in (("ListContainerStats", agent.cri.list_container_stats),
                           ("ImageFsInfo", agent.cri.image_fs_info)):
            cpu0, t0 = cpu_of([runtime]), time.perf_counter()
            for _ in range(args.k):
                call()
            per = (cpu_of([runtime]) - cpu0) / args.k
            print(f"  CRI {name}: {(time.perf_counter() - t0) / args.k * 1000:.1f} ms per call, "
                  f"runtime CPU {per * 1000:.1f} ms per call")
        print("  load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
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
