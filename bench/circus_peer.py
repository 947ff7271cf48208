"""circus as a benchmark peer (not a test; prints figures).

circus runs from its OWN virtualenv (`~/.cache/podvisor/bench-peers/circus`, or
$PVBENCH_CIRCUS_VENV; created with `python3 -m venv` + `pip install circus` on first use, reused
after), never from podvisor's. N watchers of one `sleep 3600` process each; circusd is started
cold in its own session and timed until every watcher's process has exec'd `sleep` (seen in
/proc through psutil, polled every 5 ms). Then kill -9 of a watcher's process -> its
replacement has exec'd `sleep`, over `-n` kills. circusd is stopped with SIGTERM, then its
process group is SIGKILLed by its PID.

    .venv/bin/python bench/circus_peer.py [--many 40] [-n 5] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

VENV = Path(os.environ.get("PVBENCH_CIRCUS_VENV",
                           Path.home() / ".cache" / "podvisor" / "bench-peers" / "circus"))


def ensure_venv() -> Path:
    circusd = VENV / "bin" / "circusd"
    if not circusd.exists():
        subprocess.run(["python3", "-m", "venv", str(VENV)],
                       check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "circus"], check=True)
    return circusd


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sleepers(circusd: psutil.Process) -> dict[str, int]:
    """watcher name (from the process's environment-free cmdline tag) -> pid, exec'd only."""
    out: dict[str, int] = {}
    for child in circusd.children():
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if len(cmd) == 3 and cmd[0] == "sleep":
            out[cmd[2]] = child.pid
    return out


def _wait(cond: object, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return time.monotonic()
        time.sleep(0.005)
    raise TimeoutError(f"circus: not reached within {timeout:.0f} s")


def measure(many: int, kills: int) -> dict[str, object]:
    circusd_bin = ensure_venv()
    tmp = Path(tempfile.mkdtemp(prefix="pvcircus", dir="/tmp"))
    ini = [f"[circus]\nendpoint = tcp://127.0.0.1:{_port()}\n"
           f"pubsub_endpoint = tcp://127.0.0.1:{_port()}\nstatsd = false\n"]
    # `sleep 3600 w<i>` fails (sleep takes one number), so the tag goes in a second number
    ini += [f"[watcher:w{i}]\ncmd = sleep 3600 {i}\nnumprocesses = 1\n" for i in range(many)]
    (tmp / "circus.ini").write_text("\n".join(ini))
    t0 = time.monotonic()
    proc = subprocess.Popen([str(circusd_bin), str(tmp / "circus.ini")], cwd=tmp,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    out: dict[str, object] = {"many": many}
    try:
        circusd = psutil.Process(proc.pid)
        t1 = _wait(lambda: len(_sleepers(circusd)) >= many, 120.0)
        out["cold_s"] = t1 - t0
        restarts: list[float] = []
        for i in range(kills):
            tag = str(i % many)
            old = _sleepers(circusd)[tag]
            k0 = time.monotonic()
            os.kill(old, signal.SIGKILL)
            k1 = _wait(lambda tag=tag, old=old: _sleepers(circusd).get(tag, old) != old, 30.0)
            restarts.append(k1 - k0)
        out["kill_s"] = restarts
    except (TimeoutError, psutil.Error) as exc:
        out["error"] = str(exc)
    finally:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its watchers, if any are left
        if proc.poll() is None:
            proc.wait()
        for path in tmp.iterdir():
            path.unlink()
        tmp.rmdir()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--many", type=int, default=40, help="watchers, one process each")
    ap.add_argument("-n", type=int, default=5, help="kill -9 samples")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    figures = measure(args.many, args.n)
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    elif "error" in figures:
        print(f"circus: {figures['error']}")
    else:
        kill = [s * 1e3 for s in figures["kill_s"]]  # type: ignore[attr-defined]
        print(f"circus, {args.many} watchers, cold start -> all exec'd "
              f"{figures['cold_s'] * 1e3:8.0f} ms\n"  # type: ignore[operator]
              f"circus, kill -9 -> replacement exec'd p50 {statistics.median(kill):.1f} ms "
              f"(min {min(kill):.1f}, max {max(kill):.1f}, n={len(kill)})")
    return 1 if "error" in figures else 0


if __name__ == "__main__":
    sys.exit(main())
