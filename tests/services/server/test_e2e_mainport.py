"""End to end: the main port of a real agent (embedded runtime, static pods) over real HTTPS.

One agent for the module: a token file, a client CA, anonymous off, the self-signed serving pair
generated under rootDir/pki. Every endpoint: 401 without credentials, 200 with a token, 200 with
a client certificate; an unknown token 401; container logs with their options; kill -9 of the
server process during ``logs --follow``: the port is back, the pods are untouched."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import pty
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from tests.conftest import AgentHandle, process_gone, short_tmp_dir, wait_for_impl
from tests.services.server.certs import make_ca, make_client
from tests.support.lifecycle import (
    agent_config,
    free_port,
    get_pods,
    kill_pids,
    pod_yaml,
    read_pid,
)

# The module's agent restarts its server (kill -9) and a crashing container on purpose while
# tests run: the per-test leak check is replaced by one check after the agent stops.
pytestmark = pytest.mark.no_leak_check

TOKEN = "s3cr3t-token-for-tests"
TALKER = ("echo $$$$ > {marks}/talker.pid; seq 1 1000000 | while read n; do echo line $n; "
          "sleep 0.1; done")
CRASH_ONCE = ("echo run $$$$; test -e {marks}/crashed && exec sleep 3600; "
              "touch {marks}/crashed; exit 1")
PROBE = "    readinessProbe:\n      exec: {command: [\"true\"]}\n      periodSeconds: 1\n"
ENDPOINTS = ["/healthz", "/pods", "/runningpods/", "/configz", "/metrics", "/stats/summary",
             "/metrics/probes", "/metrics/resource",
             "/containerLogs/default/talker-e2e/c", "/no-such-endpoint"]


@dataclass
class Node:
    handle: Any
    port: int
    ro_port: int
    ca: str  # the serving certificate (self-signed: its own CA)
    client: tuple[str, str]
    stranger: tuple[str, str]
    marks: Path

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def get(self, path: str, token: str | None = TOKEN, **kw: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers.update(kw.pop("headers", {}))
        return requests.get(self.url(path), headers=headers, verify=self.ca, timeout=10, **kw)


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """The module's agent (started before the per-test leak snapshot, stopped at the end)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    tmp = Path(tempfile.mkdtemp(prefix="pvmp", dir="/tmp"))
    home = short_tmp_dir()
    manifests, marks, pki = tmp / "manifests", tmp / "marks", tmp / "pki"
    for d in (manifests, marks, pki):
        d.mkdir()
    (manifests / "talker.yaml").write_text(pod_yaml("talker", TALKER.format(marks=marks))
                                           + PROBE)
    (manifests / "burner.yaml").write_text(pod_yaml("burner", "while :; do :; done")
                                           + "    resources: {limits: {cpu: 200m}}\n")
    (manifests / "crasher.yaml").write_text(pod_yaml("crasher", CRASH_ONCE.format(marks=marks)))
    ca = make_ca(pki)
    client = make_client(pki, ca, "alice", ("admins",))
    stranger = make_client(pki, make_ca(pki, "other-ca"), "mallory")
    (tmp / "tokens.csv").write_text(f'{TOKEN},ops,1001,"ops,viewers"\n', "utf-8")
    port, ro_port = free_port(), free_port()
    cfg = agent_config(manifests, ro_port, stopPodsOnExit=True,
                       authentication={"tokenFile": str(tmp / "tokens.csv"),
                                       "x509": {"clientCAFile": str(ca[0])},
                                       "anonymous": {"enabled": False}},
                       syncloop={"crashLoopBackOffInitial": "1s"})
    cfg["rootDir"], cfg["port"] = str(home / "root"), port
    handle = AgentHandle(home, cfg, [], dict(os.environ))
    pki_crt = home / "root" / "pki"
    n = Node(handle, port, ro_port, str(pki_crt / "kubelet.crt"),
             (str(client[0]), str(client[1])), (str(stranger[0]), str(stranger[1])), marks)
    try:
        handle.wait_ready()
        wait_for_impl(lambda: _talker_running(get_pods(ro_port)), 90.0, 0.1, "talker running")
        wait_for_impl(lambda: _answers(n), 30.0, 0.1, "main port up")
        yield n
    finally:
        pid = read_pid(marks, "talker")
        handle.stop()
        kill_pids([pid] if pid else [])
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        _, alive = psutil.wait_procs(left, timeout=10.0)
        alive = [p for p in alive if not process_gone(p)]
        for proc in alive:
            proc.kill()
        assert not alive, f"the agent left processes behind: {alive}"


def _talker_running(podlist: dict[str, Any] | None) -> bool:
    for pod in (podlist or {}).get("items", []):
        if pod["metadata"]["name"] == "talker-e2e":
            return all("running" in c.get("state", {})
                       for c in pod["status"].get("containerStatuses", [{}]))
    return False


def _answers(n: Node) -> bool:
    try:
        return n.get("/healthz").status_code in (200, 500)
    except requests.RequestException:
        return False


@pytest.mark.parametrize("path", ENDPOINTS)
def test_every_endpoint_needs_credentials(node: Node, path: str) -> None:
    resp = node.get(path, token=None)
    assert resp.status_code == 401, resp.text
    assert resp.json()["reason"] == "Unauthorized"
    assert node.get(path, token="wrong").status_code == 401
    assert node.get(path, token=None, headers={"Authorization": "Basic eDp5"}
                    ).status_code == 401


@pytest.mark.parametrize("path", ENDPOINTS[:-1])
def test_token_and_client_certificate_are_let_in(node: Node, path: str, wait_for: Any) -> None:
    with_token = wait_for(lambda: (r := node.get(path)).status_code == 200 and r, 30.0, 0.1,
                          f"{path} with a token")
    assert with_token.status_code == 200
    with_cert = node.get(path, token=None, cert=node.client)
    assert with_cert.status_code == 200, with_cert.text


def test_unknown_path_with_credentials_is_404_and_foreign_cert_is_refused(node: Node) -> None:
    resp = node.get("/no-such-endpoint")
    assert resp.status_code == 404 and "/containerLogs" in resp.json()["message"]
    # TLS 1.3: the server refuses the certificate after the client's handshake ends
    with pytest.raises(requests.exceptions.ConnectionError):
        node.get("/pods", token=None, cert=node.stranger)


def test_serving_certificate_is_generated_once(node: Node) -> None:
    pki = Path(node.ca).parent
    assert (pki / "kubelet.key").stat().st_mode & 0o077 == 0
    assert requests.get(node.url("/healthz"), verify=node.ca, timeout=10,
                        headers={"Authorization": f"Bearer {TOKEN}"}).ok


def test_configz_is_the_effective_config(node: Node) -> None:
    body = node.get("/configz").json()["kubeletconfig"]
    assert body["port"] == node.port
    assert body["authentication"]["anonymous"]["enabled"] is False
    assert body["authorization"]["mode"] == "AlwaysAllow"


def test_metrics_match_pods_and_pass_promtool(node: Node, wait_for: Any) -> None:
    def running_pods() -> int:
        return sum(1 for p in (get_pods(node.ro_port) or {}).get("items", [])
                   if p["status"].get("phase") == "Running")

    def agree() -> str | None:
        text = node.get("/metrics").text
        line = next(ln for ln in text.splitlines() if ln.startswith("kubelet_running_pods "))
        return text if float(line.split()[1]) == running_pods() == 3 else None

    text = wait_for(agree, 60.0, 0.2, "kubelet_running_pods == Running pods in /pods")
    relists = wait_for(lambda: _metric(node, "kubelet_pleg_relist_duration_seconds_count"),
                       30.0, 0.2, "PLEG's histogram (multiprocess mode) in /metrics")
    assert relists >= 1
    # the sync loop's CRI calls under the kubelet's names (multiprocess mode)
    sandboxes = _metric(node, 'kubelet_runtime_operations_total{operation_type="run_podsandbox"}')
    assert sandboxes is not None and sandboxes >= 3
    started = _metric(node, "kubelet_started_containers_total")
    assert started is not None and started >= 3
    text = node.get("/metrics").text
    assert 'kubelet_runtime_operations_duration_seconds_bucket{le="+Inf",' in text
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    done = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_probe_metrics(node: Node, wait_for: Any) -> None:
    series = ('prober_probe_total{container="c",namespace="default",pod="talker-e2e",'
              'probe_type="Readiness",result="successful"}')
    assert wait_for(lambda: _metric(node, series, "/metrics/probes"), 30.0, 0.2) >= 1
    assert "prober_probe" not in node.get("/metrics").text
    text = node.get("/metrics/probes").content
    if shutil.which("promtool") is not None:
        done = subprocess.run(["promtool", "check", "metrics"], input=text,
                              capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_stats_summary(node: Node, wait_for: Any) -> None:
    def pods() -> dict[str, Any] | None:
        body = node.get("/stats/summary").json()
        by_name = {p["podRef"]["name"]: p for p in body["pods"]}
        if not {"talker-e2e", "burner-e2e", "crasher-e2e"} <= set(by_name):
            return None
        burner, talker = by_name["burner-e2e"], by_name["talker-e2e"]
        if burner["cpu"]["usageNanoCores"] <= talker["cpu"]["usageNanoCores"]:
            return None  # the first sample of a container has no rate yet
        return {"body": body, **by_name}

    found = wait_for(pods, 60.0, 0.5, "every pod in /stats/summary, the burner burning")
    body = found["body"]
    assert body["node"]["nodeName"] == "e2e"
    assert body["node"]["cpu"]["usageCoreNanoSeconds"] > 0
    assert body["node"]["memory"]["workingSetBytes"] > 0
    for pod in body["pods"]:
        assert pod["podRef"]["namespace"] == "default" and pod["podRef"]["uid"]
        assert pod["startTime"] and pod["cpu"] and pod["memory"]
        for c in pod["containers"]:
            assert c["name"] == "c" and c["startTime"]
            assert c["cpu"]["usageCoreNanoSeconds"] >= 0  # a sleeping shell may have used 0
            assert c["memory"]["workingSetBytes"] > 0
    assert found["burner-e2e"]["cpu"]["usageCoreNanoSeconds"] > 0
    talker_logs = found["talker-e2e"]["containers"][0]["logs"]
    assert talker_logs["usedBytes"] > 0 and talker_logs["inodesUsed"] >= 1
    image_fs = body["node"]["runtime"]["imageFs"]  # CRI ImageFsInfo
    assert image_fs["usedBytes"] >= 0 and image_fs["capacityBytes"] > 0 and image_fs["time"]
    assert node.get("/stats/summary", params={"x": "1"}).status_code == 400


def test_resource_metrics(node: Node, wait_for: Any) -> None:
    series = 'container_cpu_usage_seconds_total{container="c",namespace="default",pod="burner-e2e"}'
    assert wait_for(lambda: _metric(node, series, "/metrics/resource"), 30.0, 0.2) > 0
    assert _metric(node, "scrape_error", "/metrics/resource") == 0
    assert _metric(node, 'pod_memory_working_set_bytes{namespace="default",pod="talker-e2e"}',
                   "/metrics/resource") > 0
    if shutil.which("promtool") is not None:
        done = subprocess.run(["promtool", "check", "metrics"],
                              input=node.get("/metrics/resource").content,
                              capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_podvisorctl_top(node: Node, wait_for: Any) -> None:
    def burning() -> list[dict[str, Any]] | None:
        done = node.handle.ctl("top", "--json")
        assert done.returncode == 0, done.stderr
        pods = json.loads(done.stdout)
        by_name = {p["name"]: p for p in pods}
        burner = by_name.get("burner-e2e")
        return pods if burner and burner["cpuNanoCores"] > 0 and "talker-e2e" in by_name \
            else None

    pods = wait_for(burning, 60.0, 0.2, "podvisorctl top shows the burner burning")
    assert all(p["memoryWorkingSetBytes"] > 0 and p["containers"] for p in pods)
    table = node.handle.ctl("top")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "CPU(cores)", "MEMORY(bytes)"]
    assert any(ln.split()[1] == "burner-e2e" and ln.split()[2].endswith("m") for ln in lines[1:])


def test_container_logs_options(node: Node, wait_for: Any) -> None:
    path = "/containerLogs/default/talker-e2e/c"
    lines = wait_for(lambda: len(t := node.get(path).text.splitlines()) >= 5 and t, 30.0, 0.1)
    assert lines[0] == "line 1"
    tail = node.get(path, params={"tailLines": "2"}).text.splitlines()
    assert len(tail) == 2 and all(t.startswith("line ") for t in tail)
    stamped = node.get(path, params={"tailLines": "1", "timestamps": "true"}).text
    stamp, _, rest = stamped.partition(" ")
    assert stamp.endswith("Z") and "T" in stamp and rest.startswith("line ")
    assert node.get(path, params={"limitBytes": "3"}).text == "lin"
    future = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1))
    assert node.get(path, params={"sinceTime": future.strftime("%Y-%m-%dT%H:%M:%SZ")}
                    ).text == ""
    assert node.get(path, params={"sinceSeconds": "3600"}).text.splitlines()[0] == "line 1"
    third = node.get(path, params={"timestamps": "1"}).text.splitlines()[2].split(" ")[0]
    since = node.get(path, params={"sinceTime": third}).text.splitlines()
    assert since[0] == "line 3"
    for bad in ({"tailLines": "-1"}, {"sinceSeconds": "x"}, {"limitBytes": "0"},
                {"sinceTime": "yesterday"},
                {"sinceSeconds": "1", "sinceTime": "2024-01-01T00:00:00Z"},
                {"follow": "maybe"}, {"color": "1"}):
        resp = node.get(path, params=bad)
        assert resp.status_code == 400 and resp.json()["reason"] == "BadRequest", bad
    no_prev = node.get(path, params={"previous": "true"})
    assert no_prev.status_code == 400 and "previous" in no_prev.json()["message"]
    assert node.get("/containerLogs/default/nope/c").status_code == 404
    assert node.get("/containerLogs/default/talker-e2e/nope").status_code == 404


def test_previous_instance_of_a_restarted_container(node: Node, wait_for: Any) -> None:
    path = "/containerLogs/default/crasher-e2e/c"
    prev = wait_for(lambda: (r := node.get(path, params={"previous": "1"})).ok and r, 60.0, 0.2,
                    "crasher restarted once")
    assert prev.text.startswith("run ")


def test_kill9_of_the_server_during_follow(node: Node, wait_for: Any) -> None:
    """The follow stream ends with the process; the port answers again soon after (the time
    is printed, not asserted); the talker keeps its pid and its restart count."""
    handle = node.handle
    talker_pid = read_pid(node.marks, "talker")
    before = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
              for p in get_pods(node.ro_port)["items"] if p["metadata"]["name"] == "talker-e2e"}
    stream = node.get("/containerLogs/default/talker-e2e/c",
                      params={"follow": "true", "tailLines": "0"}, stream=True)
    assert stream.status_code == 200
    lines = stream.iter_lines()
    first = next(lines)
    assert first.startswith(b"line ")
    assert next(lines) != first  # new lines keep coming
    old = handle.state("server")
    handle.call("kill", name="server", signal="KILL")
    killed = time.monotonic()
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        for _ in lines:
            pass
    wait_for(lambda: _answers(node), 30.0, 0.02, "main port back after kill -9")
    print(f"main port back {time.monotonic() - killed:.3f}s after kill -9 of the server")
    assert handle.state("server")["pid"] != old["pid"]
    assert read_pid(node.marks, "talker") == talker_pid
    # /pods answers once the restarted server has its maps again (None: down or not synced)
    pods = wait_for(lambda: get_pods(node.ro_port), 30.0, 0.02, "/pods after kill -9")
    after = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
             for p in pods["items"] if p["metadata"]["name"] == "talker-e2e"}
    assert after == before
    restarts = wait_for(lambda: _metric(node, 'podvisor_process_restarts_total{process="server"}'),
                        10.0, 0.1, "the server's restart in /metrics")
    assert restarts >= 1
    assert _metric(node, 'podvisor_process_state{process="server",state="RUNNING"}') == 1


def _metric(node: Node, series: str, path: str = "/metrics") -> float | None:
    for line in node.get(path).text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_counters_of_a_restarted_process_never_go_back(node: Node, wait_for: Any) -> None:
    """PLEG's histogram (multiprocess mode): kill -9 of PLEG keeps its count monotonic."""
    series = "kubelet_pleg_relist_duration_seconds_count"
    before = wait_for(lambda: _metric(node, series), 30.0, 0.1)
    old = node.handle.state("pleg")
    node.handle.call("kill", name="pleg", signal="KILL")
    wait_for(lambda: (s := node.handle.state("pleg"))["state"] == "RUNNING"
             and s["pid"] != old["pid"], 30.0, 0.1, "pleg restarted")
    after = wait_for(lambda: (v := _metric(node, series)) is not None and v > before and v,
                     30.0, 0.1, "the count grows on after the restart")
    assert after > before
    assert _metric(node, 'podvisor_process_restarts_total{process="pleg"}') >= 1


# -- /exec and /run (streaming through the runtime's CRI Exec) ----------------------------------

EXEC = "/exec/default/talker-e2e/c"


def _ws_exec(node: Node, query: str, stdin: bytes | None,
             protocol: str = "v5.channel.k8s.io") -> tuple[bytes, bytes, dict[str, Any]]:
    """aiohttp's WebSocket client through the main port: (stdout, stderr, status)."""
    import asyncio
    import ssl

    import aiohttp

    async def run() -> tuple[bytes, bytes, dict[str, Any]]:
        out, err, status = b"", b"", {}
        ctx = ssl.create_default_context(cafile=node.ca)
        async with aiohttp.ClientSession() as session, session.ws_connect(
                node.url(f"{EXEC}?{query}"), protocols=(protocol,), ssl=ctx,
                headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            assert ws.protocol == protocol
            if stdin is not None:
                await ws.send_bytes(b"\x00" + stdin)
                await ws.send_bytes(b"\xff\x00")
            async for msg in ws:
                if msg.type is aiohttp.WSMsgType.BINARY:
                    channel, data = msg.data[0], msg.data[1:]
                    if channel == 1:
                        out += data
                    elif channel == 2:
                        err += data
                    elif channel == 3:
                        status = json.loads(data)
        return out, err, status
    return asyncio.run(run())


def test_exec_needs_credentials(node: Node, wait_for: Any) -> None:
    wait_for(lambda: _answers(node), 30.0, 0.1, "main port up")
    resp = node.get(f"{EXEC}?command=true&stdout=1", token=None)
    assert resp.status_code == 401 and resp.json()["reason"] == "Unauthorized"
    assert requests.post(node.url("/run/default/talker-e2e/c?cmd=true"), verify=node.ca,
                         timeout=10).status_code == 401


def test_exec_websocket_output_exit_code_stdin(node: Node, wait_for: Any) -> None:
    wait_for(lambda: _answers(node), 30.0, 0.1, "main port up")
    query = ("command=sh&command=-c&command=cat%3B%20echo%20err%20%3E%262%3B%20exit%207"
             "&stdin=1&stdout=1&stderr=1")
    out, err, status = _ws_exec(node, query, b"piped in\n")
    assert (out, err) == (b"piped in\n", b"err\n")
    assert status["reason"] == "NonZeroExitCode"
    assert status["details"]["causes"][0]["message"] == "7"
    out, _, status = _ws_exec(node, "command=echo&command=v4&stdout=1", None,
                              "v4.channel.k8s.io")
    assert out == b"v4\n" and status["status"] == "Success"


def test_exec_with_the_kubernetes_client(node: Node, wait_for: Any) -> None:
    from kubernetes.client import Configuration
    from kubernetes.stream.ws_client import WSClient

    wait_for(lambda: _answers(node), 30.0, 0.1, "main port up")
    cfg = Configuration(host=node.url(""))
    cfg.ssl_ca_cert = node.ca
    url = (f"wss://127.0.0.1:{node.port}{EXEC}?command=sh&command=-c"
           "&command=echo%20hello%3B%20exit%204&stdout=true&stderr=true")
    ws = WSClient(cfg, url, {"authorization": f"Bearer {TOKEN}"}, capture_all=True)
    ws.run_forever(timeout=30)
    assert ws.read_stdout() == "hello\n"
    assert ws.returncode == 4


def test_exec_refusals_and_run(node: Node, wait_for: Any) -> None:
    wait_for(lambda: _answers(node), 30.0, 0.1, "main port up")
    plain = node.get(f"{EXEC}?command=true&stdout=1")
    assert plain.status_code == 400 and "WebSocket" in plain.json()["message"]
    missing = node.get("/exec/default/no-such-pod/c?command=true&stdout=1",
                       headers={"Upgrade": "websocket", "Connection": "Upgrade",
                                "Sec-WebSocket-Protocol": "v5.channel.k8s.io",
                                "Sec-WebSocket-Version": "13",
                                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    assert missing.status_code == 404, missing.text
    run = requests.post(node.url("/run/default/talker-e2e/c?cmd=echo%20ran"), verify=node.ca,
                        headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert run.status_code == 200 and run.text == "ran\n"


@dataclass
class ExecTarget:
    """A running pod for ``podvisorctl exec`` (container ``c``) and its agent's rootDir."""

    root: str
    pod: str
    # a command that reads one line of stdin and ends: with v5 (the embedded runtime) the end
    # of podvisorctl's stdin closes the command's input, so ``cat`` ends; containerd speaks v4,
    # where the input stays open, so the command must end by itself
    reads_a_line: tuple[str, ...]


CTRD_POD = """apiVersion: v1
kind: Pod
metadata: {{name: shell}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: {image}
    imagePullPolicy: IfNotPresent
    command: [sh, -c, "trap 'exit 0' TERM; sleep 3600 & wait"]
"""


@pytest.fixture(params=["embedded", pytest.param("containerd", marks=pytest.mark.containerd)])
def exec_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ExecTarget]:
    """The module's embedded agent's talker, or a busybox pod on containerd (an agent of its
    own with ``runtimeEndpoint`` containerd; skipped without containerd; every sandbox it made
    and its pods' cgroup root are removed at the end)."""
    if request.param == "embedded":
        node: Node = request.getfixturevalue("node")
        yield ExecTarget(str(node.handle.paths.root), "talker", ("cat",))
        return
    from podvisor.services.cri import CriError, new_runtime_client
    from podvisor.services.syncloop import labels as L
    from tests.support.containerd import containerd_or_skip, remove_pod_cgroup

    ctrd = containerd_or_skip()
    agent = request.getfixturevalue("agent")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "shell.yaml").write_text(CTRD_POD.format(image=ctrd.image), "utf-8")
    ro_port = free_port()
    cgroup_root = f"/podvisor-test-{os.getpid()}-ctl-exec"
    uids: set[str] = set()
    cri = new_runtime_client(ctrd.endpoint, timeout=30.0)
    try:
        handle = agent(config=agent_config(manifests, ro_port, runtimeEndpoint=ctrd.endpoint,
                                           stopPodsOnExit=True, cgroupRoot=cgroup_root))
        pods = wait_for_impl(lambda: _running_pod(get_pods(ro_port), "shell-e2e"), 120.0, 0.2,
                             "the busybox pod running on containerd")
        uids.add(pods["metadata"]["uid"])
        yield ExecTarget(str(handle.paths.root), "shell", ("head", "-n", "1"))
        handle.stop()  # stopPodsOnExit: the pod goes with it
    finally:
        for sandbox in cri.list_pod_sandbox():
            if sandbox.labels.get(L.POD_UID) in uids:
                with contextlib.suppress(CriError):
                    cri.stop_pod_sandbox(sandbox.id)
                    cri.remove_pod_sandbox(sandbox.id)
        cri.close()
        remove_pod_cgroup(cgroup_root)


def _running_pod(podlist: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    for pod in (podlist or {}).get("items", []):
        if pod["metadata"]["name"] == name and all(
                "running" in c.get("state", {})
                for c in pod["status"].get("containerStatuses", [{}])):
            return dict(pod)
    return None


@pytest.mark.timeout(240)
def test_podvisorctl_exec(exec_target: ExecTarget) -> None:
    """Output, exit code, stdin, a missing pod and ``-t`` (a terminal, sized as podvisorctl's)
    on both runtimes (containerd through its own streaming server)."""
    ctl = [str(Path(sys.executable).parent / "podvisorctl"), "--root-dir", exec_target.root]
    pod = exec_target.pod
    done = subprocess.run([*ctl, "exec", pod, "--", "sh", "-c", "echo hi; echo oops >&2; "
                           "exit 5"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (5, "hi\n", "oops\n")
    piped = subprocess.run([*ctl, "exec", "-i", pod, "-c", "c", "--", *exec_target.reads_a_line],
                           input="through stdin\n", capture_output=True, text=True, timeout=60)
    assert (piped.returncode, piped.stdout) == (0, "through stdin\n"), piped.stderr
    missing = subprocess.run([*ctl, "exec", "nosuchpod", "--", "true"], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 2 and "no running pod nosuchpod" in missing.stderr
    # -t under a terminal (a pty here): the command gets one, sized as this terminal. The
    # size comes on the resize channel after the command started (containerd starts the
    # process, then applies resizes), so the command may see 0x0 first: busybox's stty then
    # fails (coreutils' prints "0 0"), hence its stderr is dropped while waiting
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
    script = ("test -t 0 && test -t 1 && echo tty; "
              "while [ \"$(stty size 2>/dev/null)\" != '33 111' ]; do :; done; echo sized; "
              "exit 4")
    proc = subprocess.Popen([*ctl, "exec", "-i", "-t", pod, "--", "sh", "-c", script],
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out = b""
    with contextlib.suppress(OSError):  # EIO once podvisorctl closed the terminal
        while chunk := os.read(master, 4096):
            out += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 4, out
    assert out.replace(b"\r", b"").splitlines() == [b"tty", b"sized"], out


def test_kill9_of_the_server_during_exec(node: Node, wait_for: Any) -> None:
    """The exec stream ends with the server process; the runtime then kills the command it
    was running for it; the port answers again; the talker is untouched."""
    import asyncio
    import ssl

    import aiohttp

    handle = node.handle
    wait_for(lambda: _answers(node), 30.0, 0.1, "main port up")
    talker_pid = read_pid(node.marks, "talker")
    ctx = ssl.create_default_context(cafile=node.ca)
    query = "command=sh&command=-c&command=echo%20%24%24%3B%20exec%20sleep%201000&stdout=1"

    async def run() -> tuple[int, aiohttp.WSMsgType]:
        async with aiohttp.ClientSession() as session, session.ws_connect(
                node.url(f"{EXEC}?{query}"), protocols=("v5.channel.k8s.io",), ssl=ctx,
                headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            first = await ws.receive()
            pid = int(first.data[1:])
            handle.call("kill", name="server", signal="KILL")
            last = await ws.receive()
            while last.type is aiohttp.WSMsgType.BINARY:  # nothing more should come
                last = await ws.receive()
            return pid, last.type
    pid, end = asyncio.run(run())
    assert end in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.ERROR)
    wait_for(lambda: process_gone(pid), 30.0, 0.05,
             "the exec'd command killed once its stream is gone")
    wait_for(lambda: _answers(node), 30.0, 0.02, "main port back after kill -9")
    assert read_pid(node.marks, "talker") == talker_pid


STREAMS = ["/exec/default/talker-e2e/c?command=true&output=1",
           "/attach/default/talker-e2e/c?output=1", "/portForward/default/talker-e2e"]


@pytest.mark.parametrize("path", STREAMS)
def test_stream_endpoints_need_credentials_and_an_upgrade(node: Node, path: str,
                                                          wait_for: Any) -> None:
    wait_for(lambda: _answers(node), 30.0, 0.1, "main port up")
    assert node.get(path, token=None).status_code == 401
    plain = node.get(path)
    assert plain.status_code == 400 and "upgrade" in plain.json()["message"], plain.text


def test_spdy_exec_with_a_token_and_a_protocol_refusal(node: Node, wait_for: Any) -> None:
    """SPDY through the main port with a bearer token; a protocol nobody serves is the
    runtime's 403 (httpstream.Handshake), passed on as a Status."""
    import asyncio
    import ssl

    from tests.support.spdy_client import spdy_exec

    wait_for(lambda: _answers(node), 30.0, 0.1, "main port up")
    ctx = ssl.create_default_context(cafile=node.ca)
    url = node.url("/exec/default/talker-e2e/c?command=sh&command=-c&command=echo%20s%3B%20"
                   "exit%202&output=1&error=1")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    got = asyncio.run(spdy_exec(url, headers=auth, ctx=ctx))
    assert (got.status_code, got.stdout) == (101, b"s\n"), got
    assert got.status["details"]["causes"][0]["message"] == "2"
    refused = asyncio.run(spdy_exec(url, headers=auth, ctx=ctx, protocols=("v9.nope",)))
    assert refused.status_code == 403, refused
    assert b"unable to negotiate protocol" in refused.body
