"""A real replica process for bus tests: mirrors map ``test`` and reports its state.

stdout: one JSON line ``{"seq", "epoch", "items", "drops", "synced"}`` whenever anything changed.
"""

import json
import sys
from pathlib import Path
from typing import Any

import zmq

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.clone import MapReplica
from podvisor.ipc.maps import MapSpec
from podvisor.ipc.paths import RunPaths


def _plain(value: Any) -> Any:
    return value


TEST: MapSpec[Any] = MapSpec("test", _plain, _plain)  # a map of plain msgpack values

def main() -> None:
    paths = RunPaths(Path(sys.argv[1]))
    zctx = zmq.Context()
    replica = MapReplica(zctx, paths, TEST, snapshot_timeout=0.5, clock=SYSTEM_CLOCK)
    last = None
    while True:
        replica.pump(timeout=0.1)
        state = {"seq": replica.seq, "epoch": replica.epoch, "items": replica.items(),
                 "drops": dict(replica.drops), "synced": replica.synced}
        if state != last:
            print(json.dumps(state), flush=True)
            last = state


if __name__ == "__main__":
    main()
