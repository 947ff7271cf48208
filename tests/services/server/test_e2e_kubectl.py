"""Real clients through the whole path: ``kubectl`` -> the stand-in API server (which proxies
``pods/exec|attach|portforward`` to the node's main port with its own client certificate and
splices the upgraded connection, as kube-apiserver does) -> podvisor's main port (client
certificate from clientCAFile) -> the runtime's streaming URL. One agent on the embedded
runtime for the module, one API pod ``web`` running a Python HTTP server on the host network.

kubectl speaks SPDY/3.1 (``KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`` /
``KUBECTL_PORT_FORWARD_WEBSOCKETS=false`` make a kubectl >= 1.30 do so; older ones always do)
and, from 1.30 on, WebSocket ``v5.channel.k8s.io`` for exec by default: both are run."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from tests.conftest import AgentHandle, process_gone, short_tmp_dir, wait_for_impl
from tests.support.kubeapi import KubeApi
from tests.support.lifecycle import agent_config, free_port, get_pods
from tests.support.spdy_client import spdy_exec

pytestmark = [pytest.mark.no_leak_check,
              pytest.mark.skipif(shutil.which("kubectl") is None,
                                 reason="kubectl is not installed (Debian: kubernetes-client)")]

NODE = "kubectl-node"
SPDY = {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false", "KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"}


@dataclass
class Cluster:
    api: KubeApi
    handle: Any
    kubeconfig: Path
    ro_port: int
    web_port: int
    tmp: Path
    main_port: int

    def main_ssl(self) -> ssl.SSLContext:
        """TLS to the node's main port as a client the node trusts (the API CA signs it)."""
        ctx = ssl.create_default_context(
            cafile=str(Path(self.handle.paths.root) / "pki" / "kubelet.crt"))
        ctx.check_hostname = False
        crt, key = self.api.client_cert("tester", ("testers",))
        ctx.load_cert_chain(str(crt), str(key))
        return ctx

    def kubectl(self, *args: str, env: dict[str, str] | None = None,
                **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "HOME": str(self.kubeconfig.parent),
                                   **(env or {})}, **kw)


def _running(ro_port: int, name: str) -> bool:
    for pod in (get_pods(ro_port) or {}).get("items", []):
        if pod["metadata"]["name"] == name:
            cs = pod["status"].get("containerStatuses") or []
            return bool(cs) and all("running" in c.get("state", {}) for c in cs)
    return False


def _serving(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    tmp = Path(tempfile.mkdtemp(prefix="pvkc", dir="/tmp"))
    home = short_tmp_dir()
    api = KubeApi(tmp / "kubeapi").start()
    web_port, ro_port, port = free_port(), free_port(), free_port()
    api.store.create("pods", "default", {"metadata": {"name": "web"}, "spec": {
        "nodeName": NODE, "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "c", "image": "host", "workingDir": str(tmp),
                        "command": ["python3", "-m", "http.server", str(web_port),
                                    "--bind", "127.0.0.1"]}]}})
    talk = (f"while :; do if [ -e {tmp}/mark ]; then rm {tmp}/mark; echo bye; echo err >&2; "
            "fi; echo tick; sleep 0.1; done")
    api.store.create("pods", "default", {"metadata": {"name": "talker"}, "spec": {
        "nodeName": NODE, "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": "host", "command": ["sh", "-c", talk]}]}})
    node_kubeconfig = api.kubeconfig(tmp / "node.kubeconfig", user=f"system:node:{NODE}",
                                     groups=("system:nodes",))
    (tmp / "kube").mkdir()
    kubeconfig = api.kubeconfig(tmp / "kube" / "config", user="admin", token="admin-token")
    (tmp / "index.html").write_text("hello through port-forward\n")
    manifests = tmp / "manifests"
    manifests.mkdir()
    cfg = agent_config(manifests, ro_port, stopPodsOnExit=True,
                       authentication={"x509": {"clientCAFile": str(api.kubelet_client_ca)},
                                       "anonymous": {"enabled": False}})
    cfg.update({"rootDir": str(home / "root"), "port": port, "nodeName": NODE,
                "kubeconfig": str(node_kubeconfig)})
    handle = AgentHandle(home, cfg, [], dict(os.environ))
    try:
        handle.wait_ready()
        wait_for_impl(lambda: _running(ro_port, "web") and _serving(web_port)
                      and _running(ro_port, "talker"), 90.0, 0.1, "the web pod serving")
        wait_for_impl(lambda: api.store.get("nodes", "", NODE).get("status", {}).get(
            "daemonEndpoints"), 30.0, 0.1, "the node registered with its status")
        yield Cluster(api, handle, kubeconfig, ro_port, web_port, tmp, port)
    finally:
        handle.stop()
        api.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        _, alive = psutil.wait_procs(left, timeout=10.0)
        alive = [p for p in alive if not process_gone(p)]
        for proc in alive:
            proc.kill()
        assert not alive, f"the agent left processes behind: {alive}"


@pytest.mark.parametrize("protocol", ["SPDY/3.1", "websocket"])
def test_kubectl_exec(cluster: Cluster, protocol: str) -> None:
    env = SPDY if protocol == "SPDY/3.1" else {}
    seen = len(cluster.api.node_proxy_requests)
    done = cluster.kubectl("exec", "web", "--", "echo", "hi", env=env)
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
    upgrades = {u.lower() for _, _, u in cluster.api.node_proxy_requests[seen:]}
    assert protocol.lower() in upgrades, cluster.api.node_proxy_requests
    failed = cluster.kubectl("exec", "web", "-c", "c", "--", "sh", "-c",
                             "echo out; echo err >&2; exit 3", env=env)
    assert (failed.returncode, failed.stdout) == (3, "out\n"), failed.stderr
    assert "err\n" in failed.stderr
    piped = cluster.kubectl("exec", "-i", "web", "--", "sh", "-c", "cat; echo done",
                            input="through stdin\n", env=env)
    assert (piped.returncode, piped.stdout) == (0, "through stdin\ndone\n"), piped.stderr


def test_kubectl_exec_refusals(cluster: Cluster) -> None:
    missing = cluster.kubectl("exec", "web", "-c", "nope", "--", "true", env=SPDY)
    assert missing.returncode != 0 and "nope" in missing.stderr, missing.stderr
    # kubectl without a terminal: -t is dropped with a warning, the command still runs
    tty = cluster.kubectl("exec", "-t", "web", "--", "echo", "plain", env=SPDY)
    assert tty.returncode == 0 and "plain" in tty.stdout, tty.stderr


def test_kubectl_port_forward(cluster: Cluster) -> None:
    local = free_port()
    proc = subprocess.Popen(
        ["kubectl", "--kubeconfig", str(cluster.kubeconfig), "port-forward", "pod/web",
         f"{local}:{cluster.web_port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, **SPDY, "HOME": str(cluster.kubeconfig.parent)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert re.match(rf"Forwarding from 127\.0\.0\.1:{local} -> {cluster.web_port}", line), \
            line
        for _ in range(2):  # two connections, two SPDY stream pairs on one session
            resp = requests.get(f"http://127.0.0.1:{local}/index.html", timeout=30)
            assert resp.status_code == 200 and resp.text == "hello through port-forward\n"
        assert any("/portForward/default/web" in url
                   for _, url, _ in cluster.api.node_proxy_requests)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.parametrize("protocol", ["SPDY/3.1", "websocket"])
def test_kubectl_attach(cluster: Cluster, protocol: str) -> None:
    """The talker's output from the moment of attaching: ticks, then the ``bye`` its mark
    file makes it print (stdout) with ``err`` (stderr)."""
    env = SPDY if protocol == "SPDY/3.1" else {}
    proc = subprocess.Popen(
        ["kubectl", "--kubeconfig", str(cluster.kubeconfig), "attach", "talker", "-c", "c"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env, "HOME": str(cluster.kubeconfig.parent)})
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first == "tick\n", (first, proc.stderr.read() if proc.poll() is not None
                                    else "")
        (cluster.tmp / "mark").touch()
        while (line := proc.stdout.readline()) not in ("bye\n", ""):
            assert line == "tick\n", line
        assert line == "bye\n"
        # stderr is its own channel: "err" may arrive after "bye"; read until it does
        assert proc.stderr is not None
        seen = []
        while (line := proc.stderr.readline()) not in ("err\n", ""):
            seen.append(line)
        assert line == "err\n", seen
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


TTY_SCRIPT = ("test -t 0 && test -t 1 && echo tty; "
              "while [ \"$(stty size)\" != '30 100' ]; do :; done; echo sized")
TTY_QUERY = ("command=sh&command=-c&command=" + requests.utils.quote(TTY_SCRIPT, safe="")
             + "&input=1&output=1&tty=1")


def test_main_port_exec_tty_websocket(cluster: Cluster) -> None:
    """A WebSocket client (aiohttp) with a TTY through the main port's /exec: the command
    sees a terminal; a resize message (channel 4) sets its size."""
    import aiohttp

    async def run() -> tuple[bytes, dict[str, Any]]:
        out, status = b"", {}
        url = f"https://127.0.0.1:{cluster.main_port}/exec/default/web/c?{TTY_QUERY}"
        async with aiohttp.ClientSession() as session, session.ws_connect(
                url, protocols=("v5.channel.k8s.io",), ssl=cluster.main_ssl()) as ws:
            await ws.send_bytes(b"\x04" + json.dumps({"Width": 100, "Height": 30}).encode())
            async for msg in ws:
                if msg.type is aiohttp.WSMsgType.BINARY:
                    if msg.data[0] == 1:
                        out += msg.data[1:]
                    elif msg.data[0] == 3:
                        status = json.loads(msg.data[1:])
        return out, status
    out, status = asyncio.run(run())
    assert out.replace(b"\r", b"").splitlines() == [b"tty", b"sized"], out
    assert status["status"] == "Success"


def test_main_port_exec_tty_spdy(cluster: Cluster) -> None:
    url = f"https://127.0.0.1:{cluster.main_port}/exec/default/web/c?{TTY_QUERY}"
    got = asyncio.run(spdy_exec(url, stdin=b"", close_stdin=False, tty=True,
                                resize=(100, 30), ctx=cluster.main_ssl()))
    assert got.status_code == 101, got
    assert got.stdout.replace(b"\r", b"").splitlines() == [b"tty", b"sized"], got
    assert got.status["status"] == "Success"


def _main_port_answers(cluster: Cluster) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", cluster.main_port), timeout=2) as raw, \
                cluster.main_ssl().wrap_socket(raw) as tls:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return tls.recv(12).startswith(b"HTTP/1.1")
    except OSError:
        return False


def test_kill9_of_the_server_during_a_spdy_exec(cluster: Cluster) -> None:
    """The spliced SPDY exec ends with the server process; the runtime then kills the command
    (its client went away); the main port is back; the pod is untouched."""
    query = ("command=sh&command=-c&command=" + requests.utils.quote("echo $$; exec sleep 1000")
             + "&output=1")
    url = f"https://127.0.0.1:{cluster.main_port}/exec/default/web/c?{query}"
    pids: list[int] = []

    def first_output(chunk: bytes) -> None:
        if not pids:
            pids.append(int(chunk.split()[0]))
            cluster.handle.call("kill", name="server", signal="KILL")
    got = asyncio.run(spdy_exec(url, stderr=False, ctx=cluster.main_ssl(),
                                on_stdout=first_output))
    assert got.status_code == 101 and pids and got.error == b"", got
    wait_for_impl(lambda: not psutil.pid_exists(pids[0])
                  or psutil.Process(pids[0]).status() == "zombie", 30.0, 0.05,
                  "the exec'd command killed once its stream is gone")
    wait_for_impl(lambda: _main_port_answers(cluster), 30.0, 0.05, "the main port back")
    # /pods answers once the restarted server has its maps again
    wait_for_impl(lambda: _running(cluster.ro_port, "web"), 30.0, 0.05, "web running in /pods")



def test_main_port_port_forward_websocket(cluster: Cluster) -> None:
    """/portForward over WebSocket through the main port (the kubelet's channels: 0 data,
    1 error, each opened by the port as 2 little-endian bytes): an HTTP request to the pod."""
    import aiohttp

    async def run() -> tuple[list[bytes], bytes]:
        firsts: list[bytes] = []
        data = b""
        url = (f"https://127.0.0.1:{cluster.main_port}/portForward/default/web"
               f"?port={cluster.web_port}")
        async with aiohttp.ClientSession() as session, session.ws_connect(
                url, protocols=("v4.channel.k8s.io",), ssl=cluster.main_ssl()) as ws:
            seen: set[int] = set()
            async for msg in ws:
                if msg.type is not aiohttp.WSMsgType.BINARY:
                    continue
                channel, payload = msg.data[0], msg.data[1:]
                if channel not in seen:
                    seen.add(channel)
                    firsts.append(payload)
                    if seen == {0, 1}:
                        await ws.send_bytes(b"\x00GET /index.html HTTP/1.0\r\n\r\n")
                elif channel == 0:
                    data += payload
        return firsts, data
    firsts, data = asyncio.run(run())
    assert firsts == [cluster.web_port.to_bytes(2, "little")] * 2
    assert data.startswith(b"HTTP/1.0 200") and data.endswith(b"hello through port-forward\n")
