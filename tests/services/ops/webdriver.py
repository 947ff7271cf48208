"""A minimal W3C WebDriver client over HTTP (``requests``) for Debian's chromedriver
(imported as ``tests.services.ops.webdriver``). Chromium runs headless with a fresh profile."""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import requests

from tests.conftest import wait_for_impl

ELEMENT = "element-6066-11e4-a6c6-4a4b6c0d4b6e"
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--window-size=1400,1000"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StaleElement(Exception):
    pass


class Browser:
    def __init__(self, chromedriver: str, chromium: str) -> None:
        self.port = _free_port()
        self.profile = Path(tempfile.mkdtemp(prefix="pvchrome", dir="/tmp"))
        self.proc = subprocess.Popen([chromedriver, f"--port={self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        self.http = requests.Session()
        try:
            wait_for_impl(self._up, 30.0, 0.05, "chromedriver up")
            caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome",
                    "goog:chromeOptions": {"binary": chromium, "args": [
                        *CHROME_ARGS, f"--user-data-dir={self.profile}"]}}}}
            self.session = self._call("POST", "/session", caps)["sessionId"]
        except BaseException:
            self.close()
            raise

    def _up(self) -> bool:
        try:
            return bool(self.http.get(f"{self.base}/status", timeout=2).json()["value"]["ready"])
        except (requests.RequestException, ValueError, KeyError):
            return False

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        resp = self.http.request(method, self.base + path, json=body, timeout=60)
        value = resp.json()["value"]
        if resp.status_code != 200:
            if isinstance(value, dict) and value.get("error") == "stale element reference":
                raise StaleElement(value.get("message"))
            raise RuntimeError(f"webdriver {method} {path}: {value}")
        return value

    def _s(self, path: str) -> str:
        return f"/session/{self.session}{path}"

    def get(self, url: str) -> None:
        self._call("POST", self._s("/url"), {"url": url})

    def find(self, css: str) -> str | None:
        found = self._call("POST", self._s("/elements"), {"using": "css selector", "value": css})
        if not found:
            return None
        ref = found[0]
        return str(ref.get(ELEMENT) or ref.get("ELEMENT") or next(iter(ref.values())))

    def text(self, css: str) -> str | None:
        """The element's text now (None: absent or replaced meanwhile)."""
        try:
            el = self.find(css)
            return None if el is None else str(self._call("GET", self._s(f"/element/{el}/text")))
        except StaleElement:
            return None

    def click(self, css: str) -> bool:
        try:
            el = self.find(css)
            if el is None:
                return False
            self._call("POST", self._s(f"/element/{el}/click"), {})
            return True
        except StaleElement:
            return False

    def script(self, source: str) -> Any:
        return self._call("POST", self._s("/execute/sync"), {"script": source, "args": []})

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._call("GET", self._s("/screenshot"))))

    def close(self) -> None:
        try:
            if getattr(self, "session", None):
                self._call("DELETE", self._s(""))
        except (requests.RequestException, RuntimeError, ValueError):
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
