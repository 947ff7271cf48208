"""supervisord's events, derived as data (pure; see docs/ARCHITECTURE.md "Event listeners").

- ``TRANSLATIONS``: a podvisor supervisor transition -> the supervisord transitions it stands
  for (podvisor goes RUNNING -> BACKOFF on a crash, supervisord RUNNING -> EXITED
  (expected:0) and then on; every other edge has the same names).
- ``container_events(old, new)``: two snapshots of the containers' ``Proc``s -> transitions
  (a new container ID under a still-RUNNING container is a restart: EXITED, STARTING, RUNNING).
- ``payload()``: a PROCESS_STATE_* body as supervisord writes it (``processname:x
  groupname:g from_state:S`` plus ``pid``, ``expected`` or ``tries`` as its event class does).
- ``matches()``: whether a listener's ``events`` list covers an event type (types nest:
  EVENT > PROCESS_STATE > PROCESS_STATE_EXITED; EVENT > TICK > TICK_5; EVENT >
  PROCESS_LOG > PROCESS_LOG_STDOUT).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from podvisor.services.ops.procs import Proc

__all__ = ["TRANSLATIONS", "Transition", "agent_transitions", "container_events", "matches",
           "payload"]


@dataclass(frozen=True)
class Transition:
    """One supervisord process state change."""

    group: str
    name: str
    from_state: str
    to_state: str
    pid: int = 0
    expected: int = 1  # EXITED: 1 when the exit was expected (code 0)
    tries: int = 0

    @property
    def event(self) -> str:
        return f"PROCESS_STATE_{self.to_state}"


# (podvisor from, podvisor to) -> supervisord (from, to) steps; "expected" set per step below.
TRANSLATIONS: Mapping[tuple[str, str], tuple[tuple[str, str], ...]] = {
    ("RUNNING", "BACKOFF"): (("RUNNING", "EXITED"),),
    ("BACKOFF", "STARTING"): (("EXITED", "STARTING"),),
    ("STOPPING", "BACKOFF"): (("STOPPING", "EXITED"),),
}


def agent_transitions(group: str, name: str, from_state: str, to_state: str, pid: int,
                      exit_code: int | None, restarts: int,
                      prev_crash: bool) -> list[Transition]:
    """The supervisord transitions of one podvisor supervisor transition. ``prev_crash``: the
    previous transition of this process was a translated crash (so BACKOFF -> STARTING reads
    EXITED -> STARTING)."""
    steps = TRANSLATIONS.get((from_state, to_state), ((from_state, to_state),))
    if (from_state, to_state) == ("BACKOFF", "STARTING") and not prev_crash:
        steps = ((from_state, to_state),)
    return [Transition(group, name, f, t, pid,
                       expected=int(t == "EXITED" and exit_code == 0 and to_state != "BACKOFF"),
                       tries=restarts) for f, t in steps]


def container_events(old: Mapping[str, Proc], new: Mapping[str, Proc]) -> list[Transition]:
    """Transitions between two snapshots keyed by namespec (new and gone containers too)."""
    out: list[Transition] = []
    for spec, cur in new.items():
        prev = old.get(spec)
        if prev is None:
            if cur.state.name != "STOPPED":
                out.append(_t(cur, "STOPPED", cur.state.name))
            continue
        cid_old, cid_new = prev.extra.get("container_id"), cur.extra.get("container_id")
        restarted = bool(cid_old) and bool(cid_new) and cid_old != cid_new
        if restarted and prev.state.name == "RUNNING":
            code = _old_exit(str(cid_old), cur)
            out.append(_t(prev, "RUNNING", "EXITED", expected=int(code == 0)))
            out.append(_t(cur, "EXITED", "STARTING"))
            if cur.state.name == "RUNNING":
                out.append(_t(cur, "STARTING", "RUNNING"))
            elif cur.state.name != "STARTING":
                out.append(_t(cur, "STARTING", cur.state.name))
        elif prev.state != cur.state:
            out.append(_t(cur if cur.pid else prev, prev.state.name, cur.state.name,
                          expected=int(cur.exitstatus == 0)))
    for spec, prev in old.items():
        if spec not in new and prev.state.name not in ("STOPPED", "EXITED", "FATAL"):
            out.append(_t(prev, prev.state.name, "STOPPED"))
    return out


def _old_exit(old_id: str, cur: Proc) -> int:
    """A container restarted between two snapshots: the exit code of the old container
    ``old_id`` (from the runtime's listing, else the status's lastState; the new container's
    own state says nothing of it); a restart counts as unexpected unless it exited 0."""
    code = cur.exits.get(old_id, cur.last_exit_code)
    return code if code is not None else 1


def _t(p: Proc, f: str, t: str, expected: int = 1) -> Transition:
    return Transition(p.group, p.name, f, t, p.pid, expected, p.restarts)


def payload(tr: Transition) -> str:
    """supervisord's ``ProcessStateEvent.payload()`` for this transition."""
    body = f"processname:{tr.name} groupname:{tr.group} from_state:{tr.from_state}"
    if tr.to_state in ("STARTING", "BACKOFF"):
        return f"{body} tries:{tr.tries}"
    if tr.to_state == "EXITED":
        return f"{body} expected:{tr.expected} pid:{tr.pid}"
    if tr.to_state in ("RUNNING", "STOPPING", "STOPPED"):
        return f"{body} pid:{tr.pid}"
    return body


def matches(subscribed: Iterable[str], event: str) -> bool:
    """True when one of ``subscribed`` is ``event`` or a type it belongs to."""
    parents = {event, "EVENT"}
    if event.startswith("PROCESS_STATE"):
        parents.add("PROCESS_STATE")
    if event.startswith("TICK"):
        parents.add("TICK")
    if event.startswith("PROCESS_LOG"):
        parents.add("PROCESS_LOG")
    return any(s in parents for s in subscribed)
