"""A container's ``postStart`` and ``preStop`` hooks, as the kubelet's
``lifecycle.handlerRunner`` runs them.

postStart is run by SyncPod right after StartContainer, on the pod worker's thread (the next
container of the pod starts only after it returns, as in the kubelet's ``startContainer``);
preStop by ``terminate.stop_container`` before the container's signal, within its grace:

- ``exec``: ``ExecSync`` in the container with no timeout; a non-zero exit fails it;
- ``httpGet``: a GET to ``host`` (default: the pod's IP) on the port (a number or one of the
  container's port names) with the headers; HTTPS is not verified; only a failure to get an
  answer fails the hook (the kubelet does not look at the status code);
- ``sleep``: waits that long;
- ``tcpSocket``: which the API server takes in a hook, the kubelet's runner does not run: its
  default branch fails the hook with ``Cannot run handler: invalid handler: <the handler as
  Go's %v prints it>`` (``invalid_handler``), so a postStart fails (FailedPostStartHook, the
  container killed) and a preStop fails (FailedPreStopHook, the stop goes on) every time.

``run_hook`` returns None on success, else the kubelet's message (``Exec lifecycle hook
([cmd]) for Container "c" in Pod "p_ns(uid)" failed - error: ..., message: "..."``); the
caller then kills the container (``FailedPostStartHook``).
"""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from podvisor.services.cri import CriError, RuntimeClient
from podvisor.services.pod import (
    Container,
    ContainerPort,
    ExecAction,
    HTTPGetAction,
    LifecycleHandler,
    Pod,
    SleepAction,
    TCPSocketAction,
    URIScheme,
)

HTTP_HOOK_TIMEOUT = 60.0  # the kubelet's client has none; a hook that hangs must not stall


@dataclass(frozen=True)
class HookTarget:
    """The container a hook runs for, as its messages name it: the pod (the kubelet's
    ``format.Pod``, ``<name>_<namespace>(<uid>)``), the container's name, and its ports (an
    httpGet hook's named port). From the spec (``of``), or, for a container whose spec is
    gone, from what was recorded on it (the kubelet's ``restoreSpecsFromContainerLabels``)."""

    pod_ref: str
    container: str
    ports: tuple[ContainerPort, ...] = ()

    @classmethod
    def of(cls, pod: Pod, c: Container) -> HookTarget:
        return cls(f"{pod.full_name}({pod.uid})", c.name, c.ports)


def _exec(cri: RuntimeClient, cid: str, t: HookTarget, hook: ExecAction,
          timeout: float = 0) -> str | None:
    cmd = list(hook.command)
    try:
        resp = cri.exec_sync(cid, cmd, timeout)
    except CriError as err:
        error, output = err.message, ""
    else:
        if resp.exit_code == 0:
            return None
        error = (f"command '{' '.join(cmd)}' exited with {resp.exit_code}: "
                 f"{resp.stderr.decode(errors='replace')}")
        output = (resp.stdout + resp.stderr).decode(errors="replace")
    return (f"Exec lifecycle hook ([{' '.join(cmd)}]) for Container \"{t.container}\" in Pod "
            f"\"{t.pod_ref}\" failed - error: {error}, message: \"{output}\"")


def _port(t: HookTarget, port: int | str) -> int:
    if isinstance(port, int):
        return port
    for p in t.ports:
        if p.name == port:
            return p.container_port
    raise ValueError(f"unable to find port {port!r} in container {t.container}")


def _http(t: HookTarget, hook: HTTPGetAction, pod_ips: Sequence[str],
          timeout: float = HTTP_HOOK_TIMEOUT) -> str | None:
    try:
        host = hook.host or (pod_ips[0] if pod_ips else "127.0.0.1")
        port = _port(t, hook.port)
        conn: http.client.HTTPConnection
        if hook.scheme is URIScheme.HTTPS:
            conn = http.client.HTTPSConnection(host, port, timeout=timeout,
                                               context=ssl._create_unverified_context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            headers = {h.name: h.value for h in hook.http_headers}
            headers.setdefault("User-Agent", "kube-lifecycle/1.33")
            conn.request("GET", hook.path or "/", headers=headers)
            conn.getresponse().read()
        finally:
            conn.close()
    except (OSError, ValueError, http.client.HTTPException) as err:
        return (f"HTTP lifecycle hook ({hook.path}) for Container \"{t.container}\" in Pod "
                f"\"{t.pod_ref}\" failed - error: {err}")
    return None


def _go_int_or_string(port: int | str) -> str:
    """Go's ``%v`` of an ``intstr.IntOrString`` value: ``{Type IntVal StrVal}``."""
    return f"{{0 {port} }}" if isinstance(port, int) else f"{{1 0 {port}}}"


def invalid_handler(hook: TCPSocketAction) -> str:
    """The kubelet's message for a handler its runner has no branch for (``handlers.go``:
    ``fmt.Errorf("invalid handler: %v", handler)`` wrapped in ``Cannot run handler: %v``;
    ``%v`` of a ``*v1.LifecycleHandler`` is its generated ``String()``)."""
    tcp = f"&TCPSocketAction{{Port:{_go_int_or_string(hook.port)},Host:{hook.host},}}"
    return ("Cannot run handler: invalid handler: "
            f"&LifecycleHandler{{Exec:nil,HTTPGet:nil,TCPSocket:{tcp},Sleep:nil,}}")


def run_hook(cri: RuntimeClient, cid: str, t: HookTarget, hook: LifecycleHandler,
             pod_ips: Callable[[], Sequence[str]], sleep: Callable[[float], None],
             limit: float | None = None) -> str | None:
    """Run ``hook`` for container ``t`` (runtime ID ``cid``); None when it succeeded, else
    the kubelet's failure message. ``pod_ips`` is asked only by an httpGet without a host.
    ``limit``: seconds the hook may take (a preStop: what is left of the grace; None: a
    postStart, with no limit but the HTTP client's)."""
    if isinstance(hook, ExecAction):
        return _exec(cri, cid, t, hook, max(1.0, limit) if limit is not None else 0)
    if isinstance(hook, HTTPGetAction):
        timeout = HTTP_HOOK_TIMEOUT if limit is None else max(1.0, min(limit, HTTP_HOOK_TIMEOUT))
        return _http(t, hook, pod_ips() if not hook.host else (), timeout)
    if isinstance(hook, TCPSocketAction):
        return invalid_handler(hook)
    if isinstance(hook, SleepAction):
        sleep(float(hook.seconds) if limit is None else min(float(hook.seconds), limit))
    return None
