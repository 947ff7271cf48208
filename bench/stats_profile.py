"""Where a `/stats/summary` scrape spends its CPU, in-process (cProfile), for N containers.

The two halves of the scrape path, each run K times under cProfile in this process:
- the embedded runtime's ListContainerStats (`StatsCollector.collect_wire`) over N real `sleep`
  processes, each in its own process group like a container (no cgroup: the /proc path), and
- the server's assembly of the answer (`SummaryMaker.make_json` over that answer: `summary()`,
  the log usage of N pod log directories, `NodeSampler`, and the JSON text), as the main port
  does it (less the two CRI calls).
Prints the CPU per call of each half and the top functions by cumulative time. Asserts nothing.

    .venv/bin/python bench/stats_profile.py [-n 110] [-k 50] [--top 15]
"""

from __future__ import annotations

import argparse
import cProfile
import io
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
from podvisor.common.labels import (  # noqa: E402
    CONTAINER_NAME,
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
)
from podvisor.ipc.maps import PlegContainer, PlegPod, PlegSandbox  # noqa: E402
from podvisor.services.runtime.model import Container, StartInfo  # noqa: E402
from podvisor.services.runtime.procfs import start_ticks  # noqa: E402
from podvisor.services.runtime.stats import StatsCollector  # noqa: E402
from podvisor.services.server.summarymaker import SummaryMaker  # noqa: E402


def _containers(n: int, procs: list[subprocess.Popen[bytes]]) -> list[Container]:
    out = []
    for i, p in enumerate(procs[:n]):
        uid = f"uid-{i:03d}"
        cfg = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="app"),
            labels={POD_NAME: f"m{i:03d}", POD_NAMESPACE: "default", POD_UID: uid,
                    CONTAINER_NAME: "app"})
        started = StartInfo(monitor_pid=0, monitor_ticks=0, pid=p.pid,
                            pid_ticks=start_ticks(p.pid) or 0, started_at=time.time_ns())
        out.append(Container(f"c{i:03d}", f"s{i:03d}", cfg, time.time_ns(), "", "host",
                             started=started))
    return out


def _pleg(containers: list[Container]) -> dict[str, PlegPod]:
    pleg: dict[str, PlegPod] = {}
    for c in containers:
        labels = c.config.labels
        pleg[labels[POD_UID]] = PlegPod(
            name=labels[POD_NAME], namespace="default",
            sandboxes=(PlegSandbox(c.sandbox_id, "SANDBOX_READY", c.created_at),),
            containers=(PlegContainer(c.id, "app", "CONTAINER_RUNNING",
                                      created_at=c.created_at),))
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
            d = tmp / f"default_{labels[POD_NAME]}_{labels[POD_UID]}" / "app"
            d.mkdir(parents=True)
            (d / "0.log").write_bytes(b"x" * 100)
        collector = StatsCollector()
        collector.collect(containers)  # the first rate sample
        _profile(lambda: collector.collect_wire(containers), args.k, args.top,
                 "runtime: ListContainerStats (StatsCollector.collect_wire)")
        stats = list(pb.ListContainerStatsResponse.FromString(
            collector.collect_wire(containers)).stats)
        collector.close()
        maker = SummaryMaker("bench", 0, str(tmp), str(tmp), lambda: stats, None, time.time)
        pleg = _pleg(containers)
        _profile(lambda: maker.make_json(pleg), args.k, args.top,
                 "server: SummaryMaker.make_json (summary + log usage + node + JSON)")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
