"""End to end on the embedded runtime with ``networkPlugin: cni`` (issue 27 part 3): a whole
agent, Debian's CNI plugins, the conflist podvisor writes itself.

Three replicas listening on port 8080 run side by side with three pod IPs (in ``/pods``, and
in their own environment through the downward API's ``status.podIP``); their httpGet readiness
and tcpSocket liveness probes go to the pod IPs and pass; hostPort 18080 reaches the replica
that maps it on 127.0.0.1; a ``hostNetwork: true`` pod has the host's IP; port forward through
the runtime reaches a replica's port inside its namespace; ``/healthz`` is plain ok (no host
network note). Deleting the manifests removes the sandboxes and, with them, their namespaces
and iptables rules. The test removes its network (rules, bridge) by name at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import new_runtime_client
from podvisor.services.runtime import netns
from podvisor.services.runtime.cni import CONFLIST, remove_network
from tests.support.lifecycle import agent_config, free_port, get_pods
from tests.support.spdy_client import spdy_port_forward

PLUGINS = Path("/usr/lib/cni")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all((PLUGINS / p).exists() for p in ("bridge", "host-local",
                                                                  "portmap", "loopback")),
    reason="needs root and containernetworking-plugins in /usr/lib/cni (bash .ci/test-deps.sh)")

# The replica: HTTP on 0.0.0.0:8080, answering "<pod name> <POD_IP from the downward API>".
SERVER = (
    "import http.server, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = (os.environ['NAME'] + ' ' + os.environ['POD_IP']).encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers(); self.wfile.write(body)\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer(('0.0.0.0', 8080), H).serve_forever()\n")


def replica(name: str, host_port: int = 0) -> dict[str, Any]:
    port: dict[str, Any] = {"containerPort": 8080, "name": "http"}
    if host_port:
        port["hostPort"] = host_port
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "web", "image": "host", "command": [sys.executable, "-c", SERVER],
                "env": [{"name": "NAME", "valueFrom": {"fieldRef": {
                            "fieldPath": "metadata.name"}}},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {
                            "fieldPath": "status.podIP"}}}],
                "ports": [port],
                "readinessProbe": {"httpGet": {"port": "http", "path": "/"},
                                   "periodSeconds": 1},
                "livenessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 2,
                                  "failureThreshold": 5}}]}}


def host_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": "host",
                                     "command": ["sleep", "3600"]}]}}


def http_get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return str(resp.read().decode().strip())
    except (urllib.error.URLError, OSError):
        return None


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.timeout(240)
def test_replicas_side_by_side_with_their_own_ips(agent: Any, manifests: Path,
                                                  wait_for: Any) -> None:
    host_port = 18080 if port_is_free(18080) else free_port()
    names = {"rep-0", "rep-1", "rep-2", "hostnet"}
    for p in (replica("rep-0", host_port), replica("rep-1"), replica("rep-2"),
              host_pod("hostnet")):
        (manifests / f"{p['metadata']['name']}.yaml").write_text(yaml.safe_dump(p), "utf-8")
    port = free_port()
    conf_dir = manifests.parent / f"{manifests.name}-net.d"
    config = agent_config(manifests, port, networkPlugin="cni", cniConfDir=str(conf_dir),
                          cniBinDir=str(PLUGINS), stopPodsOnExit=True)
    handle = agent(config=config)
    try:
        def ready_with_ips() -> dict[str, Any] | None:
            body = get_pods(port)
            if body is None:
                return None
            by = {p["metadata"]["name"].removesuffix("-e2e"): p for p in body["items"]}
            if set(by) != names:
                return None
            for p in by.values():
                st = p["status"]
                if st.get("phase") != "Running" or not st.get("podIP") or not all(
                        c.get("ready") for c in st.get("containerStatuses", [])):
                    return None
            return by
        by = wait_for(ready_with_ips, 150.0, 0.3, "every pod Running and Ready with an IP")
        ips = {n: by[n]["status"]["podIP"] for n in names}
        host_ip = by["hostnet"]["status"]["hostIP"]
        # three replicas, three pod IPs, none of them the host's; the hostNetwork pod has it
        assert len({ips["rep-0"], ips["rep-1"], ips["rep-2"], host_ip}) == 4, ips
        assert ips["hostnet"] == host_ip
        for n in ("rep-0", "rep-1", "rep-2"):
            assert by[n]["status"]["podIPs"] == [{"ip": ips[n]}]
            # the same port in each, reached on the pod's IP; the downward API saw that IP
            assert http_get(f"http://{ips[n]}:8080/") == f"{n}-e2e {ips[n]}"
        # hostPort: the host's loopback reaches the replica that maps it
        assert wait_for(lambda: http_get(f"http://127.0.0.1:{host_port}/"), 30.0, 0.2,
                        f"hostPort {host_port}") == f"rep-0-e2e {ips['rep-0']}"
        # port forward through the runtime: inside rep-1's namespace, its localhost:8080
        cri = new_runtime_client(f"unix://{handle.paths.cri_socket}", timeout=10.0)
        try:
            uid = by["rep-1"]["metadata"]["uid"]
            sid = next(s.id for s in cri.list_pod_sandbox()
                       if s.metadata.uid == uid and s.state == pb.SANDBOX_READY)
            url = cri.port_forward(pb.PortForwardRequest(pod_sandbox_id=sid, port=[8080]))
            got = asyncio.run(spdy_port_forward(str(url), 8080,
                                                b"GET / HTTP/1.0\r\nHost: x\r\n\r\n"))
            assert got.error == b"" and got.stdout.endswith(
                f"rep-1-e2e {ips['rep-1']}".encode()), got
        finally:
            cri.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            assert resp.read().decode() == "ok"
        # deleting the manifests: the sandboxes go, with their namespaces and rules
        for f in manifests.iterdir():
            f.unlink()
        netns_dir = handle.paths.runtime_dir / "netns"
        wait_for(lambda: (b := get_pods(port)) is not None and not b["items"]
                 and not list(netns_dir.glob("*")), 60.0, 0.3, "the pods and namespaces gone")
        assert http_get(f"http://127.0.0.1:{host_port}/") is None
        assert handle.stop() == 0
    finally:
        handle.stop()  # stopPodsOnExit: the pods and their networks go first
        for path in netns.listed(handle.paths.runtime_dir / "netns"):
            netns.remove(path)  # only after a failure: none is left otherwise
        with contextlib.suppress(OSError, ValueError):
            remove_network(json.loads((conf_dir / CONFLIST).read_text()))
        shutil.rmtree(conf_dir, ignore_errors=True)
