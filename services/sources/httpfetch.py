"""One bounded HTTP GET of the static pod URL (requests), and the pure decode of its body."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import requests

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.pod import MAX_MANIFEST_BYTES, PodValidationError, decode_pod_or_list
from podvisor.services.sources.common import (
    Seen,
    SourceError,
    SourceSet,
    build_static_pod,
    errors_of,
    within_budget,
)

SOURCE = "http"
TIMEOUT = 10.0


class FetchError(Exception):
    """The GET failed (connection, timeout, non-200, too large): nothing changes."""


def fetch(session: requests.Session, url: str, headers: Mapping[str, str], *,
          timeout: float = TIMEOUT, cap: int = MAX_MANIFEST_BYTES,
          clock: Callable[[], float] = SYSTEM_CLOCK.monotonic) -> bytes:
    """The body of a 200 answer, at most ``cap`` bytes, within ``timeout`` seconds overall."""
    deadline = clock() + timeout
    try:
        with session.get(url, headers=dict(headers), timeout=timeout, stream=True,
                         allow_redirects=True) as resp:
            if resp.status_code != 200:
                raise FetchError(f"HTTP {resp.status_code} {resp.reason or ''}".strip())
            length = resp.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > cap:
                raise FetchError(f"body is larger than {cap // (1024 * 1024)} MiB ({length} "
                                 "bytes); not read")
            chunks: list[bytes] = []
            total = 0
            for chunk in resp.iter_content(64 * 1024):
                total += len(chunk)
                if total > cap:
                    raise FetchError(f"body is larger than {cap // (1024 * 1024)} MiB")
                if clock() > deadline:
                    raise FetchError(f"timed out after {timeout:g} s")
                chunks.append(chunk)
            return b"".join(chunks)
    except requests.RequestException as exc:
        raise FetchError(f"request failed: {type(exc).__name__}: {exc}") from exc


def flatten_headers(headers: Mapping[str, list[str] | str]) -> dict[str, str]:
    """KubeletConfiguration's ``staticPodURLHeader`` (name -> values) as request headers."""
    return {name: v if isinstance(v, str) else ", ".join(v) for name, v in headers.items()}


def decode_http_body(body: bytes, url: str, node_name: str, seen: Seen) -> SourceSet:
    """A 200 body -> the set: empty body = empty set; a Pod or a PodList (each item checked
    on its own). Raises ``PodValidationError`` when the body as a whole is not usable."""
    if not body.strip():
        return SourceSet(SOURCE)
    parsed, invalid = decode_pod_or_list(body, url)
    errors: list[SourceError] = [e for exc in invalid for e in errors_of(exc)]
    pods = []
    for i, item in enumerate(parsed):
        try:
            pods.append(build_static_pod(item, node_name=node_name, source=SOURCE,
                                         location=url, seen=seen))
        except PodValidationError as exc:
            errors.extend(SourceError(url, f"items[{i}].{e.field}".rstrip("."), e.reason)
                          for e in exc.errors)
    return within_budget(SourceSet(SOURCE, tuple(pods), tuple(errors)))
