"""The fleet page's state and the fleet's XML-RPC answers, from the nodes' views (pure).

A node's summary: reachable or not (and why, since when), its subsystems (state, pid,
restarts), its pods by phase and each pod's containers (state, restarts: what the actions
need), its pressure conditions and its subsystems' and pods' last CPU and memory sample.
``process_infos`` gives a node's processes as supervisord's ``getProcessInfo`` structs, as the
node's own feed carries them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from podvisor.services.fleet.link import NodeView

__all__ = ["INFO_KEYS", "fleet_state", "node_summary", "process_infos"]

INFO_KEYS = ("name", "group", "start", "stop", "now", "state", "statename", "spawnerr",
             "exitstatus", "logfile", "stdout_logfile", "stderr_logfile", "pid", "description")


def node_summary(view: NodeView) -> dict[str, Any]:
    state = view.state or {}
    procs = state.get("processes") or []
    subsystems = [{"name": p.get("name"), "namespec": p.get("namespec"),
                   "state": p.get("statename"), "pid": p.get("pid"),
                   "restarts": p.get("restarts", 0), "heartbeat": p.get("heartbeat")}
                  for p in procs if p.get("kind") == "agent"]
    containers: dict[str, list[dict[str, Any]]] = {}
    for p in procs:
        if p.get("kind") == "container":
            containers.setdefault(str(p.get("group")), []).append(
                {"name": p.get("name"), "namespec": p.get("namespec"),
                 "state": p.get("statename"), "restarts": p.get("restarts", 0)})
    pods = [{"group": pod.get("group"), "phase": pod.get("phase"),
             "containers": containers.get(str(pod.get("group")), [])}
            for pod in state.get("pods") or []]
    return {
        "name": view.name, "url": view.url, "up": view.up, "error": view.error,
        "since": round(view.since, 3), "seen": view.state is not None,
        "subsystems": subsystems,
        "restarts": sum(int(s["restarts"] or 0) for s in subsystems),
        "phases": dict(sorted(Counter(str(p["phase"]) for p in pods).items())),
        "pods": pods, "pressure": list(view.pressure), "usage": view.usage,
    }


def fleet_state(views: Iterable[NodeView], now: float) -> dict[str, Any]:
    nodes = [node_summary(v) for v in views]
    return {"now": int(now), "nodes": nodes,
            "up": sum(1 for n in nodes if n["up"]), "total": len(nodes)}


def process_infos(view: NodeView, group_prefix: str = "") -> list[dict[str, Any]]:
    """The node's processes as ``getProcessInfo`` structs (supervisord's keys only), each
    group prefixed with ``group_prefix``; [] while the node is down or not yet heard."""
    if not view.up or view.state is None:
        return []
    out = []
    for p in view.state.get("processes") or []:
        info = {k: p[k] for k in INFO_KEYS if k in p}
        info["group"] = group_prefix + str(info.get("group", ""))
        out.append(info)
    return out
