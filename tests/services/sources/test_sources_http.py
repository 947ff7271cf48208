"""HTTP source against a real http.server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from podvisor.services.sources.http_source import HttpSource
from podvisor.services.sources.httpfetch import FetchError, fetch, flatten_headers

NODE = "node-h"
MiB = 1024 * 1024


def pod(name: str, image: str | None = "host") -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c"}
    if image is not None:
        container["image"] = image
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container]}}


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_length: bool = True
    hold: threading.Event | None = None


@dataclass
class Server:
    url: str
    reply: Reply = field(default_factory=Reply)
    requests: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests.append(dict(self.headers.items()))
            reply = state.reply
            if reply.hold is not None:
                reply.hold.wait(10)
            self.send_response(reply.status)
            if reply.content_length:
                self.send_header("Content-Length", str(len(reply.body)))
            else:
                self.send_header("Connection", "close")
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(reply.body)
            if not reply.content_length:
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/pods"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


def source_for(server: Server, session: requests.Session,
               headers: dict[str, list[str] | str] | None = None) -> HttpSource:
    flat = flatten_headers(headers or {})
    return HttpSource(server.url, NODE, 20.0, lambda: fetch(session, server.url, flat),
                      wall=lambda: 1_700_000_000.0)


def test_single_pod(server: Server, session: requests.Session) -> None:
    server.reply = Reply(body=json.dumps(pod("web")).encode())
    result = source_for(server, session).refresh()
    assert result is not None and result.source == "http"
    (p,) = result.pods
    assert p.name == f"web-{NODE}"
    assert p.metadata.annotations["kubernetes.io/config.source"] == "http"
    assert p.origin is not None and p.origin.location == server.url
    msg = result.to_value(0.0)
    assert msg.source == "http" and msg.errors == []


def test_pod_list_with_a_bad_item(server: Server, session: requests.Session) -> None:
    body = {"apiVersion": "v1", "kind": "PodList",
            "items": [pod("a"), pod("b", image=None), pod("c")]}
    server.reply = Reply(body=json.dumps(body).encode())
    result = source_for(server, session).refresh()
    assert result is not None
    assert [p.name for p in result.pods] == [f"a-{NODE}", f"c-{NODE}"]
    (error,) = result.errors
    assert (error.location, error.field, error.reason) == (
        server.url, "items[1].spec.containers[0].image", "required")
    assert result.to_value(0.0).errors[0]["url"] == server.url


def test_yaml_body(server: Server, session: requests.Session) -> None:
    server.reply = Reply(body=b"apiVersion: v1\nkind: Pod\nmetadata: {name: y}\n"
                              b"spec:\n  containers: [{name: c, image: host}]\n")
    result = source_for(server, session).refresh()
    assert result is not None and [p.name for p in result.pods] == [f"y-{NODE}"]


def test_empty_body_is_an_empty_set(server: Server, session: requests.Session) -> None:
    server.reply = Reply(body=b"")
    result = source_for(server, session).refresh()
    assert result is not None and result.pods == () and result.errors == ()


def test_non_200_changes_nothing(server: Server, session: requests.Session) -> None:
    source = source_for(server, session)
    server.reply = Reply(status=500, body=b"oops")
    assert source.refresh() is None
    assert source.last_error.startswith("HTTP 500")
    server.reply = Reply(body=json.dumps(pod("web")).encode())
    good = source.refresh()
    assert good is not None and source.last_error == ""
    server.reply = Reply(status=404)
    assert source.refresh() is good  # the last good set, re-published unchanged
    assert source.last_error.startswith("HTTP 404")


def test_invalid_body_changes_no_pods(server: Server, session: requests.Session) -> None:
    source = source_for(server, session)
    server.reply = Reply(body=json.dumps(pod("web")).encode())
    good = source.refresh()
    assert good is not None
    server.reply = Reply(body=b"apiVersion: apps/v1\nkind: Deployment\n")
    after = source.refresh()
    assert after is not None and after.pods == good.pods
    assert after.errors[0].field == "kind" and "Deployment" in after.errors[0].reason
    assert "Deployment" in source.last_error


def test_identical_body_is_a_no_op(server: Server, session: requests.Session) -> None:
    server.reply = Reply(body=json.dumps(pod("web")).encode())
    source = source_for(server, session)
    first = source.refresh()
    second = source.refresh()
    assert first is not None and second is first  # not decoded again, same set re-sent
    assert len(server.requests) == 2


def test_oversized_body_with_length(server: Server, session: requests.Session) -> None:
    server.reply = Reply(body=b" " * (10 * MiB + 1))
    with pytest.raises(FetchError, match="larger than 10 MiB"):
        fetch(session, server.url, {})


def test_oversized_body_without_length(server: Server, session: requests.Session) -> None:
    server.reply = Reply(body=b" " * (10 * MiB + 1), content_length=False)
    with pytest.raises(FetchError, match="larger than 10 MiB"):
        fetch(session, server.url, {})


def test_body_at_the_cap_is_read(server: Server, session: requests.Session) -> None:
    server.reply = Reply(body=b"x" * 1000, content_length=False)
    assert fetch(session, server.url, {}, cap=1000) == b"x" * 1000


def test_headers_are_sent(server: Server, session: requests.Session) -> None:
    server.reply = Reply(body=b"")
    source = source_for(server, session, {"Authorization": ["Bearer t"], "X-Multi": ["a", "b"]})
    source.refresh()
    sent = server.requests[-1]
    assert sent["Authorization"] == "Bearer t" and sent["X-Multi"] == "a, b"


def test_timeout(server: Server, session: requests.Session) -> None:
    hold = threading.Event()
    server.reply = Reply(body=b"", hold=hold)
    try:
        with pytest.raises(FetchError, match="request failed"):
            fetch(session, server.url, {}, timeout=0.3)
    finally:
        hold.set()


def test_connection_refused(session: requests.Session) -> None:
    with pytest.raises(FetchError, match="request failed"):
        fetch(session, "http://127.0.0.1:9/pods", {}, timeout=2)


def test_schedule(server: Server, session: requests.Session) -> None:
    now = [100.0]
    server.reply = Reply(body=b"")
    source = HttpSource(server.url, NODE, 20.0,
                        lambda: fetch(session, server.url, {}), clock=lambda: now[0])
    assert source.due_in() <= 0
    source.refresh()
    assert source.due_in() == pytest.approx(1.0)  # early re-publish after the first good set
    source.refresh()
    assert source.due_in() == pytest.approx(20.0)
