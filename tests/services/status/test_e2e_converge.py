"""Converging after the API server comes back (issue 26, part 3), end to end: a real agent
(embedded runtime) and the stand-in API server, stopped and restarted (watches cut, requests
refused, back with its watch history gone: every client lists again) in the middle of a
rollout, several times at seeded random moments, while other clients act through another API
server of the cluster: the node lifecycle controller marks every pod of the node NotReady, a
readiness gate's controller sets its condition, somebody deletes the mirror pod, the rollout's
controller goes on. Afterwards the rollout completes (scale up, a replacement of every pod,
scale down: deletions resume), the mirror pod is back, every pod's status in the API matches
the node's within 15 s of the node settling, with the other owners' conditions kept; a status
another client changes later is corrected within 15 s (one ``statusSweepFrequency``, 10 s by
default). The seed is ``PODVISOR_TEST_SEED`` (default 26), printed on failure.

(slow) A 25 s outage with the default back-off (``apiRetryMaxDelay`` 30 s): everything that
changed meanwhile, on the node and in the API, is right within 15 s of the server's return."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kubeapi import ApiError, KubeApi
from tests.support.kubeapi.others import mark_pods_not_ready, set_condition
from tests.support.lifecycle import free_port, get_pods

NODE = "e2e-conv"
SEED = int(os.environ.get("PODVISOR_TEST_SEED", "26"))
KUBELET = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
           "PodScheduled")
GATE = "example.com/gate"
MIRROR = f"st-{NODE}"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    yield server
    server.stop()


def api_pod(name: str, command: str = "trap 'exit 0' TERM; sleep 3600 & wait",
            policy: str = "Always") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"app": "web"}}, "spec": {
        "nodeName": NODE, "automountServiceAccountToken": False, "restartPolicy": policy,
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "c", "image": "host", "command": ["sh", "-c", command]}]}}


STATIC = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: st\nspec:\n"
          "  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: host\n"
          "    command: [sh, -c, 'sleep 3600']\n")


def config(kubeconfig: Path, **extra: Any) -> dict[str, Any]:
    return {"nodeName": NODE, "kubeconfig": str(kubeconfig), "readOnlyPort": free_port(),
            "apiWatchTimeout": "5s", "nodeLeaseRenewInterval": "1s", "stopPodsOnExit": True,
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}, **extra}


def api_pods(api: KubeApi) -> dict[str, dict[str, Any]]:
    items, _ = api.store.list("pods", "default")
    return {p["metadata"]["name"]: p for p in items if p["spec"].get("nodeName") == NODE}


def node_pods(port: int) -> dict[str, dict[str, Any]] | None:
    pods = get_pods(port)
    if pods is None:
        return None
    return {p["metadata"]["name"]: p for p in pods["items"]}


def summary(status: dict[str, Any]) -> tuple[Any, ...]:
    """What must agree between the API's copy and the node's: phase, the kubelet's conditions,
    each container's ID, state, restarts and readiness, the IPs."""
    conds = {c["type"]: c["status"] for c in status.get("conditions") or []
             if c["type"] in KUBELET}
    containers = sorted((c["name"], c.get("containerID", ""), next(iter(c["state"]), ""),
                         c["restartCount"], c["ready"])
                        for c in status.get("containerStatuses") or [])
    return (status.get("phase"), conds, containers, status.get("podIP") or "",
            status.get("hostIP"))


def mismatches(api: KubeApi, port: int) -> list[str] | None:
    """The node's pods whose status in the API differs (None: the node does not answer)."""
    node = node_pods(port)
    if node is None:
        return None
    in_api = api_pods(api)
    return [name for name, pod in sorted(node.items())
            if name not in in_api or summary(in_api[name]["status"]) != summary(pod["status"])]


def running(pod: dict[str, Any]) -> bool:
    cs = pod["status"].get("containerStatuses") or []
    return pod["status"].get("phase") == "Running" and bool(cs) and \
        all("running" in c["state"] for c in cs)


class Rollout:
    """The test's ReplicaSet controller: ``web-r<revision>-<i>`` pods, ``replicas`` of the
    current revision; the others deleted gracefully (the node kills them, then DELETEs)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.wanted: set[str] = set()

    def apply(self, revision: int, replicas: int) -> None:
        self.wanted = {f"web-r{revision}-{i}" for i in range(replicas)}
        have = api_pods(self.api)
        for name in sorted(self.wanted - have.keys()):
            self.api.create_pod("default", api_pod(name))
        for name, pod in sorted(have.items()):
            if name.startswith("web-") and name not in self.wanted and \
                    not pod["metadata"].get("deletionTimestamp"):
                self.api.store.delete("pods", "default", name, grace=2)

    def done(self, port: int) -> bool:
        """The node runs the wanted pods and the static pod only, all running; the API holds
        those and the mirror pod only (the others were deleted by the node)."""
        node = node_pods(port)
        want = self.wanted | {MIRROR}
        return node is not None and set(node) == want and all(map(running, node.values())) \
            and set(api_pods(self.api)) == want


def test_rollout_through_api_server_restarts(api: KubeApi, agent: Any,
                                             wait_for: Callable[..., Any],
                                             tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"PODVISOR_TEST_SEED={SEED}")
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "st.yaml").write_text(STATIC)
    cfg = config(kubeconfig, staticPodPath=str(manifests), fileCheckFrequency="1s",
                 apiRetryMaxDelay="2s")
    port = cfg["readOnlyPort"]
    rollout = Rollout(api)
    rollout.apply(1, 2)
    handle = agent(config=cfg)
    wait_for(lambda: rollout.done(port), timeout=90, message="the first pods running")
    mirror_uid = api_pods(api)[MIRROR]["metadata"]["uid"]
    # scale up, replace every pod, scale down; one step taken while the server is away
    steps = [(1, 4), (2, 4), (2, 2)]
    away_step = rng.randrange(len(steps))
    mirror_gone = rng.randrange(len(steps))
    gates: dict[str, str] = {}
    for i, step in enumerate(steps):
        if i != away_step:
            rollout.apply(*step)
        later = len(api.requests) + rng.randrange(40)  # a random moment of the node's work
        wait_for(lambda later=later: len(api.requests) >= later, timeout=60)
        api.stop()
        stopped, outage = time.monotonic(), rng.uniform(1.0, 4.0)
        if i == away_step:
            rollout.apply(*step)
        mark_pods_not_ready(api.store, NODE, api.wall)
        live = sorted(n for n, p in api_pods(api).items()
                      if n.startswith("web-") and not p["metadata"].get("deletionTimestamp"))
        name = rng.choice(live)
        gates[name] = rng.choice(("True", "False"))
        set_condition(api.store, "default", name, {"type": GATE, "status": gates[name]},
                      api.wall)
        if i == mirror_gone:
            api.store.delete("pods", "default", MIRROR, grace=0)
        wait_for(lambda stopped=stopped, outage=outage: time.monotonic() - stopped >= outage,
                 timeout=30, interval=0.1, message="the outage")
        api.start()
    back = time.monotonic()
    try:
        wait_for(lambda: rollout.done(port), timeout=120, message="the rollout complete")
        settled = time.monotonic()
        wait_for(lambda: mismatches(api, port) == [], timeout=15,
                 message="every status in the API matching the node's")
    except AssertionError:
        print("node:", {n: summary(p["status"]) for n, p in (node_pods(port) or {}).items()})
        print("api:", {n: summary(p["status"]) for n, p in api_pods(api).items()})
        print("deleting:", [n for n, p in api_pods(api).items()
                            if p["metadata"].get("deletionTimestamp")])
        for proc in ("status-api", "source-api", "syncloop"):
            print(proc, (handle.paths.logs_dir / f"{proc}.log").read_text()[-4000:])
        raise
    print(f"matched {time.monotonic() - settled:.1f} s after the node settled, "
          f"{time.monotonic() - back:.1f} s after the server came back")
    final = api_pods(api)
    assert final[MIRROR]["metadata"]["uid"] != mirror_uid  # deleted meanwhile: created again
    for name, status in gates.items():  # another owner's condition: kept
        if name in final:
            assert {c["type"]: c["status"] for c in final[name]["status"]["conditions"]
                    }[GATE] == status
    # a status another client changes with the server up is corrected within one sweep
    assert sorted(mark_pods_not_ready(api.store, NODE, api.wall)) == sorted(final)
    wait_for(lambda: mismatches(api, port) == [], timeout=15,
             message="Ready written again after the node lifecycle controller's write")


@pytest.mark.slow
def test_a_long_outage_with_the_default_back_off(api: KubeApi, agent: Any,
                                                 wait_for: Callable[..., Any],
                                                 tmp_path: Path) -> None:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    go = tmp_path / "go"
    api.create_pod("default", api_pod("steady"))
    api.create_pod("default", api_pod("finisher", f"while [ ! -e {go} ]; do sleep 0.2; done",
                                      policy="Never"))
    cfg = config(kubeconfig)  # apiRetryMaxDelay 30 s, statusSweepFrequency 10 s
    port = cfg["readOnlyPort"]
    agent(config=cfg)
    wait_for(lambda: all(map(running, api_pods(api).values())) and len(api_pods(api)) == 2,
             timeout=60, message="both pods running in the API")
    api.stop()
    stopped = time.monotonic()
    go.touch()  # the finisher exits 0 while the server is away
    mark_pods_not_ready(api.store, NODE, api.wall)
    wait_for(lambda: time.monotonic() - stopped >= 25, timeout=60, interval=0.5,
             message="25 s of outage")
    api.start()
    back = time.monotonic()

    def right() -> bool:
        pods = api_pods(api)
        try:
            return pods["finisher"]["status"]["phase"] == "Succeeded" and \
                mismatches(api, port) == []
        except (KeyError, ApiError):
            return False

    wait_for(right, timeout=15, message="the API right within 15 s of the server's return")
    print(f"right {time.monotonic() - back:.1f} s after the server came back")
