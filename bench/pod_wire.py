"""What a bus consumer pays to turn a pod's wire form back into the model: the validating
``pod_from_dict`` (what the sync loop and the prober did before) against the trusted
``pod_from_wire`` (what they do now; the source validated the pod once).

The pods are the corpus of tests/services/pod/test_pod_wire.py (the shipped examples, as parsed
and as a file source publishes them, a pod using every field, an API pod), each as it arrives
off the bus (``Pod.to_dict()`` through msgpack). Prints microseconds per pod (median of rounds) and
the ratio, and what the raw-dict caches the consumers had (removed with the trusted rebuild)
paid per unchanged pod: one deep compare of the new dict with the last one. A source's set
reaches the sync loop only when it changed (the map owner publishes no equal value), and the
prober rebuilds a pod only when its ``desired`` entry changed. Asserts nothing.

    .venv/bin/python bench/pod_wire.py [--rounds 7] [--n 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from podvisor.services.pod import pod_from_dict, pod_from_wire  # noqa: E402
from tests.services.pod.test_pod_wire import CORPUS  # noqa: E402


def per_pod_us(fn: Callable[[Any], object], wires: list[Any], n: int, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            for wire in wires:
                fn(wire)
        samples.append((time.perf_counter() - start) / (n * len(wires)) * 1e6)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    wires = [msgpack.unpackb(msgpack.packb(pod.to_dict())) for _, pod in CORPUS]
    validate = per_pod_us(lambda w: pod_from_dict(w).pod, wires, args.n, args.rounds)
    rebuild = per_pod_us(pod_from_wire, wires, args.n, args.rounds)
    twins = {id(w): msgpack.unpackb(msgpack.packb(w)) for w in wires}
    compare = per_pod_us(lambda w: w == twins[id(w)], wires, args.n, args.rounds)
    print(f"pods in corpus                          {len(wires)}")
    print(f"pod_from_dict (validating) per pod      {validate:8.1f} us")
    print(f"pod_from_wire (trusted) per pod         {rebuild:8.1f} us")
    print(f"ratio                                   {validate / rebuild:8.1f} x")
    print(f"raw-dict compare (old cache hit) per pod {compare:7.1f} us")


if __name__ == "__main__":
    main()
