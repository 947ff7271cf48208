"""Readers for probes and lifecycle handlers (part of ``parse``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from podvisor.services.pod import policy
from podvisor.services.pod.container import (
    ExecAction,
    GRPCAction,
    HTTPGetAction,
    HTTPHeader,
    Lifecycle,
    LifecycleHandler,
    Probe,
    ProbeHandler,
    SleepAction,
    TCPSocketAction,
    URIScheme,
)
from podvisor.services.pod.fields import (
    Findings,
    as_map,
    check_fields,
    get_enum,
    get_int,
    get_list,
    get_opt_int,
    get_str,
    get_str_list,
    join,
)

PROBE_HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")
LIFECYCLE_HANDLERS = ("exec", "httpGet", "tcpSocket", "sleep")


def parse_probe(f: Findings, raw: Any, path: str, port_names: Collection[str],
                readiness: bool) -> Probe | None:
    m = as_map(f, raw, path)
    if m is None:
        return None
    check_fields(f, m, path, policy.PROBE_KNOWN, {})
    handler = parse_handler(f, m, path, PROBE_HANDLERS, port_names)
    success = get_int(f, m, "successThreshold", path, 1, minimum=1)
    if not readiness and success != 1:
        f.error(join(path, "successThreshold"), "must be 1 for liveness and startup probes")
    grace = get_opt_int(f, m, "terminationGracePeriodSeconds", path, minimum=1)
    if readiness and grace is not None:
        f.error(join(path, "terminationGracePeriodSeconds"),
                "must not be set for readiness probes")
    initial_delay = get_int(f, m, "initialDelaySeconds", path, 0, minimum=0)
    period = get_int(f, m, "periodSeconds", path, 10, minimum=1)
    timeout = get_int(f, m, "timeoutSeconds", path, 1, minimum=1)
    failure = get_int(f, m, "failureThreshold", path, 3, minimum=1)
    if handler is None or isinstance(handler, SleepAction):
        return None
    return Probe(handler=handler, initial_delay_seconds=initial_delay, period_seconds=period,
                 timeout_seconds=timeout, success_threshold=success,
                 failure_threshold=failure, termination_grace_period_seconds=grace)


def parse_lifecycle(f: Findings, raw: Any, path: str, port_names: Collection[str]) -> Lifecycle:
    m = as_map(f, raw, path)
    if m is None:
        return Lifecycle()
    check_fields(f, m, path, policy.LIFECYCLE_KNOWN, policy.LIFECYCLE_UNSUPPORTED)
    return Lifecycle(pre_stop=_lifecycle_handler(f, m, "preStop", path, port_names),
                     post_start=_lifecycle_handler(f, m, "postStart", path, port_names),
                     stop_signal=parse_stop_signal(f, m, path))


def _lifecycle_handler(f: Findings, m: Mapping[str, Any], key: str, path: str,
                       port_names: Collection[str]) -> LifecycleHandler | None:
    """``preStop`` or ``postStart``: exec, httpGet, sleep, or tcpSocket, which the API server
    takes (validated as a probe's) and the kubelet's handler runner fails when the hook runs
    (syncloop/hooks.py)."""
    if m.get(key) is None:
        return None
    where = join(path, key)
    body = as_map(f, m[key], where)
    if body is None:
        return None
    check_fields(f, body, where, policy.PRE_STOP_KNOWN,
                 policy.PRE_STOP_UNSUPPORTED if key == "preStop" else policy.POST_START_UNSUPPORTED)
    handler = parse_handler(f, body, where, LIFECYCLE_HANDLERS, port_names)
    if handler is None or isinstance(handler, GRPCAction):
        return None
    return handler


# The API server's supportedStopSignalsLinux: the Linux signals by name, and the real-time
# ones as SIGRTMIN+n / SIGRTMAX-n.
STOP_SIGNALS = frozenset((
    "SIGABRT", "SIGALRM", "SIGBUS", "SIGCHLD", "SIGCLD", "SIGCONT", "SIGFPE", "SIGHUP",
    "SIGILL", "SIGINT", "SIGIO", "SIGIOT", "SIGKILL", "SIGPIPE", "SIGPOLL", "SIGPROF", "SIGPWR",
    "SIGQUIT", "SIGSEGV", "SIGSTKFLT", "SIGSTOP", "SIGSYS", "SIGTERM", "SIGTRAP", "SIGTSTP",
    "SIGTTIN", "SIGTTOU", "SIGURG", "SIGUSR1", "SIGUSR2", "SIGVTALRM", "SIGWINCH", "SIGXCPU",
    "SIGXFSZ", "SIGRTMIN", "SIGRTMAX",
    *(f"SIGRTMIN+{n}" for n in range(1, 16)), *(f"SIGRTMAX-{n}" for n in range(1, 15))))


def parse_stop_signal(f: Findings, m: Mapping[str, Any], path: str) -> str:
    """``lifecycle.stopSignal``: one of the Linux signals the API server accepts."""
    value = get_str(f, m, "stopSignal", path)
    if value and value not in STOP_SIGNALS:
        f.error(join(path, "stopSignal"), f"Unsupported value: {value!r}: supported values: "
                                          "the Linux signal names (SIGTERM, SIGRTMIN+1, ...)")
        return ""
    return value


def parse_handler(f: Findings, m: Mapping[str, Any], path: str, kinds: tuple[str, ...],
                  port_names: Collection[str]) -> ProbeHandler | SleepAction | None:
    present = [k for k in kinds if m.get(k) is not None]
    if not present:
        f.error(path, f"must specify a handler (one of {', '.join(kinds)})")
        return None
    if len(present) > 1:
        f.error(path, f"must specify only one handler, found {' and '.join(present)}")
        return None
    kind = present[0]
    where = join(path, kind)
    body = as_map(f, m[kind], where)
    if body is None:
        return None
    check_fields(f, body, where, policy.HANDLER_KNOWN[kind], {})
    if kind == "exec":
        command = get_str_list(f, body, "command", where)
        if not command:
            f.error(join(where, "command"), "required")
        return ExecAction(command)
    if kind == "httpGet":
        return _parse_http_get(f, body, where, port_names)
    if kind == "tcpSocket":
        return TCPSocketAction(port=_parse_port(f, body, where, port_names),
                               host=get_str(f, body, "host", where))
    if kind == "grpc":
        port = get_opt_int(f, body, "port", where, minimum=1, maximum=65535, required=True)
        return GRPCAction(port=port or 0, service=get_str(f, body, "service", where))
    return SleepAction(get_int(f, body, "seconds", where, 0, minimum=0))


def _parse_http_get(f: Findings, body: Mapping[str, Any], where: str,
                    port_names: Collection[str]) -> HTTPGetAction:
    headers: list[HTTPHeader] = []
    for item_path, item in get_list(f, body, "httpHeaders", where):
        header = as_map(f, item, item_path)
        if header is not None:
            check_fields(f, header, item_path, ("name", "value"), {})
            headers.append(HTTPHeader(get_str(f, header, "name", item_path, required=True),
                                      get_str(f, header, "value", item_path)))
    path = get_str(f, body, "path", where, default="/") or "/"
    return HTTPGetAction(
        port=_parse_port(f, body, where, port_names),
        path=path,
        host=get_str(f, body, "host", where),
        scheme=get_enum(f, body, "scheme", where, URIScheme, URIScheme.HTTP),
        http_headers=tuple(headers),
    )


def _parse_port(f: Findings, body: Mapping[str, Any], where: str,
                port_names: Collection[str]) -> int | str:
    value = body.get("port")
    field = join(where, "port")
    if isinstance(value, str):
        if value not in port_names:
            f.error(field, f"no container port named {value!r}")
        return value
    port = get_opt_int(f, body, "port", where, minimum=1, maximum=65535, required=True)
    return port or 0
