"""Test service standing in for the sync loop: answers StopAllPods with AllPodsStopped."""

from podvisor.common.child import ChildContext
from podvisor.ipc.bus import Publisher, Subscriber
from podvisor.ipc.messages import AllPodsStopped, StopAllPods


def run(ctx: ChildContext) -> None:
    pub = Publisher(ctx.zctx, ctx.paths, ctx.name)
    sub = Subscriber(ctx.zctx, ctx.paths, ["syncloop.pods.stopall"])
    try:
        while not ctx.stop.is_set():
            ctx.heartbeat()
            env = sub.recv(timeout=0.1)
            if env is not None and isinstance(env.message, StopAllPods):
                ctx.log.info("fake.stopall", reason=env.message.reason)
                pub.publish(AllPodsStopped(pods=3, ts=0.0))
    finally:
        pub.close()
        sub.close()
