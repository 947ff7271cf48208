"""A user's test of their own workload against a misbehaving node: podvisor's pytest plugin.

    pip install podvisor pytest
    pytest test_workload.py

The `podvisor_node` fixture (installed with podvisor) starts a private podvisor agent on a temp
rootDir with its embedded runtime, and stops it and every pod after the test. The workload here
is a small web server (run as a host process by the embedded runtime's `host` image); yours is
whatever your manifest says. The test kills parts of the node, cuts one off the node's bus and
slows the container runtime down, and checks that the workload keeps serving and that the node
neither lost, doubled nor orphaned anything.
"""

from __future__ import annotations

import socket
import urllib.request

from podvisor.testing import Node, wait_until

WEB = """
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: server
    image: host
    command: ["python3", "-m", "http.server", "{port}", "--bind", "127.0.0.1"]
    readinessProbe:
      exec:
        command:
        - python3
        - -c
        - import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/', timeout=2)
      periodSeconds: 1
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_my_web_server_keeps_serving_on_a_misbehaving_node(podvisor_node: Node) -> None:
    node = podvisor_node
    port = free_port()
    node.apply(WEB.replace("{port}", str(port)))
    node.wait_pod("web", "Ready")
    [server] = node.container_pids("web")

    # kill: the sync loop and the runtime die (kill -9) and come back; the server is untouched
    node.kill("syncloop")
    node.kill("runtime")
    node.wait_up()
    assert serving(port)
    assert node.container_pids("web") == [server]

    # partition: PLEG is cut off from the node's bus; the server crashes meanwhile, and the
    # sync loop (which hears of it from the runtime itself) starts it again
    with node.fault("bus", "pleg", action="drop"):
        node.kill_container("web")
        wait_until(lambda: serving(port), timeout=60, message="the server back")
    node.wait_pod("web", "Ready", restarts=1)

    # slow: every call to the container runtime answers 300 ms late for 10 s; the node and
    # its readiness probes are slower, the server is not disturbed
    with node.fault("cri", "runtime", action="latency", delay=0.3, duration=10):
        node.kill("prober")
        node.wait_up()
        node.wait_pod("web", "Ready")
        assert serving(port)

    # nothing lost, nothing run twice, no restart but the one we caused, nothing orphaned
    node.check()
