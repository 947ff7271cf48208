"""`podvisorctl pods [--json] [--wide]`: the same PodList as `GET /pods`, as JSON or a kubectl-like
table (`--wide`: with each pod's IP, as `kubectl get pods -o wide`).

Where it comes from: `run/config.json` gives `address` and `readOnlyPort`; when the port is
enabled the PodList is fetched from `http://<address>:<readOnlyPort>/pods`. When the port is
disabled (0) or the server does not answer, the same PodList is built from snapshots of the
`desired` and `statuses` maps, asked directly from their owners' snapshot sockets under `run/`.
Exit codes: 0 ok, 2 the agent is not running (neither source answered).
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import zmq

from podvisor.common.config import read_config_json
from podvisor.common.podlist import pod_list, table_rows
from podvisor.common.timefmt import parse_rfc3339
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.clone import MapReplica
from podvisor.ipc.maps import DESIRED, STATUSES, MapSpec
from podvisor.ipc.paths import RunPaths

__all__ = ["format_age", "format_table", "get_podlist", "main_pods"]


def format_age(start: str | None, now: float) -> str:
    if not start:
        return "<unknown>"
    try:
        secs = max(0, int(now - parse_rfc3339(start)))
    except ValueError:
        return "<unknown>"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def format_table(podlist: dict[str, Any], now: float | None = None, wide: bool = False) -> str:
    now = SYSTEM_CLOCK.wall() if now is None else now
    rows = table_rows(podlist, lambda start: format_age(start, now), wide)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def _from_http(address: str, port: int, timeout: float) -> dict[str, Any]:
    host = "127.0.0.1" if address in ("", "0.0.0.0") else address
    host = f"[{host}]" if ":" in host else host
    with urllib.request.urlopen(f"http://{host}:{port}/pods", timeout=timeout) as resp:
        body = json.loads(resp.read())
    if not isinstance(body, dict):
        raise ValueError("the server did not answer with a PodList")
    return body


def _from_snapshots(paths: RunPaths, timeout: float) -> dict[str, Any] | None:
    zctx: zmq.Context[Any] = zmq.Context()
    try:
        maps: dict[MapSpec[Any], dict[str, Any]] = {}
        specs: tuple[MapSpec[Any], ...] = (DESIRED, STATUSES)
        for name in specs:
            replica = MapReplica(zctx, paths, name, snapshot_timeout=timeout, clock=SYSTEM_CLOCK)
            try:
                if not replica.sync() and name == DESIRED:
                    return None
                maps[name] = replica.items()
            finally:
                replica.close()
        return pod_list(maps[DESIRED], maps.get(STATUSES, {}))
    finally:
        zctx.destroy(linger=0)


def get_podlist(root: Path, timeout: float = 5.0) -> dict[str, Any] | None:
    """The PodList of the agent under `root`, or None when it is not running."""
    paths = RunPaths(root)
    try:
        config = read_config_json(paths.config_json)
    except (OSError, ValueError):
        return None
    if config.read_only_port:
        try:
            return _from_http(config.address, config.read_only_port, timeout)
        except (OSError, ValueError, urllib.error.URLError):
            pass  # the server is down or restarting: ask the map owners
    return _from_snapshots(paths, min(timeout, 2.0))


def main_pods(root_dir: str, as_json: bool, timeout: float = 5.0, wide: bool = False) -> int:
    podlist = get_podlist(Path(root_dir), timeout)
    if podlist is None:
        print(f"podvisorctl: no agent answers under {root_dir} (run/config.json or the sync loop "
              "is missing)", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(podlist, indent=2, sort_keys=True))
    else:
        print(format_table(podlist, wide=wide))
    return 0
