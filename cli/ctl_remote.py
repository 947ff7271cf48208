"""`podvisorctl --endpoint http(s)://HOST:PORT --credentials FILE ...`: a remote agent over its
ops port (supervisord's XML-RPC at /RPC2), for the commands XML-RPC covers.

`--credentials FILE`: one line `user:password`, or a bare password (user `admin`), e.g. the
agent's `rootDir/ops-password` copied over. `--cacert FILE` verifies an HTTPS port against that
CA (else the system's). Process names: a bare NAME is the subsystem `agent:NAME`; `group:name`
names a pod's container. Commands: status, start, stop, restart, kill, tail, reload, shutdown
(without --pods); the others exit 2 saying so. Faults print `podvisorctl: NAME(code): message`
and exit 1; an unreachable port or a refused login exit 2.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import urllib.parse
import xmlrpc.client
from pathlib import Path
from typing import Any

from podvisor.common.opspass import read_credentials
from podvisor.ipc.control import ProcessState

__all__ = ["main_remote", "read_credentials"]

REMOTE_COMMANDS = {"status", "start", "stop", "restart", "kill", "tail", "reload", "shutdown"}


def _proxy(endpoint: str, creds: tuple[str, str], cacert: str | None,
           timeout: float) -> Any:
    url = urllib.parse.urlsplit(endpoint)
    quote = urllib.parse.quote
    netloc = f"{quote(creds[0], safe='')}:{quote(creds[1], safe='')}@{url.netloc}"
    full = urllib.parse.urlunsplit((url.scheme, netloc, "/RPC2", "", ""))
    if url.scheme == "https":
        ctx = ssl.create_default_context(cafile=cacert)
        transport: xmlrpc.client.Transport = xmlrpc.client.SafeTransport(context=ctx)
    else:
        transport = xmlrpc.client.Transport()
    transport.timeout = timeout  # type: ignore[attr-defined]
    return xmlrpc.client.ServerProxy(full, transport=transport)


def _spec(name: str) -> str:
    return name if ":" in name else f"agent:{name}"


def _state_name(info: dict[str, Any]) -> str:
    try:
        return ProcessState(info["state"]).name
    except ValueError:
        return str(info["statename"])


def _row(info: dict[str, Any]) -> str:
    spec = f"{info['group']}:{info['name']}"
    return f"{spec:<40} {info['statename']:<10} {info['description']}"


def _run(rpc: Any, ns: argparse.Namespace) -> Any:
    sup = rpc.supervisor
    cmd = ns.cmd
    if cmd == "status":
        return [sup.getProcessInfo(_spec(ns.name))] if ns.name else sup.getAllProcessInfo()
    if cmd == "start":
        sup.startProcess(_spec(ns.name))
    elif cmd == "stop":
        sup.stopProcess(_spec(ns.name))
    elif cmd == "restart":
        spec = _spec(ns.name)
        if sup.getProcessInfo(spec)["state"] in (ProcessState.STARTING, ProcessState.RUNNING,
                                                  ProcessState.BACKOFF):
            sup.stopProcess(spec)
        if spec.startswith("agent:"):
            sup.startProcess(spec)
    elif cmd == "kill":
        sup.signalProcess(_spec(ns.name), str(ns.signal))
    elif cmd == "tail":
        text = sup.readProcessStdoutLog(_spec(ns.name), -65536, 0)
        return {"name": ns.name, "lines": text.splitlines()[-ns.lines:] if ns.lines else []}
    elif cmd == "reload":
        return {"changes": sup.reloadConfig()[0][1]}
    elif cmd == "shutdown":
        sup.shutdown()
        return {"shutdown": True}
    return sup.getProcessInfo(_spec(ns.name))


def main_remote(ns: argparse.Namespace) -> int:
    if ns.cmd not in REMOTE_COMMANDS or (ns.cmd == "shutdown" and ns.pods):
        print(f"podvisorctl: {ns.cmd}{' --pods' if getattr(ns, 'pods', False) else ''} is not "
              "available over the ops port; use --root-dir on the node", file=sys.stderr)
        return 2
    if not ns.credentials:
        print("podvisorctl: --credentials FILE is required with an http(s) endpoint",
              file=sys.stderr)
        return 2
    try:
        creds = read_credentials(Path(ns.credentials))
    except (OSError, ValueError) as exc:
        print(f"podvisorctl: cannot read the credentials: {exc}", file=sys.stderr)
        return 2
    rpc = _proxy(ns.endpoint, creds, ns.cacert, ns.timeout or 120.0)
    try:
        result = _run(rpc, ns)
    except xmlrpc.client.Fault as fault:
        name, _, detail = fault.faultString.partition(": ")
        print(f"podvisorctl: {name}({fault.faultCode}): {detail}", file=sys.stderr)
        return 1
    except xmlrpc.client.ProtocolError as err:
        why = "wrong credentials" if err.errcode == 401 else f"HTTP {err.errcode}"
        print(f"podvisorctl: {ns.endpoint} refused: {why}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"podvisorctl: cannot reach {ns.endpoint}: {exc}", file=sys.stderr)
        return 2
    if getattr(ns, "json", False):
        print(json.dumps(result, indent=2, sort_keys=True))
    elif ns.cmd == "status":
        print(f"{'NAME':<40} {'STATE':<10} DESCRIPTION")
        print("\n".join(_row(i) for i in result))
    elif ns.cmd == "tail":
        print("\n".join(result["lines"]))
    elif ns.cmd in ("start", "stop", "restart", "kill"):
        print(f"{_spec(ns.name)}: {_state_name(result)} (pid {result['pid'] or '-'})")
    elif ns.cmd == "reload":
        print("\n".join(result["changes"]) or "no changes")
    else:
        print("shutting down")
    return 0
