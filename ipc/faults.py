"""Injected faults (issue 28): the request `fault-inject` carries, its validation, the fault in
force with its id, and the file that tells every process which faults are in force.

The one definition, below every speaker: ``podvisorctl fault``, the ``podvisor.testing`` plugin,
chaos and the ops dashboard build a ``FaultSpec`` (or its wire map) and send it as the
``fault-inject`` control request (``ipc/control.py``); the supervisor validates it here
(``spec_from_args``), gives it an id and keeps it (``ActiveFault``) until it is cleared or its
duration runs out, and writes the faults in force to ``run/faults/faults.json``
(``write_faults``). Each process reads that file at start and whenever it changes
(``common/faultwatch.py``, inotify) and applies the faults aimed at it through its own seams:
its bus sockets (``ipc/busgate.py``), the embedded runtime's gRPC servicer, its API
connection; the supervisor applies ``kill``, ``stop`` and ``resource`` itself. So a restarted
process gets its fault again until it is cleared or expires, and the faults never travel on
the bus they may be cutting.

Kinds (``KINDS``), what ``target`` names and the fields each reads:

- ``bus``, target a subsystem: ``action`` drop / delay / duplicate, ``direction`` send / recv /
  both, ``delay`` (s), ``topics`` (prefixes; none: every message), ``rate``;
- ``cri``, target ``runtime`` (the embedded runtime): ``action`` latency / error / hang,
  ``methods`` (CRI method names; none: all), ``delay`` (s), ``code`` (a gRPC status name, for
  error), ``rate``;
- ``api``, target a process that talks to the API server, or ``apiserver`` (all of them):
  ``action`` latency (``delay``) / error (``status``: 429 or a 5xx, default 503, instead of
  an answer) / disconnect (watches are cut, open ones at once, new ones as they open) / gone
  (each watch path gets one ``410 Gone`` ERROR event, the reflector relists), ``rate``;
- ``disk``, target ``pod/NAME/VOLUME`` (an emptyDir; ``pod/NAMESPACE/NAME/VOLUME``):
  ``action`` full (``amount`` KiB left free, default 0) / readonly, from a small filesystem
  mounted over it in the pod's containers; or target ``rootDir``: the node's own state
  (``rootDir/state``) full (an overlay whose upper layer is a full tmpfs) or read-only (a
  read-only bind of itself), every process told so that it reopens what it keeps open
  (``supervisor/diskfault.py``);
- ``resource``, target a subsystem or ``pod/NAME`` (``pod/NAMESPACE/NAME``): ``action`` cpu
  (``amount`` busy processes, default 1) / memory (``amount`` MiB held, default 64), from a
  stress child in the target's cgroups (``supervisor/stress.py``);
- ``kill``, target a subsystem: ``signal`` (default KILL); instant: no duration;
- ``stop``, target a subsystem: SIGSTOP now, SIGCONT when cleared or expired.

Wire form of a request's args: ``{"kind", "target", "action"?, "direction"?, "methods"?,
"topics"?, "delay"?, "code"?, "rate"?, "signal"?, "for"?}`` (``for``: seconds; absent or 0:
until cleared). A fault in force: ``{"id", "started", "expires", "spec": {...the same...}}``
(wall-clock epoch seconds; ``expires`` null: until cleared).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "API_ACTIONS",
    "API_PROCESSES",
    "API_STATUSES",
    "API_TARGET",
    "BUS_ACTIONS",
    "CRI_ACTIONS",
    "DIRECTIONS",
    "DISK_ACTIONS",
    "GRPC_CODES",
    "KINDS",
    "POD_PREFIX",
    "RESOURCE_ACTIONS",
    "ROOT_DIR_TARGET",
    "ActiveFault",
    "FaultSpec",
    "FaultSpecError",
    "read_faults",
    "spec_from_args",
    "write_faults",
]

KINDS = ("bus", "cri", "api", "disk", "resource", "kill", "stop")
BUS_ACTIONS = ("drop", "delay", "duplicate")
DIRECTIONS = ("send", "recv", "both")
CRI_ACTIONS = ("latency", "error", "hang")
API_ACTIONS = ("latency", "error", "disconnect", "gone")
API_TARGET = "apiserver"  # an api fault aimed at every process's API connection
# the processes that keep an API connection for their main work: an api fault aimed at
# API_TARGET reaches each (podvisor.testing waits for each to apply it; chaos aims at them)
API_PROCESSES = ("source-api", "status-api", "node", "events-api", "volumes", "syncloop")
ROOT_DIR_TARGET = "rootDir"  # a disk fault on the node's own state (every process is told)
API_STATUSES = (429, 500, 502, 503, 504)
RESOURCE_ACTIONS = ("cpu", "memory")
DISK_ACTIONS = ("full", "readonly")
POD_PREFIX = "pod/"  # a resource fault's target: a pod (pod/NAME, pod/NAMESPACE/NAME)
# grpc.StatusCode's names (ipc imports no gRPC); OK is no fault
GRPC_CODES = ("CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
              "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
              "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
              "UNAUTHENTICATED")
MAX_DURATION = 24 * 3600.0
MAX_DELAY = 600.0
FILE_VERSION = 1


class FaultSpecError(ValueError):
    """A fault request that does not say a fault podvisor can inject (the message says why)."""


@dataclass(frozen=True)
class FaultSpec:
    """What to inject, where, and for how long (``duration`` seconds; 0: until cleared)."""

    kind: str
    target: str
    action: str = ""
    direction: str = "both"
    methods: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    delay: float = 0.0
    code: str = ""
    status: int = 0
    amount: int = 0
    rate: float = 1.0
    signal: str = ""
    duration: float = 0.0

    def aimed_at(self, process: str) -> bool:
        """Whether ``process`` applies this fault (its target, or every API-facing process
        for an ``api`` fault aimed at ``apiserver``, or every process for a ``disk`` fault on
        ``rootDir``: each reopens what it keeps open there)."""
        return self.target == process or (self.kind == "api" and self.target == API_TARGET) \
            or (self.kind == "disk" and self.target == ROOT_DIR_TARGET)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"kind": self.kind, "target": self.target}
        if self.kind in ("bus", "cri", "api"):
            wire.update(action=self.action, delay=self.delay, rate=self.rate)
        if self.kind == "api":
            wire["status"] = self.status
        if self.kind == "bus":
            wire.update(direction=self.direction, topics=list(self.topics))
        if self.kind == "cri":
            wire.update(methods=list(self.methods), code=self.code)
        if self.kind in ("resource", "disk"):
            wire.update(action=self.action, amount=self.amount)
        if self.kind == "kill":
            wire["signal"] = self.signal
        if self.duration:
            wire["for"] = self.duration
        return wire

    def describe(self) -> str:
        """One line for events, logs and `fault list`."""
        if self.kind == "bus":
            what = f"{self.action} {self.direction}"
            what += f" {self.delay:g}s" if self.action == "delay" else ""
            what += f" topics {','.join(self.topics)}" if self.topics else ""
        elif self.kind == "cri":
            what = self.action
            what += f" {self.delay:g}s" if self.action == "latency" else ""
            what += f" {self.code}" if self.action == "error" else ""
            what += f" on {','.join(self.methods)}" if self.methods else " on every call"
        elif self.kind == "resource":
            what = f"{self.action} {self.amount}" + (" MiB" if self.action == "memory" else
                                                      " busy")
        elif self.kind == "disk":
            what = self.action + (f", {self.amount} KiB free" if self.amount else "")
        elif self.kind == "api":
            what = self.action
            what += f" {self.delay:g}s" if self.action == "latency" else ""
            what += f" {self.status}" if self.action == "error" else ""
        else:
            what = f"SIG{self.signal}" if self.kind == "kill" else "SIGSTOP"
        rate = (f" ({self.rate:.0%})" if self.kind in ("bus", "cri", "api") and self.rate < 1
                else "")
        return f"{self.kind} {self.target}: {what}{rate}"


@dataclass(frozen=True)
class ActiveFault:
    """A fault in force: its id (``f<n>``), when it started and when it ends (wall clock;
    ``expires`` None: until cleared)."""

    id: str
    spec: FaultSpec
    started: float
    expires: float | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "spec": self.spec.to_wire(), "started": self.started,
                "expires": self.expires}

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> ActiveFault:
        """Raises FaultSpecError for a map that is not one."""
        spec = raw.get("spec")
        if not isinstance(raw.get("id"), str) or not isinstance(spec, Mapping):
            raise FaultSpecError("a fault needs an 'id' and a 'spec'")
        started, expires = raw.get("started"), raw.get("expires")
        if not isinstance(started, int | float) or not (
                expires is None or isinstance(expires, int | float)):
            raise FaultSpecError("a fault's 'started'/'expires' must be numbers")
        return cls(raw["id"], spec_from_args(spec), float(started),
                   None if expires is None else float(expires))


def _number(raw: object) -> bool:
    return isinstance(raw, int | float) and not isinstance(raw, bool)


def _seconds(args: Mapping[str, Any], key: str, limit: float) -> float:
    raw = args.get(key, 0)
    if not _number(raw) or not 0 <= float(raw) <= limit:
        raise FaultSpecError(f"'{key}' must be seconds between 0 and {limit:g}")
    return float(raw)


def _choice(args: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    raw = args.get(key) or default
    if raw not in allowed:
        raise FaultSpecError(f"'{key}' must be one of {', '.join(allowed)} (not {raw!r})")
    return str(raw)


def _names(args: Mapping[str, Any], key: str) -> tuple[str, ...]:
    raw = args.get(key) or ()
    if isinstance(raw, str):
        raw = [part for part in raw.split(",") if part]
    if not isinstance(raw, list | tuple) or not all(isinstance(x, str) and x for x in raw):
        raise FaultSpecError(f"'{key}' must be a list of names")
    return tuple(raw)


_KEYS = {
    "bus": {"action", "direction", "topics", "delay", "rate", "for"},
    "cri": {"action", "methods", "delay", "code", "rate", "for"},
    "api": {"action", "delay", "status", "rate", "for"},
    "resource": {"action", "amount", "for"},
    "disk": {"action", "amount", "for"},
    "kill": {"signal"},
    "stop": {"for"},
}


def spec_from_args(args: Mapping[str, Any]) -> FaultSpec:
    """The ``FaultSpec`` a ``fault-inject`` request's args say; FaultSpecError naming the first
    thing wrong. Which targets exist is the supervisor's to check (BAD_NAME)."""
    kind = args.get("kind")
    if kind not in KINDS:
        raise FaultSpecError(f"'kind' must be one of {', '.join(KINDS)} (not {kind!r})")
    target = args.get("target")
    if not isinstance(target, str) or not target:
        raise FaultSpecError("'target' (what the fault hits) is required")
    unknown = sorted(set(args) - _KEYS[kind] - {"kind", "target"})
    if unknown:
        raise FaultSpecError(f"a {kind} fault takes no {', '.join(map(repr, unknown))}")
    spec = FaultSpec(kind=kind, target=target, duration=_seconds(args, "for", MAX_DURATION))
    rate = args.get("rate", 1.0)
    if kind in ("bus", "cri", "api") and (not _number(rate) or not 0 < float(rate) <= 1):
        raise FaultSpecError("'rate' must be a share of the traffic, above 0 and at most 1")
    if kind == "bus":
        action = _choice(args, "action", BUS_ACTIONS, "drop")
        delay = _seconds(args, "delay", MAX_DELAY)
        if action == "delay" and not delay:
            raise FaultSpecError("a delay fault needs 'delay' (seconds, above 0)")
        return replace(spec, action=action, direction=_choice(args, "direction", DIRECTIONS,
                                                                "both"),
                       topics=_names(args, "topics"), delay=delay, rate=float(rate))
    if kind == "cri":
        action = _choice(args, "action", CRI_ACTIONS, "latency")
        delay = _seconds(args, "delay", MAX_DELAY)
        if action == "latency" and not delay:
            raise FaultSpecError("a latency fault needs 'delay' (seconds, above 0)")
        code = str(args.get("code") or ("UNAVAILABLE" if action == "error" else ""))
        if action == "error" and code not in GRPC_CODES:
            raise FaultSpecError(f"'code' must be a gRPC status name ({', '.join(GRPC_CODES)})")
        return replace(spec, action=action, methods=_names(args, "methods"), delay=delay,
                       code=code if action == "error" else "", rate=float(rate))
    if kind == "api":
        action = _choice(args, "action", API_ACTIONS, "error")
        delay = _seconds(args, "delay", MAX_DELAY)
        if action == "latency" and not delay:
            raise FaultSpecError("a latency fault needs 'delay' (seconds, above 0)")
        status = args.get("status") or (503 if action == "error" else 0)
        if action == "error" and status not in API_STATUSES:
            raise FaultSpecError(f"'status' must be one of {', '.join(map(str, API_STATUSES))}")
        return replace(spec, action=action, delay=delay, rate=float(rate),
                       status=int(status) if action == "error" else 0)
    if kind == "disk":
        if target != ROOT_DIR_TARGET and (not target.startswith(POD_PREFIX)
                                          or target.count("/") not in (2, 3)):
            raise FaultSpecError("a disk fault's target is pod/NAME/VOLUME (an emptyDir) or "
                                 f"{ROOT_DIR_TARGET}")
        action = _choice(args, "action", DISK_ACTIONS, "full")
        amount = args.get("amount") or 0
        if isinstance(amount, bool) or not isinstance(amount, int) or not 0 <= amount <= 1 << 20:
            raise FaultSpecError("'amount' must be 0 to 1048576 KiB left free")
        return replace(spec, action=action, amount=amount)
    if kind == "resource":
        action = _choice(args, "action", RESOURCE_ACTIONS, "cpu")
        amount = args.get("amount") or (1 if action == "cpu" else 64)
        limit = 16 if action == "cpu" else 65536
        if isinstance(amount, bool) or not isinstance(amount, int) or not 1 <= amount <= limit:
            raise FaultSpecError(f"'amount' must be 1 to {limit} "
                                 + ("busy processes" if action == "cpu" else "MiB"))
        return replace(spec, action=action, amount=amount)
    if kind == "kill":
        sig = args.get("signal") or "KILL"
        if not isinstance(sig, str | int) or isinstance(sig, bool):
            raise FaultSpecError("'signal' must be a signal name or number")
        return replace(spec, signal=str(sig).upper().removeprefix("SIG"))
    return spec


def read_faults(path: Path) -> tuple[ActiveFault, ...]:
    """The faults in force as ``path`` says (none when it is missing or unreadable: a process
    never fails for want of a fault)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    if not isinstance(doc, dict) or doc.get("v") != FILE_VERSION:
        return ()
    out = []
    for raw in doc.get("faults") or ():
        if isinstance(raw, Mapping):
            with contextlib.suppress(FaultSpecError):
                out.append(ActiveFault.from_wire(raw))
    return tuple(out)


def write_faults(path: Path, faults: tuple[ActiveFault, ...] | list[ActiveFault]) -> None:
    """Replace ``path`` atomically (write, then rename: a reader sees the old set or the new)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"v": FILE_VERSION, "faults": [f.to_wire() for f in faults]}),
                   encoding="utf-8")
    os.replace(tmp, path)
