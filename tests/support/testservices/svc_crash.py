"""Test service: crashes at start, every time."""

from podvisor.common.child import ChildContext


def run(ctx: ChildContext) -> None:
    raise RuntimeError("boom at start")
