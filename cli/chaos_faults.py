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

Each waits for the fault to end and the agent to be whole again; its recovery is that wait.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import TYPE_CHECKING, Any

from podvisor.ipc.control import ControlError

if TYPE_CHECKING:
    from podvisor.cli.chaos import Chaos

__all__ = ["fault_bus", "fault_cri", "fault_resource"]

# methods an error may hit: not ExecSync (a failing exec readiness probe makes a pod NotReady,
# which the ready_lost_without_cause invariant would then blame on nothing)
ERROR_METHODS = ("ListContainers", "ListPodSandbox", "ContainerStatus", "PodSandboxStatus",
                 "Status", "ImageFsInfo", "ListImages")
ERROR_CODES = ("UNAVAILABLE", "INTERNAL", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")


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
