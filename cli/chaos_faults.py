"""The faults `podvisor chaos` injects through the agent's control endpoint (issue 28): the same
``fault-inject`` requests ``podvisorctl fault`` and the ``podvisor_node`` fixture send, each
recorded by the agent as events with its start and end, each ending by itself (``for``).

- ``bus``: a subsystem's bus traffic dropped (a partition, both directions), delayed or
  duplicated for 1 to 4 s. A partition of PLEG also kills a container meanwhile: the sync loop
  must notice the death without PLEG (its own runtime event stream, else its resync every
  ``syncFrequency``) and start the container again (``partition_death_missed`` otherwise).
- ``cri``: the embedded runtime slowed (every call 0.1 to 0.8 s late), failing chosen methods
  with a gRPC status, or hung: a hang must be detected (the runtime stops heartbeating) and the
  runtime replaced (``cri_hang_not_replaced`` otherwise). A hang stops exec probes too, so a
  probed pod going NotReady during it has a cause.

- ``resource``: CPU pressure (1 or 2 busy processes) in a subsystem's cgroup for 2 to 4 s:
  slower, never wrong (every invariant holds through it).
- ``api`` (when the agent has an API server: ``--kubeconfig``): for 2 to 5 s, an outage (every
  request answered 503 and every watch cut, of every API-facing process), 429/5xx answers,
  latency, watch disconnects or ``410 Gone`` of one of them (or all): no container may be
  restarted or replaced meanwhile (``api_fault_restarts`` otherwise: an API outage must never
  restart a pod).
- ``disk``: an unprobed pod's emptyDir (``scratch``) full or read-only inside its container for
  1.5 to 3 s; a file chaos wrote in the volume before must be there after, and the container
  must be the same process (``disk_fault_damage`` otherwise). Or the node's state (``rootDir``)
  full or read-only: no container replaced, no subsystem restarted, a file chaos put there
  before still there after.

Each waits for the fault to end and the agent to be whole again; its recovery is that wait.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podvisor.ipc.control import ControlError
from podvisor.ipc.faults import API_PROCESSES, API_TARGET

if TYPE_CHECKING:
    from podvisor.cli.chaos import Chaos

VOLUME = "scratch"  # chaos.py's SCRATCH: the emptyDir of its unprobed pods

__all__ = ["fault_api", "fault_bus", "fault_cri", "fault_disk", "fault_resource"]

# methods an error may hit: not ExecSync (a failing exec readiness probe makes a pod NotReady,
# which the ready_lost_without_cause invariant would then blame on nothing)
ERROR_METHODS = ("ListContainers", "ListPodSandbox", "ContainerStatus", "PodSandboxStatus",
                 "Status", "ImageFsInfo", "ListImages")
ERROR_CODES = ("UNAVAILABLE", "INTERNAL", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")
API_STATUSES = (429, 500, 502, 503, 504)


def _inject(chaos: Chaos, **args: Any) -> str | None:
    try:
        fault = chaos.control.call("fault-inject", timeout=5.0, **args)
    except (ControlError, OSError) as err:
        chaos.report.details.append(f"fault-inject {args} refused: {err}")
        return None
    return str(fault["id"])


def _wait_over(chaos: Chaos, fid: str, hold: float, what: str) -> bool:
    """Until fault ``fid`` ended (it expires by itself) and the agent is whole again."""
    def gone() -> bool:
        try:
            faults = chaos.control.call("fault-list", timeout=2.0)["faults"]
        except (ControlError, OSError):
            return False
        return all(f["id"] != fid for f in faults)
    t0 = chaos.now()
    if not chaos.wait(f"{what} to end", gone, hold + 30.0, 0.1) or not chaos.wait(
            f"the agent whole after {what}", chaos.all_up, 60.0, 0.1):
        chaos.report.details.append(f"{what}: the agent not whole 60 s after it ended")
        return False
    chaos.report.recovery[what].append(chaos.now() - t0)
    return True


def fault_bus(chaos: Chaos) -> None:
    rows = chaos.rows()
    names = sorted(n for n, r in rows.items() if r["state"] == "RUNNING" and r["pid"])
    if not names:
        return
    what = chaos.bus_deck.draw()  # every one within each deck
    action, name = ("drop", "pleg") if what == "partition-pleg" else (
        what, chaos.rng.choice(names))
    if name not in names:
        return
    hold = chaos.rng.uniform(1.0, 4.0)
    args: dict[str, Any] = {"kind": "bus", "target": name, "action": action, "for": hold}
    if action == "delay":
        args["delay"] = round(chaos.rng.uniform(0.05, 0.5), 3)
    fid = _inject(chaos, **args)
    if fid is None:
        return
    chaos.report.faults["bus"] += 1
    if name == "pleg" and action == "drop":
        _kill_behind_partition(chaos)
    _wait_over(chaos, fid, hold, f"bus {action}")


def _kill_behind_partition(chaos: Chaos) -> None:
    """Kill a container while PLEG is cut off: the sync loop must start it again by itself."""
    procs = chaos.marker_processes()
    candidates = sorted(n for n in chaos.names
                        if chaos.kills[n] == 0 and len(procs.get(f"{n}/app", [])) == 1)
    if not candidates:
        return
    pod = chaos.rng.choice(candidates)
    [pid] = procs[f"{pod}/app"]
    with chaos.lock:
        chaos.kills[pod] += 1
        chaos.last_kill[pod] = chaos.now()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)

    def replaced() -> bool:
        return any(p != pid for p in chaos.marker_processes().get(f"{pod}/app", []))
    limit = chaos.sync_frequency + 30.0
    if not chaos.wait(f"{pod} replaced behind a PLEG partition", replaced, limit, 0.05):
        chaos.report.invariants["partition_death_missed"] += 1
        chaos.report.details.append(f"{pod}: killed while PLEG was partitioned, not started "
                                    f"again within {limit:g} s")


def fault_resource(chaos: Chaos) -> None:
    rows = chaos.rows()
    names = sorted(n for n, r in rows.items() if r["state"] == "RUNNING" and r["pid"])
    if not names:
        return
    hold = chaos.rng.uniform(2.0, 4.0)
    fid = _inject(chaos, kind="resource", target=chaos.rng.choice(names), action="cpu",
                  amount=chaos.rng.randint(1, 2), **{"for": hold})
    if fid is None:
        return
    chaos.report.faults["resource"] += 1
    _wait_over(chaos, fid, hold, "resource cpu")


def fault_cri(chaos: Chaos) -> None:
    row = chaos.rows().get("runtime")
    if row is None or row["state"] != "RUNNING" or not row["pid"]:
        return  # not the embedded runtime, or it is not up
    action = chaos.cri_deck.draw()
    if action == "hang" and not chaos.may_fault("runtime"):
        action = "latency"
    args: dict[str, Any] = {"kind": "cri", "target": "runtime", "action": action}
    if action == "latency":
        hold = chaos.rng.uniform(1.0, 4.0)
        args["delay"] = round(chaos.rng.uniform(0.1, 0.8), 3)
    elif action == "error":
        hold = chaos.rng.uniform(1.0, 3.0)
        args["code"] = chaos.rng.choice(ERROR_CODES)
        args["methods"] = chaos.rng.sample(ERROR_METHODS, 2)
    else:
        # long enough to be found hung: the runtime's probe goes stale, then heartbeatTimeout
        hold = chaos.limits_of("runtime").heartbeat_timeout + chaos.rng.uniform(4.0, 6.0)
    args["for"] = hold
    restarts = int(row["restarts"])
    t0 = chaos.now()
    if action == "hang":
        chaos.faulted["runtime"].append(t0)
        with chaos.lock:  # exec probes hang too: a probed pod may go NotReady, with cause
            for pod in chaos.probed:
                chaos.last_kill[pod] = t0 + hold
    fid = _inject(chaos, **args)
    if fid is None:
        return
    chaos.report.faults["cri"] += 1
    if action == "hang":
        def replaced() -> bool:
            r = chaos.rows().get("runtime")
            return r is not None and int(r["restarts"]) > restarts
        if chaos.wait("the hung runtime replaced", replaced, hold + 60.0, 0.1):
            chaos.report.recovery["cri hang detected"].append(chaos.now() - t0)
            if chaos.bus is not None:
                chaos.bus.forget("runtime")
        else:
            chaos.report.invariants["cri_hang_not_replaced"] += 1
            chaos.report.details.append(f"the runtime hung for {hold:.1f} s and was not "
                                        "replaced")
    _wait_over(chaos, fid, hold, f"cri {action}")


def _unkilled_pids(chaos: Chaos) -> dict[str, list[int]]:
    """Chaos's pods' container PIDs, with the kills of each so far (a snapshot to compare)."""
    procs = chaos.marker_processes()
    return {n: sorted(procs.get(f"{n}/app", [])) for n in chaos.names}


def _replaced(chaos: Chaos, before: dict[str, list[int]], kills: dict[str, int]) -> list[str]:
    """Pods whose container process changed since ``before`` without a kill of ours."""
    now = _unkilled_pids(chaos)
    return [n for n, pids in before.items()
            if pids and chaos.kills[n] == kills.get(n, 0) and now.get(n) != pids]


def fault_api(chaos: Chaos) -> None:
    if not chaos.api:
        return
    rows = chaos.rows()
    facing = sorted(n for n in API_PROCESSES
                    if (r := rows.get(n)) is not None and r["state"] == "RUNNING")
    if not facing:
        return
    what = chaos.api_deck.draw()
    hold = chaos.rng.uniform(2.0, 5.0)
    target = API_TARGET if what == "outage" else chaos.rng.choice([*facing, API_TARGET])
    base: dict[str, Any] = {"kind": "api", "target": target, "for": hold}
    specs: list[dict[str, Any]]
    if what == "outage":
        specs = [{"action": "error", "status": 503}, {"action": "disconnect"}]
    elif what == "error":
        specs = [{"action": "error", "status": chaos.rng.choice(API_STATUSES)}]
    elif what == "latency":
        specs = [{"action": "latency", "delay": round(chaos.rng.uniform(0.1, 1.0), 3)}]
    else:
        specs = [{"action": what}]
    before, kills = _unkilled_pids(chaos), dict(chaos.kills)
    fids = [fid for spec in specs if (fid := _inject(chaos, **base, **spec)) is not None]
    if not fids:
        return
    chaos.report.faults["api"] += 1
    for fid in fids:
        _wait_over(chaos, fid, hold, f"api {what}")
    for name in _replaced(chaos, before, kills):
        chaos.report.invariants["api_fault_restarts"] += 1
        chaos.report.details.append(f"{name}: its container replaced during api {what} of "
                                    f"{target}")


def fault_disk(chaos: Chaos) -> None:
    action = chaos.disk_deck.draw()
    if action.startswith("rootDir "):
        _fault_root_dir(chaos, action.removeprefix("rootDir "))
        return
    pods = chaos.pods() or {}
    procs = chaos.marker_processes()
    candidates = sorted(n for n in chaos.scratch
                        if n in pods and len(procs.get(f"{n}/app", [])) == 1)
    if not candidates:
        return
    name = chaos.rng.choice(candidates)
    uid = str(pods[name]["metadata"].get("uid", ""))
    host = chaos.paths.pods_dir / uid / "volumes" / "kubernetes.io~empty-dir" / VOLUME
    if not uid or not host.is_dir():
        chaos.report.details.append(f"disk: {name}'s emptyDir not found at {host}")
        return
    hold = chaos.rng.uniform(1.5, 3.0)
    token = f"{chaos.token}-{chaos.report.faults['disk']}"
    mark = host / f"chaos-{token}"
    mark.write_text(token, encoding="utf-8")
    before, kills = _unkilled_pids(chaos), dict(chaos.kills)
    fid = _inject(chaos, kind="disk", target=f"pod/{name}/{VOLUME}", action=action,
                  **{"for": hold})
    if fid is None:
        return
    chaos.report.faults["disk"] += 1
    _wait_over(chaos, fid, hold, f"disk {action}")
    lost = not _holds(mark, token)
    replaced = name in _replaced(chaos, {name: before[name]}, kills)
    if lost or replaced:
        chaos.report.invariants["disk_fault_damage"] += 1
        chaos.report.details.append(
            f"{name}: after its emptyDir was {action}: "
            + ", ".join(w for w, bad in (("the file written before is gone", lost),
                                         ("its container was replaced", replaced)) if bad))


def _fault_root_dir(chaos: Chaos, action: str) -> None:
    """The node's state full or read-only: it runs on (no container replaced, no subsystem
    restarted) and reads its state as before (a file chaos put there is there after)."""
    hold = chaos.rng.uniform(1.5, 3.0)
    token = f"{chaos.token}-{chaos.report.faults['disk']}"
    mark = chaos.paths.state_dir / f".chaos-{token}"
    mark.write_text(token, encoding="utf-8")
    try:
        before, kills = _unkilled_pids(chaos), dict(chaos.kills)
        rows = {n: int(r["restarts"]) for n, r in chaos.rows().items()}
        fid = _inject(chaos, kind="disk", target="rootDir", action=action, **{"for": hold})
        if fid is None:
            return
        chaos.report.faults["disk"] += 1
        _wait_over(chaos, fid, hold, f"disk rootDir {action}")
        after = {n: int(r["restarts"]) for n, r in chaos.rows().items()}
        bad = [f"{n} restarted" for n, k in after.items() if k > rows.get(n, k)]
        bad += [f"{n}'s container replaced" for n in _replaced(chaos, before, kills)]
        if not _holds(mark, token):
            bad.append("a file of its state is gone")
        if bad:
            chaos.report.invariants["disk_fault_damage"] += 1
            chaos.report.details.append(f"rootDir {action}: " + ", ".join(bad))
    finally:
        mark.unlink(missing_ok=True)


def _holds(path: Path, text: str) -> bool:
    try:
        return path.read_text(encoding="utf-8") == text
    except OSError:
        return False
