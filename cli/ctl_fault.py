"""`podvisorctl fault`: inject, list and clear faults (issue 28).

    podvisorctl fault inject KIND TARGET [--action A] [--direction send|recv|both]
                             [--delay DURATION] [--topics T,...] [--methods M,...] [--code CODE]
                             [--status HTTP] [--amount N] [--rate R] [--signal SIG] [--for DURATION]
                             [--json]
    podvisorctl fault list [--json]
    podvisorctl fault clear [ID] [--json]          (no ID: every fault)

KIND and what TARGET names (docs/ARCHITECTURE.md, "Faults"): ``bus`` a subsystem (drop, delay
or duplicate what it sends or receives), ``cri`` ``runtime`` (latency, a gRPC status code or a
hang on chosen methods of the embedded runtime), ``api`` a process that talks to the API
server, or ``apiserver`` for all (latency, a 429/5xx answer, watch disconnects, 410 Gone),
``resource`` a subsystem or ``pod/NAME`` (CPU or memory pressure from a stress child in its
cgroups), ``disk`` ``pod/NAME/VOLUME`` (an emptyDir full or read-only in the pod's
containers), ``kill`` a subsystem (a signal, default KILL),
``stop`` a subsystem (SIGSTOP, SIGCONT at the end). ``--for`` ends the fault by itself
(``30s``, ``2m``); without it, it lasts until ``fault clear``. Exit codes as every podvisorctl
command: 0, 1 a fault answer (bad request, unknown process), 2 no agent.
"""

from __future__ import annotations

import argparse
from typing import Any

from podvisor.common.config import ConfigError
from podvisor.common.timefmt import rfc3339
from podvisor.common.values import parse_duration

__all__ = ["add_fault_parser", "fault_args", "format_faults"]


def add_fault_parser(sub: Any) -> None:
    f = sub.add_parser("fault", help="inject, list and clear faults (bus, cri, api, disk, "
                                     "resource, kill, stop)")
    fsub = f.add_subparsers(dest="fault_cmd", required=True)
    inj = fsub.add_parser("inject", help="inject a fault")
    inj.add_argument("kind", choices=("bus", "cri", "api", "disk", "resource", "kill", "stop"))
    inj.add_argument("target", help="the subsystem it hits (cri: runtime; api: a process "
                                    "or apiserver, every one; resource: a subsystem or "
                                    "pod/NAME; disk: pod/NAME/VOLUME)")
    inj.add_argument("--action", default=None,
                     help="bus: drop|delay|duplicate; cri: latency|error|hang; "
                          "api: latency|error|disconnect|gone; resource: cpu|memory; "
                          "disk: full|readonly")
    inj.add_argument("--direction", default=None, help="bus: send|recv|both (default both)")
    inj.add_argument("--delay", default=None, metavar="DURATION",
                     help="bus delay, cri latency (e.g. 200ms)")
    inj.add_argument("--topics", default=None, help="bus: topic prefixes (default all)")
    inj.add_argument("--methods", default=None,
                     help="cri: method names, e.g. ListContainers,RunPodSandbox (default all)")
    inj.add_argument("--code", default=None, help="cri error: a gRPC status (UNAVAILABLE)")
    inj.add_argument("--status", type=int, default=None,
                     help="api error: the HTTP status answered (429, 500, 502, 503, 504)")
    inj.add_argument("--amount", type=int, default=None,
                     help="resource: busy processes (cpu, default 1) or MiB (memory, 64); "
                          "disk full: KiB left free (0)")
    inj.add_argument("--rate", type=float, default=None,
                     help="the share of messages or calls hit (default 1)")
    inj.add_argument("--signal", default=None, help="kill: the signal (default KILL)")
    inj.add_argument("--for", dest="duration", default=None, metavar="DURATION",
                     help="end it by itself after this long (default: until cleared)")
    inj.add_argument("--json", action="store_true")
    ls = fsub.add_parser("list", help="the faults in force")
    ls.add_argument("--json", action="store_true")
    cl = fsub.add_parser("clear", help="end a fault (no ID: every fault)")
    cl.add_argument("id", nargs="?", default=None)
    cl.add_argument("--json", action="store_true")


def fault_args(ns: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The control command and its args; ValueError for a bad duration."""
    if ns.fault_cmd == "list":
        return "fault-list", {}
    if ns.fault_cmd == "clear":
        return "fault-clear", {"id": ns.id} if ns.id else {}
    args: dict[str, Any] = {"kind": ns.kind, "target": ns.target}
    try:
        if ns.duration is not None:
            args["for"] = parse_duration("--for", ns.duration)
        if ns.delay is not None:
            args["delay"] = parse_duration("--delay", ns.delay)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    for key in ("action", "direction", "code", "status", "amount", "rate", "signal", "topics",
                "methods"):
        value = getattr(ns, key)
        if value is not None:
            args[key] = value
    return "fault-inject", args


def _detail(spec: dict[str, Any]) -> str:
    parts = []
    for key, value in sorted(spec.items()):
        if key in ("kind", "target", "for") or value in ("", [], None, 0, 0.0) or (
                key == "rate" and value == 1):
            continue
        parts.append(f"{key}={','.join(value) if isinstance(value, list) else value}")
    return " ".join(parts)


def _row(fault: dict[str, Any]) -> tuple[str, ...]:
    spec = fault.get("spec") or {}
    expires = fault.get("expires")
    ends = ("instant" if spec.get("kind") == "kill" else
            "until cleared" if expires is None else rfc3339(float(expires)))
    return (str(fault.get("id", "")), str(spec.get("kind", "")), str(spec.get("target", "")),
            rfc3339(float(fault.get("started") or 0)), ends, _detail(spec))


def format_faults(cmd: str, result: dict[str, Any]) -> str:
    """The human output of `fault inject|list|clear`."""
    if cmd == "inject":
        faults = [result]
    else:
        faults = list(result.get("faults" if cmd == "list" else "cleared") or [])
    if not faults:
        return "no faults in force" if cmd == "list" else "no fault cleared"
    rows = [("ID", "KIND", "TARGET", "STARTED", "ENDS", "DETAIL"), *map(_row, faults)]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5]
             for r in rows]
    if cmd == "clear":
        lines.insert(0, "cleared:")
    return "\n".join(lines)
