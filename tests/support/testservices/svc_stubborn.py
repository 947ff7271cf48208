"""Test service: ignores SIGTERM and SIGALRM, keeps heartbeating (needs SIGKILL to stop)."""

import signal

from podvisor.common.child import ChildContext


def run(ctx: ChildContext) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:
        ctx.sleep(0.1)
