"""The ops port over TLS (opsTLSCertFile/opsTLSPrivateKeyFile, a self-signed cert made with
openssl): podvisorctl --endpoint https://... --cacert, and plain HTTP refused."""

from __future__ import annotations

import http.client
import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, AgentHandle, short_tmp_dir, wait_for_impl
from tests.support.lifecycle import free_port

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture(scope="module")
def tls_agent() -> Iterator[tuple[AgentHandle, int, Path]]:
    tmp = short_tmp_dir()
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    port = free_port()
    cfg = {"rootDir": str(tmp / "root"), "nodeName": "tls", "opsPort": port,
           "opsTLSCertFile": str(cert), "opsTLSPrivateKeyFile": str(key),
           "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "15s",
                           "processes": {"runtime": {"enabled": False},
                                         "prober": {"enabled": False}}}}
    handle = AgentHandle(tmp, cfg, [], dict(os.environ))
    try:
        handle.wait_ready()
        handle.wait_state("ops", "RUNNING", timeout=30.0)
        yield handle, port, cert
    finally:
        handle.stop(30.0)
        shutil.rmtree(tmp, ignore_errors=True)


def test_podvisorctl_over_https(tls_agent: tuple[AgentHandle, int, Path],
                                tmp_path: Path) -> None:
    handle, port, cert = tls_agent
    creds = handle.paths.root / "ops-password"  # a bare password file works as credentials
    url = f"https://127.0.0.1:{port}"

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "podvisorctl"), "--endpoint", url, "--credentials",
                               str(creds), *args], capture_output=True, text=True, timeout=60)

    out = wait_for_impl(lambda: (o := ctl("--cacert", str(cert), "status", "ops")).returncode
                        == 0 and o, 20.0, 0.1, "podvisorctl status over https")
    assert "agent:ops" in out.stdout and "RUNNING" in out.stdout
    assert ctl("status").returncode == 2  # self-signed: not trusted without --cacert
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)  # plain HTTP: no
    ctx = ssl.create_default_context(cafile=str(cert))
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{url}/RPC2", timeout=10, context=ctx)
    assert err.value.code == 401
