"""The API server connection every API-facing process shares: the official ``kubernetes``
client for kubeconfig, TLS and credentials, and raw JSON in and out.

podvisor reads and writes raw JSON (``_preload_content=False`` underneath) instead of the
client's generated models: a model drops the fields it does not know, and pod objects travel
on the bus in their wire form anyway. ``ApiConnection.request`` raises ``ApiError`` for any
non-2xx answer (with the ``Status`` reason) and ``ApiUnreachable`` when no answer came.

Certificate rotation without a restart (issue 26): before every request the connection looks
at its kubeconfig and at the client certificate it names (a ``stat`` each, following the
``kubelet-client-current.pem`` symlink). A kubeconfig not written yet (TLS bootstrap pending)
is ``ApiUnreachable`` until it is there; a changed one is loaded again; a new pair behind the
symlink gets a new connection pool that opens its connections with the pair's own file (the
symlink resolved once, so a swap between reading the certificate and the key cannot mix two
pairs). Connections already open stay as they are: a watch streaming on one goes on to its
end, then resumes from its resourceVersion on the new pair (no gap, no relist). The old pool's
idle connections are closed one change later.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import urllib3

from podvisor.services.apiserver.faults import ApiFaults, GoneResponse

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException

Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
CONNECT_TIMEOUT = 5.0
REQUEST_TIMEOUT = 10.0


class ApiUnreachable(Exception):
    """No HTTP answer (connection refused/reset, TLS failure, timeout)."""


@dataclass
class ApiError(Exception):
    """A non-2xx answer: ``status`` (HTTP code), ``reason`` (Status.reason) and message."""

    status: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"


def _api_error(exc: ApiException) -> ApiError:
    reason, message = str(exc.reason or ""), ""
    try:
        body = json.loads(exc.body or "{}")
        reason = str(body.get("reason") or reason)
        message = str(body.get("message") or "")
    except (ValueError, AttributeError):
        message = str(exc.body or "")[:200]
    return ApiError(int(exc.status or 0), reason, message)


def _identity(path: str) -> tuple[int, int, int, int] | None:
    """What tells one version of a file from another (the symlink followed)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


class ApiConnection:
    """One API client built from a kubeconfig file (thread-safe: urllib3's pool; the reload
    check takes a lock). Its requests say ``User-Agent: podvisor/<component>`` (``podvisor``
    without one), as the kubelet's say ``kubelet/<version>``: the API server's audit log and
    tests tell the processes apart by it."""

    def __init__(self, kubeconfig: str, component: str = "",
                 faults: ApiFaults | None = None) -> None:
        """``faults``: the injected ``api`` faults its requests go through (``faults.py``;
        the process's loop sets them: ``loop.on_faults(conn.faults.set)``)."""
        # imported here, not with the module: the client costs ~0.5 s and ~20 MB, and every
        # process that may talk to an API server (the sync loop, the server) imports this
        # package whether or not ``kubeconfig`` is set
        from kubernetes.client.exceptions import ApiException

        self.kubeconfig = kubeconfig
        self.faults = faults or ApiFaults()
        self.user_agent = f"podvisor/{component}" if component else "podvisor"
        self._api_exception: type[ApiException] = ApiException
        self._lock = threading.Lock()
        self._api: Any = None
        self._config_id: tuple[int, int, int, int] | None = None
        self._cert_link = ""  # the client certificate path the kubeconfig names
        self._key_link = ""
        self._cert_id: tuple[int, int, int, int] | None = None
        self._retired: list[Any] = []  # rest clients replaced by a rotation
        self.requests = 0  # every request sent, for the logs and the benchmarks
        self.reloads = 0  # kubeconfig loads and pair changes after the first load
        if os.path.exists(kubeconfig):
            self._load()  # a bad kubeconfig fails here, as before
        # else: TLS bootstrap has not written it yet; requests wait for it (ApiUnreachable)

    @property
    def api(self) -> Any:
        """The current ``kubernetes.client.ApiClient``."""
        return self._current()

    @property
    def host(self) -> str:
        return str(self._current().configuration.host)

    def _load(self) -> None:
        from kubernetes import config as k8s_config

        config_id = _identity(self.kubeconfig)
        api = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=self.kubeconfig)
        api.user_agent = self.user_agent
        if self._api is not None:
            self._retire(self._api.rest_client)
            self.reloads += 1
        self._api, self._config_id = api, config_id
        self._cert_link = str(api.configuration.cert_file or "")
        self._key_link = str(api.configuration.key_file or "")
        self._cert_id = None
        if self._cert_link:
            self._pin_pair(api)

    def _pin_pair(self, api: Any) -> None:
        """A new pool on the current pair; one file holding certificate and key (the
        kubeconfig TLS bootstrap writes) is resolved behind its symlink first."""
        from kubernetes.client import rest

        cert, key = self._cert_link, self._key_link
        self._cert_id = _identity(cert)
        if key and os.path.realpath(key) == os.path.realpath(cert):
            cert = key = os.path.realpath(cert)
        api.configuration.cert_file, api.configuration.key_file = cert, key or None
        api.rest_client = rest.RESTClientObject(api.configuration)

    def _retire(self, rest_client: Any) -> None:
        for old in self._retired:  # a change ago: no request can still be picking it up
            with contextlib.suppress(Exception):
                old.pool_manager.clear()
        self._retired = [rest_client]

    def _current(self) -> Any:
        with self._lock:
            config_id = _identity(self.kubeconfig)
            if config_id is None:
                if self._api is None:
                    raise ApiUnreachable(f"kubeconfig {self.kubeconfig} does not exist (yet: "
                                         "TLS bootstrap writes it)")
            elif self._api is None or config_id != self._config_id:
                try:
                    self._load()
                except Exception as exc:  # the loader's errors are many; the file may be new
                    if self._api is None:
                        raise ApiUnreachable(f"cannot load kubeconfig {self.kubeconfig}: "
                                             f"{exc}") from None
            elif self._cert_link and _identity(self._cert_link) != self._cert_id:
                self._retire(self._api.rest_client)
                self._pin_pair(self._api)
                self.reloads += 1
            return self._api

    def _send(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
              body: Any = None, content_type: str = "",
              timeout: float | tuple[float, float] = REQUEST_TIMEOUT) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        injected = self.faults.before(method, path)
        if injected is not None:
            self.requests += 1
            raise ApiError(*injected)
        api = self._current()
        method_, url, headers_, body_, post = api.param_serialize(
            method=method, resource_path=path, query_params=params, header_params=headers,
            body=body, auth_settings=["BearerToken"])
        self.requests += 1
        try:
            answer = api.call_api(method_, url, headers_, body_, post,
                                  _request_timeout=timeout)
        except self._api_exception as exc:
            if exc.status:
                raise _api_error(exc) from None
            raise ApiUnreachable(str(exc.reason)) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiUnreachable(str(exc)) from None
        if not 200 <= answer.status <= 299:
            answer.read()
            raise _api_error(self._api_exception(http_resp=answer))
        return answer

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Any = None, content_type: str = "",
                timeout: float = REQUEST_TIMEOUT) -> Obj:
        answer = self._send(method, path, query=query, body=body, content_type=content_type,
                            timeout=(CONNECT_TIMEOUT, timeout))
        try:
            data = answer.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiUnreachable(str(exc)) from None
        try:
            out = json.loads(data or b"{}")
        except ValueError as exc:
            raise ApiError(answer.status, "BadResponse", f"not JSON: {exc}") from None
        return out if isinstance(out, dict) else {}

    def watch(self, path: str, query: Mapping[str, Any], read_timeout: float) -> WatchStream:
        """Open a watch (``watch=1`` added); iterate the returned stream for event dicts."""
        cut = self.faults.watch_cut()
        if cut is not None:
            raise ApiUnreachable(cut)
        if self.faults.gone(path):
            return WatchStream(GoneResponse())  # type: ignore[arg-type]
        answer = self._send("GET", path, query={**query, "watch": "1"},
                            timeout=(CONNECT_TIMEOUT, read_timeout))
        stream = WatchStream(answer.response)
        self.faults.opened(stream)
        return stream

    def close(self) -> None:
        with self._lock:
            if self._api is not None:
                self._api.close()
            for old in self._retired:
                with contextlib.suppress(Exception):
                    old.pool_manager.clear()
            self._retired = []


class WatchStream:
    """The events of one watch response, one JSON object per line; ``close()`` from any
    thread ends the iteration."""

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self._response = response

    def __iter__(self) -> Iterator[Obj]:
        buffer = b""
        try:
            for chunk in self._response.stream(64 * 1024, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield _event(line)
            if buffer.strip():
                yield _event(buffer)
        except (urllib3.exceptions.HTTPError, OSError, AttributeError) as exc:
            raise ApiUnreachable(f"watch cut: {exc}") from None

    def close(self) -> None:
        """Ends the iteration at once, even while another thread is blocked reading: the
        socket is shut down first (closing alone would wait for that reader's lock)."""
        conn = getattr(self._response, "connection", None)
        sock = getattr(conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        try:
            self._response.release_conn()
            self._response.close()
        except (OSError, AttributeError):
            pass


def _event(line: bytes) -> Obj:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise ApiUnreachable(f"watch sent a line that is not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise ApiUnreachable("watch sent a line that is not an object")
    return event
