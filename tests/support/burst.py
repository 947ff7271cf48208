"""A burst of pods on a containerd of one's own, counted from outside (issue 22): shared by
tests/services/syncloop/test_e2e_containerd_exactly_once.py and bench/burst_kill_containerd.py.

- ``PrivateContainerd``: an instance set up, started, killed and purged with deploy/containerd's
  scripts (no pod network: the pods are hostNetwork), never the session's instance.
- Each pod runs ``sleep <tag>`` (``sleep_manifest``) with a number unique to the pod, so the
  kernel's process table counts each pod's processes (``sleepers``).
- ``CriCounts``: what containerd's CRI lists per pod (sandboxes, ready ones, containers, running
  ones and their restart counts); ``in_cgroups``: every process left under an agent's
  ``cgroupRoot``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri.client import RuntimeClient
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop.cgroupfs import new_cgroup_fs
from podvisor.services.syncloop.podcgroups import hierarchy_dirs, parse_mountinfo
from tests.support.containerd import DEPLOY_DIR


class PrivateContainerd:
    """A containerd instance in ``directory`` of its owner alone (deploy/containerd's
    setup.sh, start.sh, stop.sh --purge), without a pod network."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.env = {**os.environ, "PODVISOR_CONTAINERD_CNI": "off"}
        self.endpoint = f"unix://{self.dir}/run/containerd.sock"

    def script(self, name: str, *args: str) -> None:
        done = subprocess.run([str(DEPLOY_DIR / name), *args, str(self.dir)], env=self.env,
                              capture_output=True, text=True, timeout=180, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{name} failed: {done.stderr.strip()[-2000:]}")

    def setup_and_start(self) -> None:
        self.script("setup.sh", "--no-install")
        self.start()

    def start(self) -> None:
        self.script("start.sh")

    def pid(self) -> int:
        return int((self.dir / "containerd.pid").read_text().strip())

    def kill9(self) -> None:
        """SIGKILL this instance's containerd (by its pid) and reap it (the caller's child
        when the caller is a subreaper, as the test suite is)."""
        proc = psutil.Process(self.pid())
        proc.send_signal(signal.SIGKILL)
        try:
            os.waitpid(proc.pid, 0)
        except ChildProcessError:
            proc.wait(30)

    def shims(self) -> list[psutil.Process]:
        """containerd-shim processes serving this instance (matched on their -address)."""
        sock = self.endpoint.removeprefix("unix://")
        out = []
        for proc in psutil.process_iter(["cmdline"]):
            argv = proc.info["cmdline"] or []
            if (argv and "containerd-shim" in argv[0]
                    and any(pair == ("-address", sock) for pair in itertools.pairwise(argv))):
                out.append(proc)
        return out

    def stop(self) -> None:
        """stop.sh --purge: containerd, its shims and the directory (when set up)."""
        if (self.dir / "config.toml").exists():
            subprocess.run([str(DEPLOY_DIR / "stop.sh"), "--purge", str(self.dir)],
                           env=self.env, capture_output=True, timeout=180, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def sleep_manifest(name: str, image: str, tag: str) -> dict[str, Any]:
    """`sleep <tag>` as the container's own process (PID 1 of its namespace: TERM does nothing,
    so a 1 s grace keeps removal short)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": image,
                                     "imagePullPolicy": "IfNotPresent",
                                     "command": ["sleep", tag]}]}}


def sleepers(tags: Mapping[str, str]) -> dict[str, int]:
    """pod -> live (not zombie) processes running its `sleep <tag>`."""
    by_tag = {tag: pod for pod, tag in tags.items()}
    out = dict.fromkeys(tags, 0)
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if (len(cmd) == 2 and cmd[0] == "sleep" and cmd[1] in by_tag
                and proc.info["status"] != psutil.STATUS_ZOMBIE):
            out[by_tag[cmd[1]]] += 1
    return out


def base_name(pod_name: str) -> str:
    """A static pod's name without the "-<nodeName>" suffix."""
    return pod_name.rsplit("-", 1)[0]


def running_pods(body: Mapping[str, Any] | None) -> set[str]:
    """The base names of the pods Running in a ``/pods`` body, every container running."""
    seen = set()
    for pod in (body or {}).get("items", []):
        st = pod.get("status", {})
        cs = st.get("containerStatuses", [])
        if (st.get("phase") == "Running" and cs
                and all("running" in c.get("state", {}) for c in cs)):
            seen.add(base_name(pod["metadata"]["name"]))
    return seen


@dataclass
class CriCounts:
    """What the CRI lists for the pods (pod -> count; restarts: the restart counts of the
    running containers), with a line per container that is not running (how it ended)."""

    sandboxes: Counter[str] = field(default_factory=Counter)
    ready: Counter[str] = field(default_factory=Counter)
    containers: Counter[str] = field(default_factory=Counter)
    running: Counter[str] = field(default_factory=Counter)
    restarts: dict[str, list[int]] = field(default_factory=dict)
    dead: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, cri: RuntimeClient, ours: Callable[[Mapping[str, str]], str | None],
           describe_dead: bool = False) -> CriCounts:
        """Count the sandboxes and containers ``ours`` names a pod for (raises CriError)."""
        out = cls()
        for s in cri.list_pod_sandbox():
            if (pod := ours(s.labels)) is not None:
                out.sandboxes[pod] += 1
                out.ready[pod] += s.state == pb.SANDBOX_READY
        for c in cri.list_containers():
            if (pod := ours(c.labels)) is None:
                continue
            out.containers[pod] += 1
            if c.state == pb.CONTAINER_RUNNING:
                out.running[pod] += 1
                out.restarts.setdefault(pod, []).append(
                    L.parse_int(c.annotations.get(L.RESTART_COUNT)))
            elif describe_dead:
                st = cri.container_status(c.id)
                out.dead.append(f"{pod} {pb.ContainerState.Name(st.state)} exit {st.exit_code}"
                                f" {st.reason!r} started {st.started_at > 0} "
                                f"{st.message[:160]!r}")
        return out

    @staticmethod
    def per_pod(counts: Counter[str], pods: Iterable[str]) -> dict[str, int]:
        return {pod: counts.get(pod, 0) for pod in pods}


def in_cgroups(cgroup_root: str) -> list[str]:
    """Every process left in the pods' cgroups under an agent's ``cgroupRoot`` (pause, runc
    init, anything), as "pid cmdline"."""
    out = []
    mounts = parse_mountinfo(new_cgroup_fs().mountinfo())
    for folder in hierarchy_dirs(mounts, cgroup_root):
        # os.walk, not rglob: a pod's folder removed while it is walked is skipped (rglob
        # raised FileNotFoundError when the sync loop removed one meanwhile)
        for here, _dirs, files in os.walk(folder):
            if "cgroup.procs" not in files:
                continue
            with contextlib.suppress(OSError):
                for pid in (Path(here) / "cgroup.procs").read_text().split():
                    with contextlib.suppress(psutil.Error):
                        out.append(f"{pid} {' '.join(psutil.Process(int(pid)).cmdline())}")
    return sorted(set(out))
