"""End to end with the real agent (embedded runtime): readiness from an httpGet probe and an exec
probe, a startup probe, a liveness probe that fails once (the container restarts once), and
kill -9 of the prober while pods are Ready (no NotReady ever observed in /pods).

Synchronisation is functional: conditions on /pods, on the ``probes`` map and on the container's
own request log; no sleeps, generous deadlines, no timing asserts."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import zmq

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.clone import MapReplica
from podvisor.ipc.maps import PROBES
from podvisor.ipc.paths import RunPaths
from tests.support.lifecycle import agent_config, free_port, get_pods

PROBE = "periodSeconds: 1\n      failureThreshold: 1"


def manifest(name: str, command: str, probes: str) -> str:
    return (f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n"
            f"  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: host\n"
            f"    command: [\"sh\", \"-c\", {command!r}]\n{probes}")


def write_manifests(dir_: Path, marks: Path, http_port: int) -> None:
    web = manifest("web", f"exec python3 -m http.server {http_port} --bind 127.0.0.1",
                   f"    ports:\n    - name: http\n      containerPort: {http_port}\n"
                   f"    readinessProbe:\n      httpGet:\n        path: /\n        port: http\n"
                   f"      {PROBE}\n"
                   f"    startupProbe:\n      tcpSocket:\n        port: {http_port}\n"
                   f"      periodSeconds: 1\n      failureThreshold: 30\n")
    unready = manifest("unready", "exec sleep 3600",
                       f"    readinessProbe:\n      exec:\n        command: [\"false\"]\n"
                       f"      {PROBE}\n")
    once = f"test -e {marks}/first || {{ touch {marks}/first; exit 1; }}"
    live = manifest("live", "exec sleep 3600",
                    f"    livenessProbe:\n      exec:\n"
                    f"        command: [\"sh\", \"-c\", {once!r}]\n      {PROBE}\n")
    for name, text in (("web", web), ("unready", unready), ("live", live)):
        (dir_ / f"{name}.yaml").write_text(text, encoding="utf-8")


def by_name(podlist: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"].rsplit("-", 1)[0]: p for p in (podlist or {}).get("items", [])}


def container(pod: dict[str, Any] | None) -> dict[str, Any]:
    statuses = (pod or {}).get("status", {}).get("containerStatuses", [])
    return statuses[0] if statuses else {}


def ready(pod: dict[str, Any] | None) -> bool:
    conds = {c["type"]: c["status"] for c in (pod or {}).get("status", {}).get("conditions", [])}
    return conds.get("Ready") == "True" and container(pod).get("ready") is True


def running(pod: dict[str, Any] | None) -> bool:
    return ((pod or {}).get("status", {}).get("phase") == "Running"
            and "running" in container(pod).get("state", {}))


def probes_snapshot(zctx: Any, paths: RunPaths) -> tuple[str | None, dict[str, Any]] | None:
    replica = MapReplica(zctx, paths, PROBES, clock=SYSTEM_CLOCK)
    try:
        return (replica.epoch, replica.items()) if replica.sync(timeout=1.0) else None
    finally:
        replica.close()


def requests_served(handle: Any) -> int:
    """GET lines the web container's http.server logged (one per readiness probe)."""
    return sum(f.read_text(errors="replace").count('"GET / HTTP')
               for f in handle.paths.pod_logs_dir.glob("*_web-*/c/*.log"))


@pytest.mark.timeout(180)
def test_readiness_liveness_and_prober_restart(agent: Any, wait_for: Any) -> None:
    manifests = Path(tempfile.mkdtemp(prefix="pvprm", dir="/tmp"))
    marks = Path(tempfile.mkdtemp(prefix="pvprk", dir="/tmp"))
    zctx: zmq.Context[Any] = zmq.Context()
    try:
        port = free_port()
        write_manifests(manifests, marks, free_port())
        handle = agent(config=agent_config(manifests, port, syncloop={
            "crashLoopBackOffInitial": "1s", "crashLoopBackOffMax": "2s"}))

        def settled() -> dict[str, dict[str, Any]] | None:
            pods = by_name(get_pods(port))
            ok = (ready(pods.get("web")) and container(pods["web"]).get("started") is True
                  and running(pods.get("unready")) and running(pods.get("live"))
                  and container(pods["live"]).get("restartCount") == 1 and ready(pods["live"]))
            return pods if ok else None

        pods = wait_for(settled, 90.0, message="web Ready, unready Running, live restarted once")
        assert not ready(pods["unready"]) and container(pods["unready"])["started"] is True
        cond = {c["type"]: c for c in pods["unready"]["status"]["conditions"]}
        assert cond["Ready"]["reason"] == "ContainersNotReady"
        assert (marks / "first").exists()

        # kill -9 the prober while web and live are Ready: no NotReady may ever be observed
        # The snapshot must hold all three pods: `live` has no readiness probe, so it is Ready
        # in /pods before the prober has re-added its entry for the restarted container (one
        # CI run under load took a snapshot without it, which no restarted prober can match).
        uids = {p["metadata"]["uid"] for p in pods.values()}

        def full_snapshot() -> tuple[str | None, dict[str, Any]] | None:
            snap = probes_snapshot(zctx, handle.paths)
            return snap if snap is not None and set(snap[1]) >= uids else None
        before = wait_for(full_snapshot, 30.0, message="a probes snapshot with every pod")
        old_pid = handle.state("prober")["pid"]
        seen: list[str] = []

        def observe() -> None:
            now = by_name(get_pods(port))
            for name in ("web", "live"):
                if name in now and not ready(now[name]):
                    cs = now[name]["status"].get("containerStatuses")
                    seen.append(f"{name} not ready: {json.dumps(cs)}")
            if "unready" in now and ready(now["unready"]):
                seen.append("unready became ready")

        handle.call("kill", name="prober", signal="KILL")
        handle.wait_state("prober", "RUNNING", 30.0, lambda r: r["pid"] != old_pid)

        last: list[Any] = []

        def new_owner_serving() -> bool:
            observe()
            snap = probes_snapshot(zctx, handle.paths)
            last[:] = [snap]
            return snap is not None and snap[0] != before[0] and set(snap[1]) == set(before[1])

        try:
            wait_for(new_owner_serving, 60.0, message="restarted prober serves the probes map")
        except AssertionError as err:  # say what it served instead
            raise AssertionError(f"{err}\nbefore: {before}\nlast: {last}\npods: "
                                 f"{json.dumps(get_pods(port))[:4000]}") from None
        served = requests_served(handle)

        def probed_again() -> bool:  # the new prober ran the web readiness probe a few times
            observe()
            return requests_served(handle) >= served + 3

        wait_for(probed_again, 60.0, message="web probed again by the new prober")
        logs = "".join(f.read_text() for f in handle.paths.logs_dir.glob("prober.log*"))
        assert seen == [], "\n".join(seen[:3]) + "\n" + logs[-6000:]
        final = by_name(get_pods(port))
        assert container(final["live"])["restartCount"] == 1
    finally:
        zctx.destroy(linger=0)
        shutil.rmtree(manifests, ignore_errors=True)
        shutil.rmtree(marks, ignore_errors=True)
