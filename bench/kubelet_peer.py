"""The kubelet as podvisor's peer on containerd (issue 30, part 2), not a test: prints figures.

Runs only when a kubelet binary is supplied: `PODVISOR_BENCH_KUBELET=/path/to/kubelet` (none
ships with Debian: its kubernetes-client package is kubectl alone). The kubelet runs standalone
(no kubeconfig: no API server, no node object) with static pods from a private `staticPodPath`,
on a PRIVATE containerd this script starts itself with deploy/containerd/start.sh and removes
with stop.sh --purge: a kubelet kills every pod sandbox on its runtime it does not know, so it
never shares a containerd with anything (the tests' or the podvisor stage's).

Its configuration (KubeletConfiguration v1beta1, written by `kubelet_config`):
- `makeIPTablesUtilChains: false`: it leaves the host's iptables alone (hostNetwork pods need
  none of its KUBE-* chains);
- read-only port and healthz on 127.0.0.1 free ports, the secure port on a free port of
  127.0.0.1 with anonymous access (nothing else listens), no webhook (there is no API server);
- `cgroupDriver: cgroupfs`, `cgroupRoot` = the private instance's CGROUP_PARENT (removed by
  stop.sh), `failSwapOn: false`, eviction thresholds at 0 (a loaded shared machine must not
  evict the bench's pods), image GC off (the images are imported, never pulled);
- the runtime endpoint: `containerRuntimeEndpoint` in the file from 1.27 on, the
  `--container-runtime=remote --container-runtime-endpoint` flags before (1.24-1.26).
With `protectKernelDefaults: false` (its default) the kubelet sets six kernel sysctls at start
(vm.overcommit_memory, vm.panic_on_oom, kernel.panic, kernel.panic_on_oops,
kernel.keys.root_maxkeys, kernel.keys.root_maxbytes): they are read before it starts and
written back after it stops, whatever happened (`Sysctls`).

Figures, the same as bench/containerd_pods.py's for podvisor (same manifests: hostNetwork,
busybox `sh -c` loop, imagePullPolicy IfNotPresent): 1 manifest -> Running in the kubelet's own
/pods (read-only port), N at once -> all Running, then K pods idle over `--windows` windows
measured from outside (bench/outside.py): the kubelet's process tree, and containerd with the
shims of its socket.

    PODVISOR_BENCH_KUBELET=/path/to/kubelet .venv/bin/python bench/kubelet_peer.py [-n 10]
        [--many 110] [--idle-pods 110] [--windows 5] [--window-seconds 60] [--settle 15]
        [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import outside  # noqa: E402
from containerd_pods import _running, _wait, runtime_group  # noqa: E402

from tests.support.lifecycle import free_port, get_pods  # noqa: E402 (containerd_pods: REPO on the path)

REPO = HERE.parent
DEPLOY = REPO / "deploy" / "containerd"
ENV = "PODVISOR_BENCH_KUBELET"
NODE = "bench"
# what the kubelet's container manager sets when protectKernelDefaults is false
SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
POD_LOGS = Path("/var/log/pods")  # where a kubelet before 1.29 writes the containers' logs
ABSENT = ("no kubelet binary on this machine: Debian packages only kubectl, as "
          "kubernetes-client")


def needs(env: dict[str, str] | None = None) -> str:
    """Why the kubelet peer cannot run here, or ""."""
    env = os.environ if env is None else env
    binary = env.get(ENV, "")
    if not binary:
        return f"{ENV} is not set ({ABSENT})"
    if not os.access(binary, os.X_OK):
        return f"{ENV}={binary} is not an executable file"
    if os.geteuid() != 0:
        return "the kubelet and its private containerd need root"
    if shutil.which("containerd") is None:
        return "containerd is not installed (deploy/containerd/setup.sh installs it)"
    return ""


def kubelet_version(binary: str) -> tuple[int, int]:
    """(major, minor) from `kubelet --version` ("Kubernetes v1.24.17")."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30,
                         check=False)
    found = re.search(r"v(\d+)\.(\d+)", out.stdout + out.stderr)
    if found is None:
        raise RuntimeError(f"{binary} --version said {(out.stdout + out.stderr).strip()[:200]!r}")
    return int(found.group(1)), int(found.group(2))


@dataclass(frozen=True)
class Ports:
    read_only: int
    secure: int
    healthz: int


def kubelet_config(version: tuple[int, int], static_pods: Path, endpoint: str,
                   cgroup_root: str, ports: Ports) -> dict[str, Any]:
    """The KubeletConfiguration (kubelet.config.k8s.io/v1beta1) of a standalone kubelet."""
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "staticPodPath": str(static_pods),
        "address": "127.0.0.1", "port": ports.secure, "readOnlyPort": ports.read_only,
        "healthzBindAddress": "127.0.0.1", "healthzPort": ports.healthz,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False,
        "cgroupDriver": "cgroupfs", "cgroupRoot": cgroup_root, "cgroupsPerQOS": True,
        "failSwapOn": False,
        "evictionHard": {"memory.available": "0%", "nodefs.available": "0%",
                         "nodefs.inodesFree": "0%", "imagefs.available": "0%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "maxPods": 250,
        "resolvConf": "/etc/resolv.conf",
    }
    if version >= (1, 27):
        config["containerRuntimeEndpoint"] = endpoint
    if version >= (1, 29):  # containers' logs beside its other files, not in /var/log/pods
        config["podLogsDir"] = str(static_pods.parent / "pod-logs")
    return config


def kubelet_argv(binary: str, version: tuple[int, int], config_path: Path, root_dir: Path,
                 endpoint: str) -> list[str]:
    argv = [binary, f"--config={config_path}", f"--root-dir={root_dir}",
            f"--cert-dir={root_dir / 'pki'}", f"--hostname-override={NODE}"]
    if version < (1, 27):
        argv += ["--container-runtime=remote", f"--container-runtime-endpoint={endpoint}"]
    return argv


class Sysctls:
    """The kernel settings the kubelet changes: read before it starts, written back after."""

    def __init__(self, root: Path = Path("/proc/sys"), names: tuple[str, ...] = SYSCTLS) -> None:
        self.root, self.names = root, names
        self.saved: dict[str, str] = {}

    def save(self) -> None:
        for name in self.names:
            with contextlib.suppress(OSError):
                self.saved[name] = (self.root / name).read_text().strip()

    def restore(self) -> list[str]:
        """Write back every value that changed; returns "name old -> restored" lines."""
        changed = []
        for name, value in self.saved.items():
            path = self.root / name
            try:
                now = path.read_text().strip()
                if now != value:
                    path.write_text(value + "\n")
                    changed.append(f"{name.replace('/', '.')} {now} -> {value}")
            except OSError as err:
                changed.append(f"{name.replace('/', '.')}: not restored ({err})")
        return changed


def cgroup_dirs(cgroup_fs: Path, relative: str) -> list[Path]:
    """`relative` in every mounted hierarchy (cgroup v1: one per controller; v2: the root)."""
    relative = relative.strip("/")
    if not relative or ".." in relative.split("/"):
        raise ValueError(f"refusing cgroup {relative!r}")
    if (cgroup_fs / "cgroup.procs").exists():
        return [cgroup_fs / relative]
    return [d / relative for d in sorted(cgroup_fs.iterdir())
            if d.is_dir() and not d.is_symlink() and (d / "cgroup.procs").exists()]


def remove_cgroup_tree(cgroup_fs: Path, relative: str) -> None:
    for top in cgroup_dirs(cgroup_fs, relative):
        if top.is_dir():
            for sub in sorted((p for p in top.rglob("*") if p.is_dir()),
                              key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()


@dataclass
class Kubelet:
    """One standalone kubelet: its files under `work`, its process, what it changed."""

    binary: str
    work: Path
    endpoint: str
    cgroup_root: str
    image: str
    sysctls: Sysctls = field(default_factory=Sysctls)
    cgroup_fs: Path = Path("/sys/fs/cgroup")
    proc: subprocess.Popen[bytes] | None = None
    version: tuple[int, int] = (0, 0)
    ports: Ports = field(default_factory=lambda: Ports(free_port(), free_port(), free_port()))
    pod_logs: Path = POD_LOGS
    logs_before: set[str] = field(default_factory=set)

    @property
    def manifests(self) -> Path:
        return self.work / "manifests"

    @property
    def log_path(self) -> Path:
        return self.work / "kubelet.log"

    def start(self, timeout: float = 120.0) -> None:
        self.version = kubelet_version(self.binary)
        self.manifests.mkdir(parents=True, exist_ok=True)
        (self.work / "staging").mkdir(exist_ok=True)
        config = kubelet_config(self.version, self.manifests, self.endpoint, self.cgroup_root,
                                self.ports)
        config_path = self.work / "kubelet.yaml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        for d in cgroup_dirs(self.cgroup_fs, self.cgroup_root):  # it must exist beforehand
            d.mkdir(parents=True, exist_ok=True)
        self.sysctls.save()  # before the kubelet can touch them
        self.logs_before = set(os.listdir(self.pod_logs)) if self.pod_logs.is_dir() else set()
        argv = kubelet_argv(self.binary, self.version, config_path, self.work / "root",
                            self.endpoint)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while get_pods(self.ports.read_only) is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the kubelet exited {self.proc.returncode} at start: "
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the kubelet's /pods did not answer within {timeout:.0f} "
                                   f"s: {self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def stage(self, name: str) -> Path:
        path = self.work / "staging" / f"{name}.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": self.image,
                                     "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", "trap 'exit 0' TERM; "
                                                 "while :; do sleep 1; done"]}]}}),
            encoding="utf-8")
        return path

    def drop(self, staged: Path) -> None:
        staged.rename(self.manifests / staged.name)

    def running(self) -> set[str]:
        return _running(get_pods(self.ports.read_only))

    def remove_all(self, timeout: float = 300.0) -> None:
        for path in self.manifests.glob("*.yaml"):
            path.unlink()

        def gone() -> bool:
            doc = get_pods(self.ports.read_only)
            return doc is not None and not doc.get("items")
        _wait("the kubelet's pods gone", gone, timeout, 0.1)

    def stop(self, grace: float = 30.0) -> list[str]:
        """SIGTERM (SIGKILL after `grace`) the kubelet by its PID, write the sysctls back,
        remove its cgroup root; returns what it had changed and was restored."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(grace)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            restored = self.sysctls.restore()
            remove_cgroup_tree(self.cgroup_fs, self.cgroup_root)
            self._remove_pod_logs()
        return restored

    def _remove_pod_logs(self) -> None:
        """The log folders its pods left in /var/log/pods (`default_<name>-bench_<uid>`, made
        while it ran); nothing else there is touched."""
        if self.proc is None or not self.pod_logs.is_dir():
            return
        for name in set(os.listdir(self.pod_logs)) - self.logs_before:
            if name.startswith("default_") and f"-{NODE}_" in name:
                shutil.rmtree(self.pod_logs / name, ignore_errors=True)


def start_containerd(directory: Path) -> dict[str, str]:
    """A private containerd in `directory` (deploy/containerd/start.sh); its instance.env."""
    out = subprocess.run([str(DEPLOY / "start.sh"), str(directory)], capture_output=True,
                         text=True, timeout=300, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"private containerd did not start: {out.stderr.strip()[-300:]}")
    pairs = (line.partition("=") for line in
             (directory / "instance.env").read_text().splitlines())
    return {key: value for key, _, value in pairs}


def stop_containerd(directory: Path) -> None:
    if (directory / "config.toml").exists():
        subprocess.run([str(DEPLOY / "stop.sh"), "--purge", str(directory)],
                       capture_output=True, text=True, timeout=300, check=False)
    shutil.rmtree(directory, ignore_errors=True)


def figures(kubelet: Kubelet, n: int, many: int, idle: int, windows: int, window_s: float,
            settle: float, socket_path: str,
            measure: Callable[..., dict[str, outside.Figures]] = outside.measure
            ) -> dict[str, Any]:
    """The figures of a started kubelet (see the module docstring)."""
    out: dict[str, Any] = {"version": "{}.{}".format(*kubelet.version)}
    singles = []
    for i in range(n + 1):
        staged = kubelet.stage(f"one{i}")
        t0 = time.monotonic()
        kubelet.drop(staged)
        _wait(f"one{i} running", lambda i=i: f"one{i}" in kubelet.running(), 120.0, 0.005)
        if i:  # the first is a warm-up
            singles.append(time.monotonic() - t0)
        kubelet.remove_all()
    out["one_s"] = singles
    staged = [kubelet.stage(f"many{i}") for i in range(many)]
    t0 = time.monotonic()
    for path in staged:
        kubelet.drop(path)
    _wait(f"{many} running", lambda: len(kubelet.running()) >= many, 600.0, 0.02)
    out["many_s"], out["many"] = time.monotonic() - t0, many
    kubelet.remove_all()
    if idle and windows:
        for path in [kubelet.stage(f"idle{i}") for i in range(idle)]:
            kubelet.drop(path)
        _wait(f"{idle} idle pods running", lambda: len(kubelet.running()) >= idle, 600.0, 0.5)
        time.sleep(settle)
        assert kubelet.proc is not None
        pid = kubelet.proc.pid
        groups = [outside.Group("kubelet (its whole tree)", outside.tree_selector(lambda: [pid])),
                  runtime_group(socket_path)]
        print(f"idle, {idle} pods under the kubelet, {outside.load()}", flush=True)
        measured = measure(groups, windows, window_s)
        print("\n".join(outside.report(measured)), flush=True)
        agent, runtime = (measured[g.label] for g in groups)
        out.update(idle=idle, idle_load=list(os.getloadavg()), agent_cpu_pct=agent.cpu_pct,
                   agent_pss_mb=agent.pss_mb, runtime_cpu_pct=runtime.cpu_pct,
                   runtime_pss_mb=runtime.pss_mb,
                   agent_by_process=agent.as_json()["by_process"])
        kubelet.remove_all()
    return out


def measure(binary: str, n: int, many: int, idle: int, windows: int, window_s: float,
            settle: float) -> dict[str, Any]:
    why = needs({ENV: binary}) if binary else needs()
    if why:
        return {"error": why}
    work = Path(tempfile.mkdtemp(prefix="pvbk", dir="/tmp"))  # short: a socket path lives here
    ctr_dir = work / "ctr"
    kubelet: Kubelet | None = None
    try:
        env = start_containerd(ctr_dir)
        endpoint = env["ENDPOINT"]
        kubelet = Kubelet(binary, work / "kubelet", endpoint, env["CGROUP_PARENT"], env["IMAGE"])
        kubelet.start()
        return figures(kubelet, n, many, idle, windows, window_s, settle,
                       endpoint.removeprefix("unix://"))
    except (RuntimeError, TimeoutError, OSError, subprocess.SubprocessError) as err:
        tail = kubelet.log_tail() if kubelet is not None else ""
        return {"error": f"{type(err).__name__}: {err}" + (f" (kubelet log: {tail})"
                                                           if tail else "")}
    finally:
        if kubelet is not None:
            for line in kubelet.stop():
                print(f"restored sysctl {line}", flush=True)
        stop_containerd(ctr_dir)  # also kills any pod the kubelet left
        if os.environ.get("PVBENCH_KEEP"):
            print(f"(kept {work})")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=10, help="single pods, one at a time")
    ap.add_argument("--many", type=int, default=110, help="pods dropped at once")
    ap.add_argument("--idle-pods", type=int, default=110)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--window-seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=15.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    out = measure(os.environ.get(ENV, ""), args.n, args.many, args.idle_pods, args.windows,
                  args.window_seconds, args.settle)
    out["load"] = [round(x, 2) for x in load]
    if args.json:
        print(json.dumps(out, sort_keys=True))
    elif "error" in out:
        print(f"kubelet: {out['error']}")
    else:
        print(json.dumps(out, indent=1, sort_keys=True))
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main())
