"""The httpGet probe, as the kubelet's (``pkg/probe/http``):

- GET with ``User-Agent: kube-probe/podvisor``, ``Accept: */*`` and ``Connection: close`` (no
  keep-alive: one connection per request); the probe's ``httpHeaders`` override them (a
  ``Host`` header sets the virtual host).
- Success = status 200-399. Redirects (301/302/303/307/308 with a Location) are followed only to
  the same host name, at most 10; the 11th is a failure. A redirect to another host is not
  followed: its 3xx answer is the result (success, with a message), as the kubelet does.
- At most 10 KB of a body is read; the rest is never read.
- HTTPS does not verify the certificate (as the kubelet).
- The whole probe, redirects included, must finish within the timeout; sockets close with
  SO_LINGER 0 (no TIME_WAIT pile-up, kubernetes #89898).
"""

from __future__ import annotations

import http.client
import ssl
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.pod import HTTPGetAction, URIScheme
from podvisor.services.prober.outcome import Outcome, set_linger_zero
from podvisor.services.prober.worker import Result

MAX_REDIRECTS = 10
MAX_BODY = 10 * 1024
USER_AGENT = "kube-probe/podvisor"
REDIRECTS = (301, 302, 303, 307, 308)


@dataclass(frozen=True)
class Reply:
    status: int
    location: str
    body: bytes


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _headers(action: HTTPGetAction) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT, "Accept": "*/*"}
    for h in action.http_headers:
        canon = next((k for k in headers if k.lower() == h.name.lower()), h.name)
        headers[canon] = h.value
    headers["Connection"] = "close"
    return headers


def _request(url: str, headers: dict[str, str], timeout: float) -> Reply:
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.connect()
        if conn.sock is not None:
            set_linger_zero(conn.sock)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        conn.putrequest("GET", target, skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        resp = conn.getresponse()
        body = resp.read(MAX_BODY)
        return Reply(resp.status, resp.getheader("Location") or "", body)
    finally:
        conn.close()


def http_get(action: HTTPGetAction, default_host: str, port: int, timeout: float) -> Outcome:
    host = action.host or default_host
    scheme = "https" if action.scheme is URIScheme.HTTPS else "http"
    path = action.path if action.path.startswith("/") else "/" + action.path
    url = f"{scheme}://{_authority(host, port)}{path}"
    headers = _headers(action)
    deadline = SYSTEM_CLOCK.monotonic() + timeout
    redirects = 0
    while True:
        left = deadline - SYSTEM_CLOCK.monotonic()
        if left <= 0:
            return Outcome(Result.FAILURE, f"Get {url}: timeout after {timeout:g}s")
        try:
            reply = _request(url, headers, left)
        except (OSError, http.client.HTTPException) as err:
            return Outcome(Result.FAILURE, f"Get {url}: {type(err).__name__}: {err}")
        if reply.status in REDIRECTS and reply.location:
            nxt = urljoin(url, reply.location)
            if urlsplit(nxt).hostname != urlsplit(url).hostname:
                return Outcome(Result.SUCCESS, f"Probe terminated redirects, response "
                               f"status {reply.status} (redirect to another host: {nxt})")
            if redirects >= MAX_REDIRECTS:
                return Outcome(Result.FAILURE, f"Get {nxt}: stopped after 10 redirects")
            redirects += 1
            url = nxt
            continue
        if 200 <= reply.status < 400:
            return Outcome(Result.SUCCESS)
        text = reply.body.decode(errors="replace")[:200]
        return Outcome(Result.FAILURE, f"HTTP probe failed with statuscode: {reply.status}"
                       + (f": {text}" if text else ""))
