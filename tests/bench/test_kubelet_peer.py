"""bench/kubelet_peer.py without a kubelet (none exists on this machine): the configuration it
writes for each kubelet version, why its rows are empty when no binary is given, and its
process handling against a fake kubelet (a script answering `--version`, serving /pods on the
read-only port from the static pod folder, changing a sysctl of a /proc/sys copy, exiting on
SIGTERM). The real kubelet, containerd and the measured windows are the bench's, not the tests'.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import kubelet_peer as kp
import outside

FAKE = '''#!{python}
"""A fake kubelet: enough of one for bench/kubelet_peer.py's process handling."""
import http.server, json, os, signal, sys, threading
from pathlib import Path
import yaml

if "--version" in sys.argv:
    print("Kubernetes " + os.environ.get("FAKE_KUBELET_VERSION", "v1.24.17"))
    sys.exit(0)
if os.environ.get("FAKE_KUBELET_FAIL"):
    print("E1128 failed to run Kubelet: " + os.environ["FAKE_KUBELET_FAIL"], flush=True)
    sys.exit(1)
args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
config = yaml.safe_load(Path(args["config"]).read_text())
Path(args["root-dir"]).mkdir(parents=True, exist_ok=True)
(Path(args["root-dir"]) / "argv.json").write_text(json.dumps(sys.argv[1:]))
sysctl = Path(os.environ["FAKE_SYSCTL_ROOT"]) / "vm" / "overcommit_memory"
sysctl.write_text("1\\n")  # what a kubelet without protectKernelDefaults does

class Pods(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        items = [{{"metadata": {{"name": p.stem + "-bench"}},
                   "status": {{"containerStatuses": [{{"state": {{"running": {{}}}}}}]}}}}
                 for p in sorted(Path(config["staticPodPath"]).glob("*.yaml"))]
        body = json.dumps({{"kind": "PodList", "items": items}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", config["readOnlyPort"]), Pods)
signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
server.serve_forever()
'''


@pytest.fixture
def fake_kubelet(tmp_path: Path) -> str:
    path = tmp_path / "kubelet"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def sysctl_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "sys"
    for name, value in (("vm/overcommit_memory", "0"), ("kernel/panic", "0")):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(value + "\n")
    monkeypatch.setenv("FAKE_SYSCTL_ROOT", str(root))
    return root


def _kubelet(binary: str, tmp_path: Path, sysctl_root: Path) -> kp.Kubelet:
    cgroup_fs = tmp_path / "cgroup"
    for controller in ("cpu", "memory"):  # two cgroup v1 hierarchies
        (cgroup_fs / controller).mkdir(parents=True)
        (cgroup_fs / controller / "cgroup.procs").write_text("")
    return kp.Kubelet(binary, tmp_path / "work", "unix:///ctr/run/containerd.sock",
                      "/pvb-kubelet-test", "localhost/podvisor/busybox:1",
                      sysctls=kp.Sysctls(sysctl_root, ("vm/overcommit_memory", "kernel/panic")),
                      cgroup_fs=cgroup_fs, pod_logs=tmp_path / "var-log-pods")


def test_the_config_of_a_1_24_kubelet_and_its_runtime_flags(tmp_path: Path) -> None:
    ports = kp.Ports(read_only=10001, secure=10002, healthz=10003)
    config = kp.kubelet_config((1, 24), tmp_path / "manifests", "unix:///c.sock", "/pvb", ports)
    assert config["apiVersion"] == "kubelet.config.k8s.io/v1beta1"
    assert config["kind"] == "KubeletConfiguration"
    assert config["makeIPTablesUtilChains"] is False
    assert config["staticPodPath"] == str(tmp_path / "manifests")
    assert (config["readOnlyPort"], config["port"], config["healthzPort"]) == (10001, 10002, 10003)
    assert config["address"] == config["healthzBindAddress"] == "127.0.0.1"
    assert (config["cgroupDriver"], config["cgroupRoot"]) == ("cgroupfs", "/pvb")
    assert config["authorization"] == {"mode": "AlwaysAllow"}
    assert config["authentication"]["webhook"] == {"enabled": False}
    assert set(config["evictionHard"].values()) == {"0%"}
    assert "containerRuntimeEndpoint" not in config and "podLogsDir" not in config
    argv = kp.kubelet_argv("/k", (1, 24), tmp_path / "k.yaml", tmp_path / "root", "unix:///c")
    assert "--container-runtime=remote" in argv
    assert "--container-runtime-endpoint=unix:///c" in argv
    assert f"--config={tmp_path / 'k.yaml'}" in argv
    assert "--hostname-override=bench" in argv
    assert not any(a.startswith("--kubeconfig") for a in argv)  # standalone


def test_from_1_27_the_runtime_endpoint_is_in_the_file_and_the_flags_are_gone(
        tmp_path: Path) -> None:
    ports = kp.Ports(1, 2, 3)
    config = kp.kubelet_config((1, 29), tmp_path / "m", "unix:///c.sock", "/pvb", ports)
    assert config["containerRuntimeEndpoint"] == "unix:///c.sock"
    assert config["podLogsDir"] == str(tmp_path / "pod-logs")
    argv = kp.kubelet_argv("/k", (1, 27), tmp_path / "k.yaml", tmp_path / "root", "unix:///c")
    assert not any(a.startswith("--container-runtime") for a in argv)


def test_without_a_binary_the_rows_say_why(tmp_path: Path) -> None:
    assert "PODVISOR_BENCH_KUBELET is not set" in kp.needs({})
    assert "only kubectl" in kp.needs({})
    (tmp_path / "kubelet").write_text("")
    assert "is not an executable file" in kp.needs({kp.ENV: str(tmp_path / "kubelet")})


def test_the_version_is_read_from_the_binary(fake_kubelet: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert kp.kubelet_version(fake_kubelet) == (1, 24)
    monkeypatch.setenv("FAKE_KUBELET_VERSION", "v1.31.2")
    assert kp.kubelet_version(fake_kubelet) == (1, 31)


def test_a_kubelet_runs_pods_and_stops_leaving_the_sysctls_and_cgroups_as_found(
        fake_kubelet: str, tmp_path: Path, sysctl_root: Path) -> None:
    kubelet = _kubelet(fake_kubelet, tmp_path, sysctl_root)
    try:
        kubelet.start(timeout=60.0)
        assert kubelet.proc is not None
        written = yaml.safe_load((kubelet.work / "kubelet.yaml").read_text())
        assert written["makeIPTablesUtilChains"] is False
        assert (tmp_path / "cgroup" / "cpu" / "pvb-kubelet-test").is_dir()
        assert (sysctl_root / "vm" / "overcommit_memory").read_text() == "1\n"  # it changed it

        def fake_measure(groups: list[outside.Group], windows: int,
                         seconds: float) -> dict[str, outside.Figures]:
            assert [len(kubelet.running())] == [2]  # the idle pods, all running
            return {g.label: outside.Figures(g.label, [1.0] * windows, [80.0] * windows)
                    for g in groups}

        out = kp.figures(kubelet, n=2, many=3, idle=2, windows=2, window_s=1.0, settle=0.0,
                         socket_path="/ctr/run/containerd.sock", measure=fake_measure)
        assert out["version"] == "1.24"
        assert len(out["one_s"]) == 2 and out["many"] == 3
        assert out["agent_cpu_pct"] == [1.0, 1.0] and out["runtime_pss_mb"] == [80.0, 80.0]
        assert not list(kubelet.manifests.glob("*.yaml"))  # every pod removed after
    finally:
        restored = kubelet.stop(grace=30.0)
    assert kubelet.proc.returncode == 0  # SIGTERM, not SIGKILL
    assert restored == ["vm.overcommit_memory 1 -> 0"]
    assert (sysctl_root / "vm" / "overcommit_memory").read_text() == "0\n"
    assert not (tmp_path / "cgroup" / "cpu" / "pvb-kubelet-test").exists()
    assert not (tmp_path / "cgroup" / "memory" / "pvb-kubelet-test").exists()


def test_a_kubelet_failing_at_start_says_why_and_changes_nothing_left(
        fake_kubelet: str, tmp_path: Path, sysctl_root: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_KUBELET_FAIL", "unknown flag: --container-runtime")
    kubelet = _kubelet(fake_kubelet, tmp_path, sysctl_root)
    with pytest.raises(RuntimeError, match=r"exited 1 at start.*unknown flag"):
        kubelet.start(timeout=60.0)
    assert kubelet.stop() == []
    assert not (tmp_path / "cgroup" / "cpu" / "pvb-kubelet-test").exists()


def test_only_the_log_folders_of_its_own_pods_are_removed(
        fake_kubelet: str, tmp_path: Path, sysctl_root: Path) -> None:
    kubelet = _kubelet(fake_kubelet, tmp_path, sysctl_root)
    logs = tmp_path / "var-log-pods"
    (logs / "kube-system_other_1").mkdir(parents=True)
    try:
        kubelet.start(timeout=60.0)
        (logs / "default_one0-bench_abc").mkdir()
        (logs / "default_someone_def").mkdir()
    finally:
        kubelet.stop()
    assert sorted(os.listdir(logs)) == ["default_someone_def", "kube-system_other_1"]
