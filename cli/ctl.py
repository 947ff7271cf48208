"""`podvisorctl`: control a running agent.

    podvisorctl [--root-dir DIR | --endpoint URL] [--timeout S] COMMAND ...
      status [NAME] [--json]      every supervised process: name, state, pid, restarts, uptime,
                                  last exit (code/signal/reason/time)
      start|stop|restart NAME     waits until the process runs (or no longer runs)
      kill NAME [--signal SIG]    deliver exactly SIG (default KILL) for fault injection
      tail NAME [-n N]            the last N lines of logs/NAME.log (`supervisor` = the agent)
      reload                      like SIGHUP
      shutdown [--pods | --node]  stop the agent (and every pod with --pods); with --pods and
                                  no agent running, stop the pods through the runtime directly;
                                  --node: a graceful node shutdown first (Node NotReady, pods
                                  Failed in priority order; needs shutdownGracePeriod)
      pods [--json] [--wide]      the PodList of GET /pods, as a table (--wide: with pod IPs)
      events [--json] [--pod P] [--limit N]   the kept events (kubectl get events)
      logs POD [CONTAINER] [--follow] [--tail N]   a container's log (read from
                                  rootDir/pod-logs; works while the agent is down)
      ops-password                the ops port's HTTP Basic password (user opsUsername)
      fault inject KIND TARGET [...] [--for DURATION] | fault list | fault clear [ID]
                                  inject and clear faults: bus, cri, api, kill, stop
                                  (ctl_fault.py)
      images [--json]             the runtime's images (ctl_images.py); `images pull REF
                                  [--creds USER:PASSWORD]`, `images rm REF...`,
                                  `images load FILE` (OCI archive or docker-archive)

Exit codes: 0 success; 1 the agent answered with a fault (`podvisorctl: NAME(code): message` on
stderr); 2 the agent is not running or did not answer in time, or bad usage. `shutdown --pods`
with no agent: 0 every pod stopped, 1 some could not be, 2 no rootDir or a silent agent holds it.
`--json` prints the command's result object as JSON on stdout (documented in ARCHITECTURE.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from podvisor.cli.ctl_fault import add_fault_parser, fault_args, format_faults
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.control import (
    AgentNotRunning,
    ControlClient,
    ControlFault,
    endpoint_for_root,
    status_rows,
)

__all__ = ["format_status", "main"]

DEFAULT_ROOT = "/var/lib/podvisor"
WAITING_COMMANDS = {"start", "stop", "restart", "shutdown", "reload"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="podvisorctl", description="control a podvisor agent")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--root-dir", default=None, help="the agent's rootDir")
    where.add_argument("--endpoint", default=None,
                       help="control endpoint URL (ipc:// or tcp://), or a remote agent's ops "
                            "port (http(s)://HOST:PORT, with --credentials)")
    p.add_argument("--credentials", default=None,
                   help="with an http(s) endpoint: a file holding user:password (or a password)")
    p.add_argument("--cacert", default=None, help="with an https endpoint: the CA to trust")
    p.add_argument("--timeout", type=float, default=None, help="seconds to wait for a reply")
    sub = p.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("status", help="list supervised processes")
    st.add_argument("name", nargs="?")
    st.add_argument("--json", action="store_true")
    for name in ("start", "stop", "restart"):
        c = sub.add_parser(name, help=f"{name} a process")
        c.add_argument("name")
        c.add_argument("--json", action="store_true")
    k = sub.add_parser("kill", help="send a signal to a process")
    k.add_argument("name")
    k.add_argument("--signal", "-s", default="KILL")
    k.add_argument("--json", action="store_true")
    t = sub.add_parser("tail", help="last lines of a process log")
    t.add_argument("name")
    t.add_argument("-n", "--lines", type=int, default=20)
    t.add_argument("--json", action="store_true")
    sh = sub.add_parser("shutdown", help="stop the agent")
    how = sh.add_mutually_exclusive_group()
    how.add_argument("--pods", action="store_true", help="stop every pod too")
    how.add_argument("--node", action="store_true",
                     help="graceful node shutdown: pods Failed in priority order, Node NotReady")
    sub.add_parser("reload", help="re-read the config file")
    pods = sub.add_parser("pods")
    pods.add_argument("--json", action="store_true")
    pods.add_argument("--wide", action="store_true",
                      help="add the IP column (kubectl get pods -o wide)")
    ev = sub.add_parser("events", help="events (last 1000, oldest first)")
    ev.add_argument("--json", action="store_true")
    ev.add_argument("--pod", default=None, help="only this pod's (name or namespace/name)")
    ev.add_argument("--limit", type=int, default=None, help="only the last N")
    top = sub.add_parser("top", help="per-pod CPU and memory (kubectl top pod)")
    top.add_argument("--json", action="store_true")
    lg = sub.add_parser("logs", help="container logs")
    lg.add_argument("pod")
    lg.add_argument("container", nargs="?")
    lg.add_argument("--follow", "-f", action="store_true")
    lg.add_argument("--tail", type=int, default=None)
    ex = sub.add_parser("exec", help="run a command in a container (exec POD -- CMD...)")
    ex.add_argument("pod")
    ex.add_argument("exec_cmd", nargs="*", metavar="CMD")
    ex.add_argument("-n", "--namespace", default="default")
    ex.add_argument("-c", "--container", default=None)
    ex.add_argument("-i", "--stdin", action="store_true", help="pass this stdin to the command")
    ex.add_argument("-t", "--tty", action="store_true",
                    help="a TTY (raw mode and window size when stdin is a terminal)")
    sub.add_parser("ops-password", help="print the ops port's password (user opsUsername)")
    add_fault_parser(sub)
    im = sub.add_parser("images", help="the runtime's images (pull REF, rm REF...)")
    im.add_argument("action", nargs="?", choices=("pull", "rm", "load"))
    im.add_argument("refs", nargs="*")
    im.add_argument("--json", action="store_true")
    im.add_argument("--creds", default=None, help="USER:PASSWORD for the registry (pull)")
    return p


def _ago(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    secs = max(0, int(now - ts))
    return f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}"


def format_status(result: dict[str, Any], now: float | None = None) -> str:
    """The human table of `status`."""
    now = SYSTEM_CLOCK.wall() if now is None else now
    rows = [("NAME", "STATE", "PID", "RESTARTS", "UPTIME", "LAST EXIT")]
    for p in status_rows(result):
        last = p.last_exit
        last_text = "-" if not last else f"{last.reason} ({_ago(last.time, now)} ago)"
        uptime = "-" if p.uptime is None else _ago(now - p.uptime, now)
        rows.append((p.name, p.state.name, str(p.pid or "-"), str(p.restarts), uptime,
                     last_text))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5]
        for r in rows
    )


def _args_for(ns: argparse.Namespace) -> dict[str, Any]:
    cmd = ns.cmd
    if cmd == "status":
        return {"name": ns.name} if ns.name else {}
    if cmd in ("start", "stop", "restart"):
        return {"name": ns.name}
    if cmd == "kill":
        return {"name": ns.name, "signal": ns.signal}
    if cmd == "tail":
        return {"name": ns.name, "lines": ns.lines}
    if cmd == "shutdown":
        return {"node": True} if ns.node else {"pods": ns.pods}
    if cmd == "events":
        args = {"pod": ns.pod, "limit": ns.limit}
        return {k: v for k, v in args.items() if v is not None}
    return {}


def _print(ns: argparse.Namespace, result: Any) -> None:
    if getattr(ns, "json", False):
        print(json.dumps(result, indent=2, sort_keys=True))
    elif ns.cmd == "status":
        print(format_status(result))
    elif ns.cmd == "tail":
        print("\n".join(result["lines"]))
    elif ns.cmd in ("start", "stop", "restart", "kill"):
        print(f"{result['name']}: {result['state']} (pid {result['pid'] or '-'})")
    elif ns.cmd == "reload":
        print("\n".join(result["changes"]) or "no changes")
    elif ns.cmd == "shutdown":
        print("shutting down")
    elif ns.cmd == "fault":
        print(format_faults(ns.fault_cmd, result))
    elif ns.cmd == "events":
        from podvisor.cli.ctl_logs import format_events

        print(format_events(result))
    else:
        print(json.dumps(result, indent=2, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "exec" in args and "--" in args[args.index("exec"):]:  # exec POD [opts] -- CMD...
        cut = args.index("--", args.index("exec"))
        args, command = args[:cut], args[cut + 1:]
    ns = _parser().parse_args(args)
    if ns.cmd == "exec":
        ns.exec_cmd = [*ns.exec_cmd, *command]
    if ns.cmd == "pods":  # served by the pleg/status/server engineer's module
        from podvisor.cli.ctl_pods import main_pods

        root = ns.root_dir or os.environ.get("PODVISOR_ROOT_DIR", DEFAULT_ROOT)
        return main_pods(root, ns.json, ns.timeout or 5.0, ns.wide)
    if ns.endpoint and ns.endpoint.startswith(("http://", "https://")):
        from podvisor.cli.ctl_remote import main_remote

        return main_remote(ns)
    if ns.cmd == "ops-password":  # read from the rootDir by this process
        from podvisor.cli.ctl_ops import main_ops_password

        return main_ops_password(ns.root_dir or os.environ.get("PODVISOR_ROOT_DIR",
                                                               DEFAULT_ROOT))
    if ns.cmd == "logs":  # read from rootDir/pod-logs by this process
        from podvisor.cli.ctl_logs import main_logs

        root = ns.root_dir or os.environ.get("PODVISOR_ROOT_DIR", DEFAULT_ROOT)
        return main_logs(root, ns.pod, ns.container, ns.follow, ns.tail)
    if ns.cmd == "images":  # through CRI on the agent's runtime
        from podvisor.cli.ctl_images import main_images

        if ns.action is not None and not ns.refs:
            what = "a file" if ns.action == "load" else "an image reference"
            print(f"podvisorctl: images {ns.action} needs {what}", file=sys.stderr)
            return 2
        if ns.action is None and ns.refs:
            print("podvisorctl: images takes no reference (images pull|rm REF)",
                  file=sys.stderr)
            return 2
        root = ns.root_dir or os.environ.get("PODVISOR_ROOT_DIR", DEFAULT_ROOT)
        return main_images(root, ns.action, ns.refs, ns.json, ns.creds, ns.timeout)
    if ns.cmd == "exec":  # CRI Exec on the agent's runtime, then its streaming server
        from podvisor.cli.ctl_exec import main_exec

        root = ns.root_dir or os.environ.get("PODVISOR_ROOT_DIR", DEFAULT_ROOT)
        return main_exec(root, ns.pod, ns.namespace, ns.container, ns.stdin, ns.tty,
                         ns.exec_cmd, ns.timeout or 10.0)
    if ns.cmd == "top":  # asks the runtime (CRI) directly
        from podvisor.cli.ctl_top import main_top

        root = ns.root_dir or os.environ.get("PODVISOR_ROOT_DIR", DEFAULT_ROOT)
        return main_top(root, ns.json, ns.timeout or 10.0)
    endpoint = ns.endpoint or endpoint_for_root(
        ns.root_dir or os.environ.get("PODVISOR_ROOT_DIR", DEFAULT_ROOT))
    timeout = ns.timeout if ns.timeout is not None else (
        120.0 if ns.cmd in WAITING_COMMANDS else 5.0)
    client = ControlClient(endpoint, timeout=timeout)
    name, call_args = ns.cmd, _args_for(ns)
    if ns.cmd == "fault":
        try:
            name, call_args = fault_args(ns)
        except ValueError as exc:
            print(f"podvisorctl: {exc}", file=sys.stderr)
            return 2
    try:
        result = client.call(name, **call_args)
    except AgentNotRunning as exc:
        if ns.cmd == "shutdown" and ns.pods and ns.endpoint is None:
            from podvisor.cli.ctl_stoppods import main_stop_pods

            return main_stop_pods(ns.root_dir or os.environ.get("PODVISOR_ROOT_DIR",
                                                                DEFAULT_ROOT))
        print(f"podvisorctl: {exc}", file=sys.stderr)
        return 2
    except ControlFault as exc:
        print(f"podvisorctl: {exc.fault.name}({int(exc.fault)}): {exc.message}", file=sys.stderr)
        return 1
    _print(ns, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
