"""The volume manager's API calls over ``ApiConnection``: a missing object is None, a failure
an ``OSError`` (so the callers handle one error type; the message says which)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podvisor.services.apiserver import MERGE_PATCH, ApiConnection, ApiError, ApiUnreachable


class VolumeApi:
    """Thread-safe as ``ApiConnection`` is."""

    def __init__(self, conn: ApiConnection) -> None:
        self.conn = conn

    def _send(self, method: str, path: str, body: Any = None,
              content_type: str = "") -> Mapping[str, Any] | None:
        try:
            return self.conn.request(method, path, body=body, content_type=content_type)
        except ApiError as err:
            if err.status == 404:
                return None
            raise OSError(f"{method} {path}: {err}") from None
        except ApiUnreachable as err:
            raise OSError(f"the API server is unreachable: {err}") from None

    def get(self, path: str) -> Mapping[str, Any] | None:
        return self._send("GET", path)

    def create(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        got = self._send("POST", path, dict(body))
        if got is None:
            raise OSError(f"POST {path}: 404")
        return got

    def replace(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        got = self._send("PUT", path, dict(body))
        if got is None:
            raise OSError(f"PUT {path}: 404")
        return got

    def merge_patch(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        got = self._send("PATCH", path, dict(body), MERGE_PATCH)
        if got is None:
            raise OSError(f"PATCH {path}: 404")
        return got

    def delete(self, path: str) -> None:
        self._send("DELETE", path)

    def close(self) -> None:
        self.conn.close()
