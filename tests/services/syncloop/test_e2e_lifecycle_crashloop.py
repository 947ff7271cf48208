"""End to end: a container that exits 1 at once (restartPolicy Always) goes into CrashLoopBackOff.

With a small configured back-off (1 s doubling to a 4 s cap), `/pods` shows the waiting reason
`CrashLoopBackOff`, the restart count grows, and the gaps between successive container starts
(the runtime's started_at over CRI) grow until the cap. Timing is asserted only as ordering with
generous slack."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from podvisor.services.syncloop import labels as L
from tests.support.lifecycle import agent_config, cri_for, free_port, get_pods, pod_yaml

CAP = 4.0
STARTS_WANTED = 7  # gaps ~0, 1, 2, 4, 4, 4


def crash_statuses(podlist: dict[str, Any] | None) -> list[dict[str, Any]]:
    if podlist is None:
        return []
    return [c for p in podlist.get("items", []) if p["metadata"]["name"].startswith("crash-")
            for c in p.get("status", {}).get("containerStatuses", [])]


def _answers(cri: Any) -> bool:
    try:
        cri.version()
    except CriError:
        return False
    return True


@pytest.mark.timeout(150)
def test_crashloop_backoff_grows_to_cap(agent: Any, wait_for: Any) -> None:
    manifests = Path(tempfile.mkdtemp(prefix="pvcl", dir="/tmp"))
    try:
        (manifests / "crash.yaml").write_text(pod_yaml("crash", "exit 1"), "utf-8")
        port = free_port()
        handle = agent(config=agent_config(manifests, port, syncloop={
            "crashLoopBackOffInitial": "1s", "crashLoopBackOffMax": f"{CAP:g}s"}))
        cri = cri_for(handle)
        wait_for(lambda: _answers(cri), 30.0)  # the socket file exists before the server serves
        starts: dict[str, int] = {}  # container id -> started_at (ns, runtime wall clock)
        seen_reasons: set[str] = set()
        counts: list[int] = []

        def observe() -> bool:
            for c in cri.list_containers():
                if c.labels.get(L.CONTAINER_NAME) != "c" or c.id in starts:
                    continue
                st = cri.container_status(c.id)
                if st.started_at and st.state != pb.CONTAINER_CREATED:
                    starts[c.id] = st.started_at
            for cs in crash_statuses(get_pods(port)):
                counts.append(int(cs.get("restartCount", 0)))
                waiting = cs.get("state", {}).get("waiting")
                if waiting:
                    seen_reasons.add(str(waiting.get("reason")))
            return len(starts) >= STARTS_WANTED and "CrashLoopBackOff" in seen_reasons

        try:
            wait_for(observe, 90.0, 0.05, "crash loop starts and a CrashLoopBackOff status")
        finally:
            cri.close()
        times = sorted(starts.values())
        gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
        assert "CrashLoopBackOff" in seen_reasons, seen_reasons
        assert counts and max(counts) >= 3 and counts == sorted(counts), counts
        # the delay grows (1 s, 2 s, 4 s ...) and stays under the cap (plus generous slack)
        assert gaps[3] > gaps[1], gaps
        assert gaps[-1] > gaps[1], gaps
        assert all(g <= CAP + 6.0 for g in gaps), gaps
    finally:
        shutil.rmtree(manifests, ignore_errors=True)
