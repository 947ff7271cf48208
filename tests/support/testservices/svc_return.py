"""Test service: does one unit of work and returns normally (re-run after `period`)."""

from podvisor.common.child import ChildContext


def run(ctx: ChildContext) -> None:
    ctx.log.info("return.ran")
