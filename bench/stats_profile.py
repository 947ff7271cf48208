"""Where a `/stats/summary` scrape spends its CPU, in-process (cProfile), for N containers.

The two halves of the scrape path, each run K times under cProfile in this process:
- the embedded runtime's ListContainerStats (`StatsCollector.collect`) over N real `sleep`
  processes, each in its own process group like a container (no cgroup: the /proc path), and
- the server's assembly of the answer (`summary()` over that answer, `log_usage` over N pod log
  directories, `NodeSampler`, and the JSON encoding), as the main port does it.
Prints the CPU per call of each half and the top functions by cumulative time. Asserts nothing.

    .venv/bin/python bench/stats_profile.py [-n 110] [-k 50] [--top 15]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cri_api.v1 import api_pb2 as pb

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from podvisor.services.runtime.model import Container, StartInfo  # noqa: E402
from podvisor.services.runtime.procfs import start_ticks  # noqa: E402
from podvisor.services.runtime.stats import StatsCollector  # noqa: E402
from podvisor.services.server.summary import (  # noqa: E402
    NodeSampler,
    log_usage,
    summary,
)


def _containers(n: int, procs: list[subprocess.Popen[bytes]]) -> list[Container]:
    out = []
    for i, p in enumerate(procs[:n]):
        uid = f"uid-{i:03d}"
        cfg = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="app"),
            labels={"io.kubernetes.pod.name": f"m{i:03d}", "io.kubernetes.pod.namespace":
                    "default", "io.kubernetes.pod.uid": uid,
                    "io.kubernetes.container.name": "app"})
        started = StartInfo(monitor_pid=0, monitor_ticks=0, pid=p.pid,
                            pid_ticks=start_ticks(p.pid) or 0, started_at=time.time_ns())
        out.append(Container(f"c{i:03d}", f"s{i:03d}", cfg, time.time_ns(), "", "host",
                             started=started))
    return out


def _pleg(containers: list[Container]) -> dict[str, object]:
    pleg: dict[str, object] = {}
    for c in containers:
        uid = c.config.labels["io.kubernetes.pod.uid"]
        pleg[uid] = {"sandboxes": [{"id": c.sandbox_id, "state": "SANDBOX_READY",
                                    "created_at": c.created_at}],
                     "containers": [{"id": c.id, "created_at": c.created_at}]}
    return pleg


def _profile(fn: object, k: int, top: int, title: str) -> None:
    prof = cProfile.Profile()
    cpu0 = time.process_time()
    prof.enable()
    for _ in range(k):
        fn()  # type: ignore[operator]
    prof.disable()
    per = (time.process_time() - cpu0) / k
    print(f"{title}: {per * 1000:.2f} ms CPU per call (under cProfile; "
          f"{per / 10 * 100:.3f} % of a core at one call per 10 s)")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    print("\n".join(ln for ln in out.getvalue().splitlines()[6:] if ln.strip()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=110)
    ap.add_argument("-k", type=int, default=50)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    procs = [subprocess.Popen(["sleep", "600"], start_new_session=True) for _ in range(args.n)]
    tmp = Path(tempfile.mkdtemp(prefix="pvstatsprof"))
    try:
        containers = _containers(args.n, procs)
        for c in containers:  # a pod log directory each, one log file
            labels = c.config.labels
            d = tmp / (f"default_{labels['io.kubernetes.pod.name']}_"
                       f"{labels['io.kubernetes.pod.uid']}") / "app"
            d.mkdir(parents=True)
            (d / "0.log").write_bytes(b"x" * 100)
        collector = StatsCollector()
        collector.collect(containers)  # the first rate sample
        _profile(lambda: pb.ListContainerStatsResponse(
            stats=collector.collect(containers)).SerializeToString(), args.k, args.top,
                 "runtime: ListContainerStats (StatsCollector.collect, the answer serialized)")
        stats = collector.collect(containers)
        pleg, sampler = _pleg(containers), NodeSampler()

        def assemble() -> bytes:
            now_ns = time.time_ns()
            node = sampler.sample(now_ns, str(tmp))
            body = summary("bench", 0, node, stats, pleg, log_usage(str(tmp)), None, now_ns)
            return json.dumps(body).encode()
        _profile(assemble, args.k, args.top, "server: summary + log_usage + node + JSON")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
