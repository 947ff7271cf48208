"""Test service: heartbeats and idles until asked to stop."""

from podvisor.common.child import ChildContext


def run(ctx: ChildContext) -> None:
    ctx.log.info("idle.running")
    while not ctx.sleep(0.1):
        pass
