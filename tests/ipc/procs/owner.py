"""A real owner process for bus tests: owns map ``test`` and applies commands read from stdin.

stdin lines: ``set KEY VALUE``, ``del KEY``, ``burst N`` (sets b0..bN-1 to their index).
stdout: ``ready`` once bound, then ``seq N`` after each command.
"""

import os
import selectors
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from podvisor.ipc.bus import Publisher
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.clone import MapOwner
from podvisor.ipc.maps import MapSpec
from podvisor.ipc.paths import RunPaths


def _plain(value: Any) -> Any:
    return value


TEST: MapSpec[Any] = MapSpec("test", _plain, _plain)  # a map of plain msgpack values

def main() -> None:
    paths = RunPaths(Path(sys.argv[1]))
    zctx = zmq.Context()
    pub = Publisher(zctx, paths, "test-owner")
    owner = MapOwner(zctx, paths, pub, TEST, heartbeat_interval=0.2, clock=SYSTEM_CLOCK)
    sel = selectors.DefaultSelector()
    stdin = sys.stdin.fileno()
    sel.register(stdin, selectors.EVENT_READ)
    sel.register(owner.socket.getsockopt(zmq.FD), selectors.EVENT_READ)
    print("ready", flush=True)
    pending = b""
    while True:
        lines: list[bytes] = []
        for key, _ in sel.select(0.05):
            if key.fileobj == stdin:
                chunk = os.read(stdin, 65536)  # the fd itself: no line may hide in a buffer
                if not chunk:
                    return
                *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            cmd = line.decode().split()
            if not cmd:
                continue
            if cmd[0] == "set":
                owner.set(cmd[1], cmd[2])
            elif cmd[0] == "del":
                owner.delete(cmd[1])
            elif cmd[0] == "burst":
                for i in range(int(cmd[1])):
                    owner.set(f"b{i}", i)
            print(f"seq {owner.seq}", flush=True)
        owner.serve()
        owner.tick(time.monotonic())


if __name__ == "__main__":
    main()
