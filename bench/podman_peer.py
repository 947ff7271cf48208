"""podman as a benchmark peer: `podman kube play` runs the same Pod YAML on one host, without a
cluster (not a test; prints figures).

The manifests are bench/pods_agent.py's (`sleep`, restartPolicy Always, IfNotPresent) with two
changes podman needs: the image is the local busybox image instead of the embedded runtime's
`host`, and `hostNetwork: true` (no CNI/netavark network to set up, as podvisor's pods have none).

Everything podman keeps lives in one private temp root (`/tmp/pvpodman*`): its storage
(`--root`, `--runroot`, a private storage.conf through CONTAINERS_STORAGE_CONF), its own
containers.conf (CONTAINERS_CONF: `[engine] infra_image` = the local pause image, tmp_dir,
events log, volume and network dirs inside the temp root, cgroupfs; `[containers]
default_ulimits` for nofile/nproc within this process's hard limits: podman's defaults fail with
"error setting rlimit type 7" in a sandbox with a lower hard limit). The images are the project's
own offline OCI archives (deploy/containerd/build_images.py: a static pause built from
deploy/containerd/pause.c with `gcc -static`, and the host's static busybox), built once under
~/.cache/podvisor/bench-peers/podman and loaded with `podman load`. Needs root (rootless podman
needs subuids and a user namespace).

Figures: 1 manifest -> `podman kube play` returned with the pod running (`-n` samples, each pod
removed after); N manifests at once (one multi-document `kube play`: podman starts them one after
the other) -> returned; kill -9 of a pod's container process -> the replacement's exec (the
kernel's process connector, bench/proc_events.py, as for podvisor; psutil polling every 5 ms
without root's connector), one fresh pod per kill; idle CPU and resident memory of podman's
processes with K pods running (podman has no daemon: one `conmon` per container, infra included).

Cleanup, always (also after a failure or SIGTERM): `podman pod rm -f -t 0` of every pod (five
at a time), then every process whose command line names the temp root (conmon) is killed by PID
with its children, every mount under the temp root is detached, the temp root is removed, and
so are the pods' cgroups that podman leaves in the named and unified hierarchies of a cgroup v1
host (empty dirs only), and `libpod_parent` when this run created it and it is empty.

    .venv/bin/python bench/podman_peer.py [--many 40] [--idle-pods 40] [-n 3] [-k 3]
        [--idle-seconds 10] [--json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import importlib.util
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pods_idle import measure_idle
from proc_events import ExecWatcher

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "containerd"
CACHE = Path(os.environ.get("PVBENCH_PODMAN_CACHE",
                            Path.home() / ".cache" / "podvisor" / "bench-peers" / "podman"))
BUSYBOX_IMAGE = "localhost/podvisor/busybox:1"
PAUSE_IMAGE = "localhost/podvisor/pause:1"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "libpod_parent"  # podman's default parent with the cgroupfs manager
MNT_DETACH = 2
RM_WORKERS = 5
MANIFEST = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {image}
    imagePullPolicy: IfNotPresent
    command: ["sleep", "{seconds}"]
"""


class PodmanError(RuntimeError):
    """podman cannot run here, or a command of it failed: the message says why."""


def why_not() -> str:
    """Why this peer cannot run on this machine, or ""."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman; .ci/test-packages.txt)"
    if os.geteuid() != 0:
        return "needs root (rootless podman needs subuids and a user namespace)"
    return ""


def _limit(which: int, want: int) -> int:
    hard = resource.getrlimit(which)[1]
    return want if hard == resource.RLIM_INFINITY else min(want, hard)


def containers_conf(tmp: Path) -> str:
    """podman's containers.conf for a private run under ``tmp``."""
    nofile = _limit(resource.RLIMIT_NOFILE, 1048576)
    # more processes than pid_max cannot exist; a higher nproc fails here ("type 6")
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = 32768
    nproc = _limit(resource.RLIMIT_NPROC, pid_max)
    return (
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        f'infra_image = "{PAUSE_IMAGE}"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'events_logfile_path = "{tmp / "events.log"}"\n'
        f'tmp_dir = "{tmp / "tmp"}"\n'
        f'volume_path = "{tmp / "volumes"}"\n'
        f'static_dir = "{tmp / "libpod"}"\n'
        "[network]\n"
        f'network_config_dir = "{tmp / "networks"}"\n'
    )


def storage_conf(tmp: Path) -> str:
    return (f'[storage]\ndriver = "overlay"\ngraphroot = "{tmp / "root"}"\n'
            f'runroot = "{tmp / "runroot"}"\n')


def _build_images_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_images", DEPLOY / "build_images.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_images"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def ensure_images() -> tuple[Path, Path]:
    """(pause.tar, busybox.tar): OCI archives under CACHE, built once (reproducible bytes)."""
    busybox = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if Path(p).is_file()), "")
    if not busybox:
        raise PodmanError("no static busybox on this machine (apt-get install busybox-static)")
    CACHE.mkdir(parents=True, exist_ok=True)
    pause = CACHE / "pause"
    if not pause.exists() or (DEPLOY / "pause.c").stat().st_mtime > pause.stat().st_mtime:
        if shutil.which("gcc") is None:
            raise PodmanError("gcc is needed once to build the static pause binary")
        subprocess.run(["gcc", "-static", "-O2", "-o", f"{pause}.tmp", str(DEPLOY / "pause.c")],
                       check=True, capture_output=True, timeout=120)
        os.replace(f"{pause}.tmp", pause)
    build = _build_images_module()
    build.write_if_changed(CACHE / "pause.tar", build.pause_image(pause))
    build.write_if_changed(CACHE / "busybox.tar", build.busybox_image(Path(busybox)))
    return CACHE / "pause.tar", CACHE / "busybox.tar"


class Podman:
    """One private podman under a fresh temp root; `close()` removes every trace of it."""

    def __init__(self) -> None:
        why = why_not()
        if why:
            raise PodmanError(why)
        self.tmp = Path(tempfile.mkdtemp(prefix="pvpodman", dir="/tmp"))
        self.cgroups_before = set(_parents())
        self.pod_ids: set[str] = set()
        (self.tmp / "containers.conf").write_text(containers_conf(self.tmp), encoding="utf-8")
        (self.tmp / "storage.conf").write_text(storage_conf(self.tmp), encoding="utf-8")
        self.env = {**os.environ, "CONTAINERS_CONF": str(self.tmp / "containers.conf"),
                    "CONTAINERS_STORAGE_CONF": str(self.tmp / "storage.conf")}
        self.seq = 0

    def run(self, *args: str, timeout: float = 300.0) -> str:
        cmd = ["podman", "--root", str(self.tmp / "root"), "--runroot",
               str(self.tmp / "runroot"), "--storage-driver", "overlay", *args]
        try:
            out = subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                                 timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise PodmanError(f"podman {' '.join(args[:2])}: no answer in {timeout:.0f} s") from exc
        if out.returncode != 0:
            tail = (out.stderr.strip() or out.stdout.strip()).splitlines()[-1:] or ["no output"]
            raise PodmanError(f"podman {' '.join(args[:2])} exited {out.returncode}: {tail[0]}")
        return out.stdout

    def load_images(self) -> None:
        for archive in ensure_images():
            self.run("load", "-q", "-i", str(archive))

    def manifest(self, names: list[str]) -> Path:
        """One YAML file with one Pod document per name (each `sleep` has its own argument)."""
        docs = []
        for name in names:
            self.seq += 1
            docs.append(MANIFEST.format(name=name, image=BUSYBOX_IMAGE, seconds=3600 + self.seq))
        path = self.tmp / f"play{self.seq}.yaml"
        path.write_text("---\n".join(docs), encoding="utf-8")
        return path

    def play(self, names: list[str]) -> float:
        """Seconds from `podman kube play` to its return (every pod's container started)."""
        path = self.manifest(names)
        t0 = time.monotonic()
        out = self.run("kube", "play", str(path), timeout=60.0 + 10.0 * len(names))
        spent = time.monotonic() - t0
        lines = out.splitlines()
        self.pod_ids.update(lines[i + 1].strip() for i, line in enumerate(lines[:-1])
                            if line.strip() == "Pod:")
        return spent

    def pods(self) -> list[str]:
        return self.run("pod", "ps", "-q", "--no-trunc").split()

    def rm_pods(self, names: list[str]) -> None:
        """Remove these pods (names or IDs), one `pod rm` per pod, RM_WORKERS at a time: one
        `pod rm` of many pods takes ~2 s per pod here, in parallel ~0.35 s."""
        with concurrent.futures.ThreadPoolExecutor(RM_WORKERS) as pool:
            list(pool.map(lambda name: self.run("pod", "rm", "-f", "-t", "0", name,
                                                timeout=120.0), names))

    def app_pid(self, pod: str) -> int:
        return int(self.run("inspect", "--format", "{{.State.Pid}}", f"{pod}-app").strip())

    def processes(self) -> list[psutil.Process]:
        """podman's processes of this run: every conmon (its command line names the root)."""
        out = []
        root = str(self.tmp)
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if root in " ".join(proc.info["cmdline"] or []):
                    out.append(proc)
        return out

    def close(self) -> list[str]:
        """Remove every pod, process, mount and file of this run; what had to be forced."""
        forced: list[str] = []
        if (self.tmp / "root").exists():
            try:
                ids = self.pods()
                self.pod_ids.update(ids)
                self.rm_pods(ids)
                left = self.pods()
                if left:
                    forced.append(f"pods left after pod rm: {left}")
                    self.run("pod", "rm", "-a", "-f", "-t", "0")
            except PodmanError as exc:
                forced.append(str(exc))
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                for child in [*proc.children(recursive=True), proc]:
                    forced.append(f"killed {child.pid} {child.name()}")
                    child.kill()
        forced += self._unmount()
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.tmp.exists():
            forced.append(f"{self.tmp} could not be removed")
        # podman removes a pod's cgroups from the controllers it uses, not from the named
        # (name=systemd) and unified hierarchies of a cgroup v1 host: only empty dirs go
        for parent in _parents():
            for pod_id in self.pod_ids:
                _rmdir_tree(parent / pod_id)
            if parent not in self.cgroups_before:
                with contextlib.suppress(OSError):
                    parent.rmdir()  # podman makes it again when needed
        return forced

    def _unmount(self) -> list[str]:
        prefix = str(self.tmp) + "/"
        mounts = []
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4].replace("\\040", " ")
                if point.startswith(prefix):
                    mounts.append(point)
        libc = ctypes.CDLL(None, use_errno=True)
        out = []
        for point in sorted(mounts, key=len, reverse=True):
            if libc.umount2(point.encode(), MNT_DETACH) == 0:
                out.append(f"unmounted {point}")
        return out


def _parents() -> list[Path]:
    """podman's cgroup parent in every hierarchy (v1 controllers, named, unified; or v2)."""
    return [p for p in (CGROUP_ROOT / CGROUP_PARENT, *CGROUP_ROOT.glob(f"*/{CGROUP_PARENT}"))
            if p.is_dir()]


def _rmdir_tree(top: Path) -> None:
    if not top.is_dir():
        return
    for dirpath, _dirs, _files in os.walk(top, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


def _exec_after_kill(pod: Podman, name: str, execs: ExecWatcher | None) -> float:
    pid = pod.app_pid(name)
    argv = tuple(psutil.Process(pid).cmdline())
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    if execs is not None:
        return execs.wait(lambda e: e.argv == argv and e.pid != pid, t0, 30.0).ts - t0
    deadline = t0 + 30.0
    while time.monotonic() < deadline:
        for proc in psutil.process_iter(["cmdline"]):
            if proc.pid != pid and tuple(proc.info["cmdline"] or ()) == argv:
                return time.monotonic() - t0
        time.sleep(0.005)
    raise PodmanError(f"{name}: no replacement process 30 s after kill -9")


def measure(many: int, idle_pods: int, samples: int, kills: int,
            idle_seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"many": many, "idle_pods": min(idle_pods, many)}
    pod = Podman()
    out["root"] = str(pod.tmp)
    execs = ExecWatcher.open()
    try:
        out["version"] = pod.run("version", "--format", "{{.Client.Version}}").strip()
        pod.load_images()
        one = []
        for i in range(samples):
            one.append(pod.play([f"one{i}"]))
            pod.rm_pods([f"one{i}"])
        out["one_s"] = one
        names = [f"pm{i}" for i in range(many)]
        out["many_s"] = pod.play(names)
        out["kill_s"] = [_exec_after_kill(pod, names[i % many], execs) for i in range(kills)]
        if out["idle_pods"] < many:
            pod.rm_pods(names[out["idle_pods"]:])
        if idle_seconds > 0:
            time.sleep(min(3.0, idle_seconds))  # the restarts' cleanup processes finish
            [usage] = measure_idle([("podman", pod.processes)], idle_seconds)
            out["idle_cpu_pct"], out["idle_resident_mb"] = usage.cpu_percent, usage.resident_mb
            out["idle_rss_sum_mb"], out["idle_procs"] = usage.rss_mb, usage.processes
    except (PodmanError, TimeoutError, psutil.Error, OSError, ValueError,
            subprocess.SubprocessError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if execs is not None:
            execs.close()
        forced = pod.close()
        if forced:
            out["cleanup_forced"] = forced
        out["pod_ids"] = sorted(pod.pod_ids)
    return out


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM (python -m bench stopping a stage) unwinds through the cleanup."""
    def stop(_sig: int, _frame: object) -> None:
        raise SystemExit(143)
    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--many", type=int, default=40, help="pods in one `kube play`")
    ap.add_argument("--idle-pods", type=int, default=40, help="pods kept for the idle window")
    ap.add_argument("-n", type=int, default=3, help="single-pod samples")
    ap.add_argument("-k", type=int, default=3, help="kill -9 samples")
    ap.add_argument("--idle-seconds", type=float, default=10.0, help="0: no idle window")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    why = why_not()
    if why:
        figures: dict[str, Any] = {"error": why}
    else:
        with _sigterm_as_exit():
            figures = measure(args.many, args.idle_pods, args.n, args.k, args.idle_seconds)
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    elif "error" in figures:
        print(f"podman: {figures['error']}")
    else:
        one = [s * 1e3 for s in figures["one_s"]]
        kill = [s * 1e3 for s in figures["kill_s"]]
        print(f"podman {figures['version']}: 1 manifest -> running (kube play) p50 "
              f"{statistics.median(one):.0f} ms (n={len(one)}); {args.many} at once "
              f"{figures['many_s'] * 1e3:.0f} ms; kill -9 -> replacement exec'd p50 "
              f"{statistics.median(kill):.1f} ms (n={len(kill)})")
        if "idle_cpu_pct" in figures:
            print(f"podman idle, {figures['idle_pods']} pods: CPU {figures['idle_cpu_pct']:.2f} "
                  f"% of a core, resident {figures['idle_resident_mb']:.1f} MB "
                  f"({figures['idle_procs']} conmon processes)")
    return 1 if "error" in figures else 0


if __name__ == "__main__":
    sys.exit(main())
