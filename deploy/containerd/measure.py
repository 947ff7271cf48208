#!/usr/bin/env python3
"""Measure a containerd instance through CRI: sandbox-to-running latency and relist cost.

    .venv/bin/python deploy/containerd/measure.py unix:///DIR/run/containerd.sock [--runs 20]
        [--pods 50] [--relists 200]

1. `--runs` times: RunPodSandbox + CreateContainer + StartContainer (busybox `sleep 3600`) until
   ContainerStatus says RUNNING; prints p50/p99/max in ms, then removes each pod.
2. Starts `--pods` such pods, times ListPodSandbox + ListContainers `--relists` times (a PLEG
   relist), prints p50/p99 in ms, then removes them and their cgroup folders.
Pods use the instance's CGROUP_PARENT (from instance.env beside the socket) and the settings
containerd needs here (host network, empty hostname, PID namespace CONTAINER). A quick look for
operators; the side-by-side comparison with the embedded runtime lives in bench/.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from cri_api.v1 import api_pb2, api_pb2_grpc

TIMEOUT = 60.0


def instance_values(endpoint: str) -> dict[str, str]:
    env_file = Path(endpoint.removeprefix("unix://")).parent.parent / "instance.env"
    if not env_file.is_file():
        return {}
    pairs = (line.partition("=") for line in env_file.read_text().splitlines())
    return {key: value for key, _, value in pairs}


class Pods:
    """Creates and removes busybox pods on one CRI runtime."""

    def __init__(self, runtime: Any, image: str, cgroup_root: str, log_dir: Path) -> None:
        self.runtime, self.image, self.cgroup_root, self.log_dir = (
            runtime, image, cgroup_root, log_dir)
        self.sandboxes: list[str] = []
        self.cgroups: list[str] = []

    def start(self) -> str:
        """Start one pod with one container; return once it is RUNNING."""
        uid = uuid.uuid4().hex
        ns = api_pb2.NamespaceOption(network=api_pb2.NODE, pid=api_pb2.CONTAINER)
        config = api_pb2.PodSandboxConfig(
            metadata=api_pb2.PodSandboxMetadata(name=f"m{uid[:8]}", uid=uid, namespace="bench"),
            hostname="", log_directory=str(self.log_dir),
            linux=api_pb2.LinuxPodSandboxConfig(
                cgroup_parent=f"{self.cgroup_root}/pod{uid}",
                security_context=api_pb2.LinuxSandboxSecurityContext(namespace_options=ns)))
        sid: str = self.runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=config),
                                              timeout=TIMEOUT).pod_sandbox_id
        self.sandboxes.append(sid)
        self.cgroups.append(config.linux.cgroup_parent)
        container = api_pb2.ContainerConfig(
            metadata=api_pb2.ContainerMetadata(name="sleep"),
            image=api_pb2.ImageSpec(image=self.image), command=["sleep", "3600"],
            log_path=f"{uid}.log",
            linux=api_pb2.LinuxContainerConfig(
                security_context=api_pb2.LinuxContainerSecurityContext(namespace_options=ns)))
        cid = self.runtime.CreateContainer(api_pb2.CreateContainerRequest(
            pod_sandbox_id=sid, config=container, sandbox_config=config),
            timeout=TIMEOUT).container_id
        self.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=cid),
                                    timeout=TIMEOUT)
        request = api_pb2.ContainerStatusRequest(container_id=cid)
        while (self.runtime.ContainerStatus(request, timeout=TIMEOUT).status.state
               != api_pb2.CONTAINER_RUNNING):
            time.sleep(0.001)
        return sid

    def remove_all(self) -> None:
        for sid in self.sandboxes:
            self.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sid),
                                        timeout=TIMEOUT)
            self.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sid),
                                          timeout=TIMEOUT)
        self.sandboxes.clear()
        for cgroup in self.cgroups:
            for folder in Path("/sys/fs/cgroup").glob(f"*/{cgroup.strip('/')}"):
                for sub in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                    if sub.is_dir():
                        sub.rmdir()
                folder.rmdir()
        self.cgroups.clear()


def summary(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return (f"{name}: n={len(ms)} p50={statistics.median(ms):.1f} ms p99={p99:.1f} ms "
            f"max={ms[-1]:.1f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("endpoint")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--relists", type=int, default=200)
    args = parser.parse_args(argv)
    values = instance_values(args.endpoint)
    with grpc.insecure_channel(args.endpoint) as channel, \
            tempfile.TemporaryDirectory(prefix="pvmeasure") as logs:
        runtime = api_pb2_grpc.RuntimeServiceStub(channel)  # type: ignore[no-untyped-call]
        pods = Pods(runtime, values.get("IMAGE", "localhost/podvisor/busybox:1"),
                    values.get("CGROUP_PARENT", "/podvisor-containerd"), Path(logs))
        try:
            latencies = []
            for _ in range(args.runs):
                began = time.perf_counter()
                pods.start()
                latencies.append(time.perf_counter() - began)
                pods.remove_all()
            print(summary("sandbox to container running", latencies))
            for _ in range(args.pods):
                pods.start()
            relists = []
            for _ in range(args.relists):
                began = time.perf_counter()
                runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=TIMEOUT)
                runtime.ListContainers(api_pb2.ListContainersRequest(), timeout=TIMEOUT)
                relists.append(time.perf_counter() - began)
            print(summary(f"relist ({args.pods} pods, {args.pods} containers)", relists))
        finally:
            pods.remove_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
