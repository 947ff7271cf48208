"""Smoke test of deploy/containerd through real CRI gRPC: one pod, one busybox container.

Proves the private instance (or the one CI started) is usable by the CRI contract suite: a
host-network sandbox with an empty hostname and PID namespace mode CONTAINER, a container that
logs in CRI format and is killed by StopContainer, clean removal (no shim left), and that
containerd 1.6 answers UNIMPLEMENTED to GetContainerEvents (so podvisor relists it).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2, api_pb2_grpc

from tests.support.containerd import (
    DEPLOY_DIR,
    ContainerdHandle,
    containerd_or_skip,
    instance_shims,
    remove_pod_cgroup,
    wait_for,
)

pytestmark = pytest.mark.containerd
CALL_TIMEOUT = 30.0
CRI_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d) stdout F hi$")


@dataclass(frozen=True)
class Cri:
    handle: ContainerdHandle
    runtime: Any  # api_pb2_grpc.RuntimeServiceStub (untyped generated code)
    images: Any  # api_pb2_grpc.ImageServiceStub


@pytest.fixture(scope="module")
def cri() -> Iterator[Cri]:
    handle = containerd_or_skip()
    with grpc.insecure_channel(handle.endpoint) as channel:
        yield Cri(handle,
                  api_pb2_grpc.RuntimeServiceStub(channel),  # type: ignore[no-untyped-call]
                  api_pb2_grpc.ImageServiceStub(channel))  # type: ignore[no-untyped-call]


def host_namespaces() -> api_pb2.NamespaceOption:
    return api_pb2.NamespaceOption(network=api_pb2.NODE, pid=api_pb2.CONTAINER,
                                   ipc=api_pb2.POD)


def sandbox_config(cri: Cri, uid: str, log_dir: Path) -> api_pb2.PodSandboxConfig:
    return api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name="smoke", uid=uid, namespace="default"),
        hostname="",  # host network: containerd refuses to set a hostname there
        log_directory=str(log_dir),
        labels={"podvisor.test": "containerd-setup"},
        linux=api_pb2.LinuxPodSandboxConfig(
            cgroup_parent=f"{cri.handle.cgroup_parent}/pod{uid}",
            security_context=api_pb2.LinuxSandboxSecurityContext(
                namespace_options=host_namespaces()),
        ),
    )


def container_config(cri: Cri) -> api_pb2.ContainerConfig:
    return api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name="hello"),
        image=api_pb2.ImageSpec(image=cri.handle.image),
        command=["sh", "-c", "echo hi; sleep 30"],
        log_path="hello_0.log",
        linux=api_pb2.LinuxContainerConfig(
            security_context=api_pb2.LinuxContainerSecurityContext(
                namespace_options=host_namespaces())),
    )


def remove_sandbox(cri: Cri, sandbox_id: str) -> None:
    """Stop and remove a sandbox with its containers (RemovePodSandbox removes them too)."""
    cri.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox_id),
                               timeout=CALL_TIMEOUT)
    cri.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id),
                                 timeout=CALL_TIMEOUT)


def container_state(cri: Cri, container_id: str) -> api_pb2.ContainerStatus:
    response: api_pb2.ContainerStatusResponse = cri.runtime.ContainerStatus(
        api_pb2.ContainerStatusRequest(container_id=container_id), timeout=CALL_TIMEOUT)
    return response.status


def test_version(cri: Cri) -> None:
    version = cri.runtime.Version(api_pb2.VersionRequest(), timeout=CALL_TIMEOUT)
    assert version.runtime_name == "containerd"
    assert version.runtime_api_version == "v1"


def test_images_are_local(cri: Cri) -> None:
    listed = cri.images.ListImages(api_pb2.ListImagesRequest(), timeout=CALL_TIMEOUT)
    tags = {tag for image in listed.images for tag in image.repo_tags}
    assert {cri.handle.image, cri.handle.pause_image} <= tags


def test_pod_and_container_lifecycle(cri: Cri, tmp_path: Path) -> None:
    uid = uuid.uuid4().hex
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    config = sandbox_config(cri, uid, log_dir)
    sandbox_id = cri.runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=config),
                                           timeout=CALL_TIMEOUT).pod_sandbox_id
    try:
        run_container(cri, sandbox_id, config, log_dir / "hello_0.log")
    finally:
        remove_sandbox(cri, sandbox_id)
        remove_pod_cgroup(config.linux.cgroup_parent)
    listed = cri.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=CALL_TIMEOUT)
    assert sandbox_id not in {item.id for item in listed.items}
    wait_for(lambda: not instance_shims(cri.handle), 30, "the pod's containerd-shim to exit")


def run_container(cri: Cri, sandbox_id: str, config: api_pb2.PodSandboxConfig,
                  log_file: Path) -> None:
    container_id = cri.runtime.CreateContainer(
        api_pb2.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=container_config(cri),
                                       sandbox_config=config),
        timeout=CALL_TIMEOUT).container_id
    cri.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id),
                               timeout=CALL_TIMEOUT)
    assert container_state(cri, container_id).state == api_pb2.CONTAINER_RUNNING

    def logged_hi() -> bool:
        return log_file.exists() and any(
            CRI_LINE.match(line) for line in log_file.read_text().splitlines())

    wait_for(logged_hi, 30, f"a CRI-format 'hi' line in {log_file}")
    # sh is PID 1 of its own PID namespace and has no SIGTERM handler: KILL after the timeout.
    cri.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=container_id, timeout=1),
                              timeout=CALL_TIMEOUT)
    status = container_state(cri, container_id)
    assert status.state == api_pb2.CONTAINER_EXITED
    assert status.exit_code in (137, 143)
    cri.runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=container_id),
                                timeout=CALL_TIMEOUT)
    with pytest.raises(grpc.RpcError) as gone:
        container_state(cri, container_id)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


def test_container_events_unimplemented(cri: Cri) -> None:
    stream = cri.runtime.GetContainerEvents(api_pb2.GetEventsRequest(), timeout=CALL_TIMEOUT)
    with pytest.raises(grpc.RpcError) as failed:
        next(iter(stream))
    assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.timeout(300)
def test_setup_prints_a_start_command_that_works() -> None:
    """setup.sh ends with `start it with: .../start.sh DIR`: run exactly that, on a private
    instance of this test's own (stopped and purged by it), and ask it over CRI."""
    if not os.environ.get("PODVISOR_CONTAINERD_ENDPOINT"):
        pytest.skip("PODVISOR_CONTAINERD_ENDPOINT is not set (containerd tests are off)")
    if os.geteuid() != 0 or any(shutil.which(t) is None for t in
                                ("containerd", "ctr", "containerd-shim-runc-v2", "runc", "gcc")):
        pytest.skip("needs root and containerd, runc and gcc installed")
    directory = Path(tempfile.mkdtemp(prefix="pvst", dir="/tmp"))
    try:
        setup = subprocess.run(["bash", str(DEPLOY_DIR / "setup.sh"), "--no-install",
                                str(directory)], capture_output=True, text=True, timeout=240)
        assert setup.returncode == 0, setup.stderr[-2000:]
        advised = re.search(r"\(start it with: (.+)\)$", setup.stdout, re.M)
        assert advised is not None, setup.stdout
        start = subprocess.run(shlex.split(advised.group(1)), capture_output=True, text=True,
                               timeout=240, cwd="/")
        assert start.returncode == 0, start.stderr[-2000:]
        endpoint = re.search(r"^ENDPOINT=(\S+)$", start.stdout, re.M)
        assert endpoint is not None and endpoint.group(1) == \
            f"unix://{directory}/run/containerd.sock", start.stdout
        with grpc.insecure_channel(endpoint.group(1)) as channel:
            stub = api_pb2_grpc.RuntimeServiceStub(channel)  # type: ignore[no-untyped-call]
            version = stub.Version(api_pb2.VersionRequest(), timeout=CALL_TIMEOUT)
        assert version.runtime_name == "containerd"
    finally:
        subprocess.run([str(DEPLOY_DIR / "stop.sh"), "--purge", str(directory)],
                       capture_output=True, text=True, timeout=120, check=False)
        shutil.rmtree(directory, ignore_errors=True)
