"""End to end: RunOnce (`podvisor run --runonce`, `runOnce: true`) with the real agent.

- Three pods (one that exits 0, one long-running, one whose image the embedded runtime does not
  have): one result line each on stdout, exit 1 naming the failed pod; the long-running pod is
  left running, and the command the agent prints stops it (run as printed).
- Only good pods: exit 0.
- The embedded runtime killed (SIGKILL) mid-run: the supervisor restarts it and the run finishes.
- SIGINT mid-run: exit 1, "stopped before every pod was run", the pod left running.
- On containerd (only when PODVISOR_CONTAINERD_ENDPOINT is set): a busybox pod, then the printed
  stop command removes it from containerd.
Only the runtime, the file source and the RunOnce driver run: no sync loop, no HTTP server.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.syncloop import labels as L
from tests.conftest import BIN, short_tmp_dir
from tests.support.lifecycle import kill_pids, marked, pid_alive, pod_yaml, read_pid

STOP_HINT = re.compile(r"stop them with `([^`]+)`")


@dataclass
class Run:
    root: Path
    manifests: Path
    marks: Path
    config: Path

    def write_config(self, **extra: Any) -> None:
        cfg = {"nodeName": "e2e", "rootDir": str(self.root / "root"),
               "staticPodPath": str(self.manifests), "runOnceMaxRetries": 4,
               "runOnceRetryDelay": "200ms",
               "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"},
               **extra}
        self.config.write_text(yaml.safe_dump(cfg), "utf-8")

    def pod(self, name: str, command: str, **kw: Any) -> None:
        (self.manifests / f"{name}.yaml").write_text(pod_yaml(name, command, **kw), "utf-8")

    def podvisor(self, timeout: float = 150.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "podvisor"), "run", "--config", str(self.config),
                               "--runonce"], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, start_new_session=True)

    def processes_run(self) -> set[str]:
        lines = (self.root / "root" / "logs" / "supervisor.log").read_text().splitlines()
        return {e["process"] for e in map(json.loads, lines) if e["event"] == "process.state"}


@pytest.fixture
def run() -> Iterator[Run]:
    root = short_tmp_dir("pvro")
    r = Run(root, root / "m", root / "marks", root / "config.yaml")
    r.manifests.mkdir()
    r.marks.mkdir()
    yield r
    kill_pids([p for n in ("good", "slow") if (p := read_pid(r.marks, n)) and pid_alive(p)])
    shutil.rmtree(root, ignore_errors=True)


def results(stdout: str) -> dict[str, str]:
    """pod -> the rest of its result line."""
    out = {}
    for line in stdout.splitlines():
        m = re.fullmatch(r"pod (\S+): (.*)", line)
        assert m is not None, f"not a result line: {line!r}"
        out[m.group(1)] = m.group(2)
    return out


def stop_with_the_printed_command(stderr: str) -> subprocess.CompletedProcess[str]:
    found = STOP_HINT.search(stderr)
    assert found is not None, stderr[-2000:]
    done = subprocess.run(shlex.split(found.group(1)), capture_output=True, text=True,
                          timeout=120, cwd="/")
    assert done.returncode == 0, (found.group(1), done.stdout, done.stderr)
    return done


@pytest.mark.timeout(200)
def test_three_pods_one_line_each_nonzero_exit_naming_the_failed_one(run: Run) -> None:
    run.write_config()
    run.pod("good", marked(run.marks, "good"))
    run.pod("done", "exit 0", policy="Never")
    run.pod("bad", "sleep 3600", image="nosuch:1")
    out = run.podvisor()
    assert out.returncode == 1, (out.stdout, out.stderr[-3000:])
    lines = results(out.stdout)
    assert set(lines) == {"default/good-e2e", "default/done-e2e", "default/bad-e2e"}, out.stdout
    assert re.fullmatch(r"running after \d tr(y|ies)", lines["default/good-e2e"])
    assert re.fullmatch(r"(running|succeeded) after \d tr(y|ies)", lines["default/done-e2e"])
    assert lines["default/bad-e2e"].startswith("failed after 4 tries: containers not running")
    assert "ErrImagePull" in lines["default/bad-e2e"] and "nosuch:1" in lines["default/bad-e2e"]
    assert "podvisor: runonce: 1 of 3 pods failed: default/bad-e2e" in out.stderr
    assert run.processes_run() == {"runtime", "source-file", "runonce"}
    good = read_pid(run.marks, "good")
    assert good is not None and pid_alive(good), "the pods are left running"

    done = stop_with_the_printed_command(out.stderr)
    assert "stopped pod default/good-e2e" in done.stdout
    assert not pid_alive(good)


@pytest.mark.timeout(200)
def test_only_good_pods_exit_zero(run: Run) -> None:
    run.write_config()
    run.pod("good", marked(run.marks, "good"))
    run.pod("done", "exit 0", policy="OnFailure")
    out = run.podvisor()
    assert out.returncode == 0, (out.stdout, out.stderr[-3000:])
    assert set(results(out.stdout)) == {"default/good-e2e", "default/done-e2e"}
    assert "podvisor: runonce: 2 pods started; 2 pods left running" in out.stderr
    good = read_pid(run.marks, "good")
    assert good is not None and pid_alive(good)
    stop_with_the_printed_command(out.stderr)
    assert not pid_alive(good)


@pytest.mark.timeout(200)
def test_the_runtime_killed_mid_run_is_restarted_and_the_run_finishes(
        agent: Any, run: Run, wait_for: Any) -> None:
    # the pod's init container waits for a file the test writes once the runtime was killed
    # and restarted: the run cannot finish before
    gate = run.marks / "go"
    init = (f"echo $$$$ > {run.marks}/init.pid; while [ ! -e {gate} ]; do sleep 0.1; done")
    manifest = yaml.safe_load(pod_yaml("slow", marked(run.marks, "slow")))
    manifest["spec"]["initContainers"] = [
        {"name": "wait", "image": "host", "command": ["sh", "-c", init]}]
    (run.manifests / "slow.yaml").write_text(yaml.safe_dump(manifest), "utf-8")
    cfg = {"nodeName": "e2e", "rootDir": str(run.root / "root"),
           "staticPodPath": str(run.manifests), "runOnce": True, "runOnceRetryDelay": "200ms",
           "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}}
    handle = agent(config=cfg, wait=False)
    wait_for(lambda: read_pid(run.marks, "init"), 60.0, 0.05, "the init container to run")
    assert handle.ctl("kill", "runtime").returncode == 0  # SIGKILL
    handle.wait_state("runtime", "RUNNING", 30.0, where=lambda row: row["restarts"] >= 1)
    gate.touch()
    assert handle.proc.wait(150) == 0, handle.stderr()[-3000:]
    output = handle.stderr()
    assert re.search(r"^pod default/slow-e2e: running after \d+ tr(y|ies)$", output, re.M), \
        output[-3000:]
    assert "podvisor: runonce: 1 pod started" in output
    slow = read_pid(run.marks, "slow")
    assert slow is not None and pid_alive(slow)
    stop_with_the_printed_command(output)
    assert not pid_alive(slow)


@pytest.mark.containerd
@pytest.mark.timeout(200)
def test_runonce_on_containerd(run: Run) -> None:
    endpoint = os.environ.get("PODVISOR_CONTAINERD_ENDPOINT")
    if not endpoint:
        pytest.skip("PODVISOR_CONTAINERD_ENDPOINT is not set")
    from tests.support.containerd import containerd_or_skip, remove_pod_cgroup

    containerd_or_skip()
    examples = Path(__file__).resolve().parents[3] / "deploy" / "examples" / "containerd"
    shutil.copy(examples / "logger.yaml", run.manifests / "logger.yaml")
    cgroup_root = f"/podvisor-test-{secrets.token_hex(4)}"
    run.write_config(runtimeEndpoint=endpoint, cgroupRoot=cgroup_root)
    cri = new_runtime_client(endpoint, timeout=30.0)

    def ours() -> list[Any]:
        return [s for s in cri.list_pod_sandbox()
                if s.labels.get(L.POD_NAME) == "logger-e2e"
                and s.labels.get(L.POD_NAMESPACE) == "default"
                and s.annotations.get("kubernetes.io/config.source", "file") == "file"]

    foreign_uid = f"not-ours-{secrets.token_hex(4)}"  # another client's pod on the same runtime
    foreign = cri.run_pod_sandbox(pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="foreign", uid=foreign_uid, namespace="default"),
        hostname="", labels=L.pod_labels("foreign", "default", foreign_uid),
        log_directory=str(run.root / "foreign-logs"),
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER)))))
    try:
        out = run.podvisor()
        assert out.returncode == 0, (out.stdout, out.stderr[-3000:])
        line = results(out.stdout)["default/logger-e2e"]
        assert re.fullmatch(r"running after \d tr(y|ies)", line), line
        if not ours():  # see the note below
            pytest.skip("another agent on the shared containerd removed the pod first")
        done = stop_with_the_printed_command(out.stderr)
        assert "stopped pod default/logger-e2e" in done.stdout
        assert "stopped 1 pod " in done.stdout
        assert ours() == []
        # Only this rootDir's pods are touched. (Whether the foreign sandbox is still there says
        # nothing: another agent's sync loop on the same containerd removes every pod it does
        # not know, as the kubelet does on a runtime it owns.)
        ctl_log = (run.root / "root" / "logs" / "podvisorctl.log").read_text()
        assert foreign_uid not in done.stdout and foreign_uid not in ctl_log
    finally:
        try:
            cri.stop_pod_sandbox(foreign)
            cri.remove_pod_sandbox(foreign)
        except CriError:
            pass  # gone already
        for sandbox in ours():
            try:
                cri.stop_pod_sandbox(sandbox.id)
                cri.remove_pod_sandbox(sandbox.id)
            except CriError:
                pass
        remove_pod_cgroup(cgroup_root)
        cri.close()


@pytest.mark.timeout(120)
def test_sigint_interrupts_the_run(agent: Any, run: Run, wait_for: Any) -> None:
    """Ctrl-C during RunOnce: the agent stops at once, says the run did not finish, exits 1;
    the pod it started is left running (stopped here by the printed-style command)."""
    gate = run.marks / "never"
    init = f"echo $$$$ > {run.marks}/init.pid; while [ ! -e {gate} ]; do sleep 0.1; done"
    manifest = yaml.safe_load(pod_yaml("slow", marked(run.marks, "slow")))
    manifest["spec"]["initContainers"] = [
        {"name": "wait", "image": "host", "command": ["sh", "-c", init]}]
    (run.manifests / "slow.yaml").write_text(yaml.safe_dump(manifest), "utf-8")
    cfg = {"nodeName": "e2e", "rootDir": str(run.root / "root"),
           "staticPodPath": str(run.manifests), "runOnce": True,
           "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}}
    handle = agent(config=cfg, wait=False)
    init_pid = wait_for(lambda: read_pid(run.marks, "init"), 60.0, 0.05, "the init container")
    handle.proc.send_signal(signal.SIGINT)
    assert handle.proc.wait(60) == 1
    assert "podvisor: runonce: stopped before every pod was run" in handle.stderr()
    assert pid_alive(init_pid)  # pods are never stopped by the agent's exit
    done = subprocess.run([str(BIN / "podvisorctl"), "--root-dir", str(run.root / "root"),
                           "shutdown", "--pods"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done
    assert not pid_alive(init_pid)
