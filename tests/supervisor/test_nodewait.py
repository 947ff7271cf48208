"""The supervisor's wait for a graceful node shutdown (``supervisor/nodewait.py``) over the
one fake clock: asked again every second until answered, done on the answer (asked for or
not: logind's), or when the groups' seconds plus the slack ran out."""

from __future__ import annotations

from podvisor.common import FakeClock
from podvisor.ipc.messages import Message, NodeShutdown
from podvisor.supervisor.nodewait import ASK_EVERY, SLACK, NodeShutdownWait


def wait() -> tuple[NodeShutdownWait, FakeClock, list[Message]]:
    clock, sent = FakeClock(), []
    return NodeShutdownWait(sent.append, clock.monotonic, clock.wall), clock, sent


def test_asked_again_until_answered() -> None:
    w, clock, sent = wait()
    assert not w.waiting and not w.due() and w.next_deadline() is None
    w.ask(20.0)
    assert [type(m) for m in sent] == [NodeShutdown] and w.waiting
    assert not w.due() and len(sent) == 1
    clock.advance(ASK_EVERY)
    assert not w.due() and len(sent) == 2
    w.answered = True
    assert w.due() and not w.timed_out


def test_the_wait_runs_out_after_the_groups_and_the_slack() -> None:
    w, clock, _ = wait()
    w.ask(20.0)
    start = clock.monotonic()
    assert w.next_deadline() == start + ASK_EVERY
    clock.advance(20.0 + SLACK)
    assert w.due() and w.timed_out


def test_an_answer_not_asked_for_stops_the_agent_too() -> None:
    w, _, sent = wait()
    w.answered = True  # logind's PrepareForShutdown: nodeshutdown drained on its own
    assert w.due() and sent == []
