"""`podvisorctl top [--json]`: per-pod CPU and memory, as `kubectl top pod`.

Reads the runtime's CRI `ListContainerStats` straight (the embedded runtime's socket under
`run/`, or the configured `runtimeEndpoint`), twice `SAMPLE` seconds apart: CPU is the rate of
`usageCoreNanoSeconds` between the two (so it does not depend on when someone else last asked
the runtime), memory the working set of the second. Running containers only, summed per pod.
Table: NAMESPACE, NAME, CPU(cores) in millicores, MEMORY(bytes) in Mi. `--json`:
`[{"namespace", "name", "uid", "cpuNanoCores", "memoryWorkingSetBytes",
"containers": [{"name", "cpuNanoCores", "memoryWorkingSetBytes"}]}]`, sorted by namespace and
name. Exit 2 when the runtime does not answer.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from podvisor.common.config import runtime_endpoint_of
from podvisor.common.endpoint import cri_endpoint
from podvisor.common.labels import POD_NAME, POD_NAMESPACE, POD_UID
from podvisor.ipc.paths import RunPaths

__all__ = ["main_top", "pod_usage"]

SAMPLE = 0.5


def pod_usage(first: list[Any], second: list[Any]) -> list[dict[str, Any]]:
    """Per-pod usage from two ListContainerStats answers (CRI ContainerStats messages)."""
    before = {s.attributes.id: s for s in first if s.HasField("cpu")}
    pods: dict[str, dict[str, Any]] = {}
    for st in second:
        labels = st.attributes.labels
        uid = labels.get(POD_UID, "")
        if not uid or not st.HasField("cpu"):
            continue
        rate = 0
        prev = before.get(st.attributes.id)
        if prev is not None and st.cpu.timestamp > prev.cpu.timestamp:
            used = st.cpu.usage_core_nano_seconds.value - prev.cpu.usage_core_nano_seconds.value
            rate = max(used, 0) * 1_000_000_000 // (st.cpu.timestamp - prev.cpu.timestamp)
        mem = st.memory.working_set_bytes.value if st.HasField("memory") else 0
        pod = pods.setdefault(uid, {"namespace": labels.get(POD_NAMESPACE, ""),
                                    "name": labels.get(POD_NAME, ""), "uid": uid,
                                    "cpuNanoCores": 0, "memoryWorkingSetBytes": 0,
                                    "containers": []})
        pod["cpuNanoCores"] += rate
        pod["memoryWorkingSetBytes"] += mem
        pod["containers"].append({"name": st.attributes.metadata.name, "cpuNanoCores": rate,
                                  "memoryWorkingSetBytes": mem})
    out = sorted(pods.values(), key=lambda p: (p["namespace"], p["name"]))
    for pod in out:
        pod["containers"].sort(key=lambda c: c["name"])
    return out


def _table(pods: list[dict[str, Any]]) -> str:
    rows = [["NAMESPACE", "NAME", "CPU(cores)", "MEMORY(bytes)"]]
    rows += [[p["namespace"], p["name"], f"{p['cpuNanoCores'] // 1_000_000}m",
              f"{p['memoryWorkingSetBytes'] // (1 << 20)}Mi"] for p in pods]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def main_top(root_dir: str, as_json: bool, timeout: float) -> int:
    from podvisor.services.cri import CriError, new_runtime_client

    paths = RunPaths(Path(root_dir))
    endpoint = runtime_endpoint_of(paths.config_json)
    cri = new_runtime_client(cri_endpoint(endpoint, paths.cri_socket), timeout=timeout)
    try:
        first = cri.list_container_stats()
        time.sleep(SAMPLE)  # the CLI's own sampling interval (an edge, not logic)
        second = cri.list_container_stats()
    except CriError as exc:
        print(f"podvisorctl: the runtime at {endpoint} did not answer ListContainerStats: "
              f"{exc}", file=sys.stderr)
        return 2
    finally:
        cri.close()
    pods = pod_usage(list(first), list(second))
    print(json.dumps(pods, indent=2, sort_keys=True) if as_json else _table(pods))
    return 0
