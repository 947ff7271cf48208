"""Test service: crashes at start, every time."""

from podvisor.supervisor.child import ChildContext


def run(ctx: ChildContext) -> None:
    raise RuntimeError("boom at start")
