"""The imagegc process in a real agent (embedded runtime) against a real registry, its usage
driven through PODVISOR_IMAGEGC_USAGE_FILE: over the high threshold it removes the unused image
and never the one a running pod uses; killed with -9, it is restarted and its next pass (with
nothing left it may remove) reports FreeDiskSpaceFailed. A chatty container's log passes
containerLogMaxSize: it is rotated, older files gzipped, and `podvisorctl logs` shows every line
across the rotation."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.registry import registries

POD = """apiVersion: v1
kind: Pod
metadata: {{name: user}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: app, image: "{image}", args: ["sleep", "3600"]}}
"""


CHATTY = """apiVersion: v1
kind: Pod
metadata: {name: chatty}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: host
    command:
    - sh
    - -c
    - i=0; while true; do echo line$i-padding-padding; i=$((i+1)); sleep 0.05; done
"""


def _tags(handle: Any) -> list[str]:
    out = handle.ctl("images", "--json")
    assert out.returncode == 0, out.stderr
    return [t for i in json.loads(out.stdout) for t in i["repoTags"]]


def _grpc_threads(pid: int) -> list[str]:
    """Names of grpcio's threads in ``pid`` (event engine workers, its timer, its lifeguard)."""
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip())
    return [n for n in names if n.startswith(("event_engine", "grpc_global", "lifeguard"))]


def _events(handle: Any, reason: str) -> list[dict[str, Any]]:
    out = handle.ctl("events", "--json")
    return [e for e in json.loads(out.stdout)["items"] if e["reason"] == reason]


@pytest.mark.timeout(170)
def test_image_gc_lru_in_use_kill9(agent: Any, wait_for: Any,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    base = Path(tempfile.mkdtemp(prefix="pvgc", dir="/tmp"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        anon, _ = stack.enter_context(registries(base / "reg"))
        used, other = (f"{anon.host}/podvisor/busybox:1", f"{anon.host}/podvisor/busybox:other")
        manifests = base / "manifests"
        manifests.mkdir()
        (manifests / "user.yaml").write_text(POD.format(image=used))
        (manifests / "chatty.yaml").write_text(CHATTY)
        usage = base / "usage.json"
        usage.write_text(json.dumps({"capacity": 1000, "used": 100}))  # 10 %: nothing to do
        monkeypatch.setenv("PODVISOR_IMAGEGC_USAGE_FILE", str(usage))
        handle = agent(config={
            "nodeName": "e2e", "staticPodPath": str(manifests), "stopPodsOnExit": True,
            "imageMinimumGCAge": "0s", "containerLogMaxSize": "2Ki",
            "containerLogMaxFiles": 3,
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})
        wait_for(lambda: used in _tags(handle), 60.0, message="the pod's image pulled")
        # between its passes the process holds no channel, so none of grpcio's threads
        gc_pid = handle.state("imagegc")["pid"]
        wait_for(lambda: not _grpc_threads(gc_pid), 30.0, message="imagegc without gRPC threads")
        assert handle.ctl("images", "pull", other).returncode == 0
        # 95 %: over 85 %, free down to 80 %; the next pass comes with the restart
        usage.write_text(json.dumps({"capacity": 1000, "used": 950}))
        pid = handle.state("imagegc")["pid"]
        assert handle.ctl("kill", "imagegc").returncode == 0
        handle.wait_state("imagegc", "RUNNING", 30.0, where=lambda r: r["pid"] != pid)
        wait_for(lambda: other not in _tags(handle), 30.0, message="the unused image removed")
        assert used in _tags(handle)  # in use by the running pod: never removed
        # nothing else may go: the pass is short of space, said as an event on the Node
        assert handle.ctl("kill", "imagegc").returncode == 0
        found = wait_for(lambda: _events(handle, "FreeDiskSpaceFailed"), 30.0)
        assert "Failed to garbage collect required amount of images" in found[0]["message"]
        assert found[0]["involvedObject"]["kind"] == "Node"
        assert used in _tags(handle)
        metrics = handle.paths.state_dir / "imagegc.prom"
        assert "podvisor_image_gc_failures_total" in metrics.read_text()
        assert os.path.exists(metrics)

        # the chatty container's log: rotated every 10 s pass, older files gzipped
        logs_dir = handle.paths.root / "pod-logs"
        wait_for(lambda: list(logs_dir.glob("default_chatty-e2e_*/app/0.log.*.gz")), 60.0,
                 message="a gzipped rotated log")
        out = handle.ctl("logs", "chatty")
        assert out.returncode == 0, out.stderr
        numbers = [int(line.split("-")[0].removeprefix("line"))
                   for line in out.stdout.splitlines() if line.startswith("line")]
        live = next(logs_dir.glob("default_chatty-e2e_*/app/0.log")).read_text().count("\n")
        assert len(numbers) > live + 10  # more than the live file holds
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # no gap
