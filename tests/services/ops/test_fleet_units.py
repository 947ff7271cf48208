"""The fleet's pure parts and its XML-RPC with fake nodes: config errors name the key, node
summaries, node specs from Node objects, supervisord's names and faults over the fleet."""

from __future__ import annotations

import xmlrpc.client
from pathlib import Path
from typing import Any

import pytest

from podvisor.ipc.clock import FakeClock
from podvisor.services.fleet.config import (
    FleetConfig,
    FleetConfigError,
    NodeSpec,
    load_fleet_config,
)
from podvisor.services.fleet.link import NodeView
from podvisor.services.fleet.model import fleet_state, node_summary, process_infos
from podvisor.services.fleet.nodes import node_specs
from podvisor.services.fleet.rpc import FleetRpc, new_fleet_dispatcher

STATE = {"processes": [
    {"name": "pleg", "group": "agent", "namespec": "agent:pleg", "kind": "agent",
     "statename": "RUNNING", "state": 20, "pid": 7, "restarts": 2, "start": 1, "stop": 0,
     "now": 5, "spawnerr": "", "exitstatus": 0, "logfile": "l", "stdout_logfile": "l",
     "stderr_logfile": "", "description": "pid 7, uptime 0:00:04"},
    {"name": "app", "group": "ns.web", "namespec": "ns.web:app", "kind": "container",
     "statename": "RUNNING", "state": 20, "pid": 9, "restarts": 1}],
    "pods": [{"group": "ns.web", "phase": "Running"}, {"group": "ns.b", "phase": "Pending"}]}


def _write(tmp: Path, text: str) -> Path:
    (tmp / "n.cred").write_text("bob:secret\n")
    path = tmp / "fleet.yaml"
    path.write_text(text)
    return path


def test_config(tmp_path: Path) -> None:
    cfg = load_fleet_config(_write(tmp_path, "nodes:\n- {name: a, url: 'http://h:1/', "
                                             "credentialsFile: n.cred}\n"))
    assert cfg.nodes == (NodeSpec("a", "http://h:1", "bob", "secret"),)
    assert cfg.port == 9100 and (tmp_path / "fleet-password").stat().st_mode & 0o777 == 0o600
    for text, key in [("bogus: 1\nnodes: []\n", "bogus"),
                      ("nodes: []\n", "nodes"),
                      ("nodes:\n- {name: a, url: 'ftp://h'}\n", "nodes[0].url"),
                      ("nodes:\n- {name: a, url: 'http://h:1'}\n", "nodes[0].credentialsFile"),
                      ("nodes:\n- {name: a, url: 'http://h:1', credentialsFile: nope}\n",
                       "nodes[0].credentialsFile"),
                      ("port: 0\nnodes:\n- {name: a, url: 'http://h:1', credentialsFile: n.cred}"
                       "\n", "port"),
                      ("kubeconfig: k\n", "credentialsFile")]:
        with pytest.raises(FleetConfigError, match="^" + key.replace("[", ".").replace("]", ".")):
            load_fleet_config(_write(tmp_path, text))


def test_summary_and_infos() -> None:
    up = NodeView("a", "http://h:1", up=True, error="", since=10.0, state=STATE,
                  usage={"agent:pleg": [5, 100]})
    s = node_summary(up)
    assert s["phases"] == {"Pending": 1, "Running": 1} and s["restarts"] == 2
    assert s["subsystems"][0]["pid"] == 7 and s["pods"][0]["containers"][0]["restarts"] == 1
    infos = process_infos(up, "a/")
    assert infos[0]["group"] == "a/agent" and "kind" not in infos[0]
    down = NodeView("b", "http://h:2", error="refused")
    assert process_infos(down) == [] and node_summary(down)["up"] is False
    assert fleet_state([up, down], 5.0)["up"] == 1


def test_node_specs() -> None:
    fc = FleetConfig("127.0.0.1", 9100, "admin", "pw", (), credentials=("u", "p"),
                     kubeconfig="k", node_ops_port=9001)
    items: list[dict[str, Any]] = [
        {"metadata": {"name": "a"}, "status": {"addresses": [
            {"type": "Hostname", "address": "a"},
            {"type": "InternalIP", "address": "10.0.0.1"}]}},
        {"metadata": {"name": "b", "annotations": {"ops.podvisor.io/url": "https://b:9443/"}}},
        {"metadata": {"name": "c"}, "status": {"addresses": []}},
    ]
    assert node_specs(items, fc) == [NodeSpec("a", "http://10.0.0.1:9001", "u", "p"),
                                     NodeSpec("b", "https://b:9443", "u", "p")]


class FakeNode:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.supervisor = self

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> Any:
            self.calls.append((name, args))
            if name == "getProcessInfo":
                return {"name": "pleg", "group": "agent", "pid": 7}
            return True
        return call


def test_rpc_over_fleet() -> None:
    node = FakeNode()
    views = {"a": (NodeView("a", "u", up=True, error="", state=STATE),
                   NodeSpec("a", "u", "x", "y")),
             "b": (NodeView("b", "v", error="refused"), NodeSpec("b", "v", "x", "y"))}
    rpc = FleetRpc(lambda: views, FakeClock(), proxy=lambda spec: node)
    disp = new_fleet_dispatcher(rpc)

    def call(method: str, *args: Any) -> Any:
        body = xmlrpc.client.dumps(args, method)
        return xmlrpc.client.loads(disp._marshaled_dispatch(body.encode()))[0][0]

    assert [p["group"] for p in call("supervisor.getAllProcessInfo")] == ["a/agent", "a/ns.web"]
    assert call("supervisor.getProcessInfo", "a/agent:pleg")["group"] == "a/agent"
    assert call("supervisor.signalProcess", "a/agent:pleg", "KILL") is True
    assert ("signalProcess", ("agent:pleg", "KILL")) in node.calls
    nodes = call("fleet.getAllNodeInfo")
    assert [(n["name"], n["statename"]) for n in nodes] == [("a", "UP"), ("b", "DOWN")]
    assert {r["node"] for r in call("fleet.getAllProcessInfo")} == {"a"}
    for spec, code in [("x/agent:pleg", 10), ("agent:pleg", 10), ("b/agent:pleg", 30)]:
        with pytest.raises(xmlrpc.client.Fault) as err:
            call("supervisor.stopProcess", spec, True)
        assert err.value.faultCode == code
    assert "fleet.getAllNodeInfo" in call("system.listMethods")


def test_cluster_nodes_from_the_api(tmp_path: Path) -> None:
    """The Nodes of a (stand-in) API server become the fleet's nodes: a real client, a real
    HTTPS server on 127.0.0.1."""
    from podvisor.services.fleet.nodes import cluster_nodes
    from tests.support.kubeapi.server import KubeApi

    api = KubeApi(tmp_path / "kubeapi")
    api.start()
    try:
        api.store.create("nodes", "", {"metadata": {"name": "a"}, "status": {"addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"}]}})
        api.store.create("nodes", "", {"metadata": {"name": "b", "annotations": {
            "ops.podvisor.io/url": "http://127.0.0.1:9555"}}})
        kubeconfig = api.kubeconfig(tmp_path / "kc", user="fleet", groups=("system:masters",))
        fc = FleetConfig("127.0.0.1", 9100, "admin", "pw", (), credentials=("u", "p"),
                         kubeconfig=str(kubeconfig), node_ops_port=9444)
        assert cluster_nodes(fc) == [NodeSpec("a", "http://127.0.0.1:9444", "u", "p"),
                                     NodeSpec("b", "http://127.0.0.1:9555", "u", "p")]
    finally:
        api.stop()
