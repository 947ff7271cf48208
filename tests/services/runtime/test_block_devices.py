"""CRI ``devices`` (the kubelet's raw block volumes, ``volumeDevices``) on the runtimes, with a
real loop device the test makes: the device node appears at its container path inside the
container's own /dev (the tmpfs the monitor makes for an image's root filesystem), the
container writes bytes through it, and the host reads them back from the loop device's
backing file. The host path is a symlink to the device (the kubelet passes its pod device map
path), which the runtime resolves. Both monitors (C and Python) on the embedded runtime;
containerd through ``cri_runtime`` (its own rule: the device at any path, its cgroup rule)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from podvisor.services.runtime.native import monitor_binary
from tests.services.conftest import cleanup, running_embedded
from tests.support.loopdev import loop_device, read_back
from tests.support.registry import Registry
from tests.support.registry import registries as running_registries

DATA = b"podvisor-raw-block"
SCRIPT = (f"ls -l {{dev}}; printf {DATA.decode()} | dd of={{dev}} conv=fsync 2>/dev/null "
          f"&& echo written; dd if={{dev}} bs={len(DATA)} count=1 2>/dev/null; echo")


@pytest.fixture(scope="module")
def registries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, Registry]]:
    with running_registries(tmp_path_factory.mktemp("registry")) as regs:
        yield regs


@pytest.fixture(params=["c", "python"])
def monitored(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The embedded runtime with the C monitor, then with the Python one."""
    if request.param == "c" and monitor_binary().path is None:
        pytest.skip(f"C monitor unavailable: {monitor_binary().why}")
    env = {"PODVISOR_MONITOR": "python"} if request.param == "python" else {}
    with running_embedded("pvblk", env) as rt:
        yield rt


@pytest.fixture
def device(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """(the loop device, its backing file, a symlink to the device as the kubelet's pod
    device map path)."""
    backing = tmp_path / "disk.img"
    with loop_device(backing) as dev:
        link = tmp_path / "volumeDevices" / "kubernetes.io~local-volume" / "pv"
        link.parent.mkdir(parents=True)
        os.symlink(dev, link)
        yield dev, backing, link


def _sandbox(rt: Any, tmp: Path, name: str) -> tuple[str, pb.PodSandboxConfig]:
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="block", uid=f"uid-{name}"),
        hostname=name, log_directory=str(tmp / "logs" / name))
    (tmp / "logs" / name).mkdir(parents=True, exist_ok=True)
    return rt.client.run_pod_sandbox(config), config


def test_device_inside_image_container(registries: tuple[Registry, Registry], monitored: Any,
                                       device: tuple[str, Path, Path], poll: Any,
                                       tmp_path: Path) -> None:
    anon, _ = registries
    rt = monitored
    dev, backing, link = device
    ref = f"{anon.host}/podvisor/busybox:1"
    rt.client.pull_image(ref)
    sid, sconfig = _sandbox(rt, tmp_path, "blk")
    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image=ref),
        command=["sh", "-c", SCRIPT.format(dev="/dev/xvda")], log_path="c.log",
        devices=[pb.Device(container_path="/dev/xvda", host_path=str(link),
                           permissions="mrw")])
    cid = rt.client.create_container(sid, config, sconfig)
    rt.client.start_container(cid)
    st = poll(lambda: (s := rt.client.container_status(cid)).state == pb.CONTAINER_EXITED and s,
              30.0, "the container to exit")
    log = (tmp_path / "logs" / "blk" / "c.log").read_text()
    assert st.exit_code == 0, (st.reason, st.message, log)
    major, minor = os.major(os.stat(dev).st_rdev), os.minor(os.stat(dev).st_rdev)
    assert re.search(rf" b[-rwx]{{9}} .* {major},\s+{minor} .*/dev/xvda\n", log), log
    assert "written" in log and DATA.decode() in log, log
    assert read_back(backing, len(DATA)) == DATA  # through the device, onto the host's file
    assert not os.path.lexists("/dev/xvda") or os.path.realpath("/dev/xvda") != dev
    # not a device: refused at create, with the reason
    with pytest.raises(CriError, match="not a device node"):
        rt.client.create_container(sid, pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="bad"), image=pb.ImageSpec(image=ref),
            command=["true"], log_path="bad.log",
            devices=[pb.Device(container_path="/dev/xvdb", host_path=str(backing),
                               permissions="mrw")]), sconfig)
    rt.client.stop_pod_sandbox(sid)
    rt.client.remove_container(cid)
    rt.client.remove_pod_sandbox(sid)


def test_device_on_each_runtime(cri_runtime: Any, device: tuple[str, Path, Path]) -> None:
    """containerd takes the device anywhere; the embedded runtime's image 'host' shares the
    node's /dev, so there the device goes at its own path and elsewhere is refused."""
    rt = cri_runtime
    if rt.name == "fake":
        pytest.skip("fake: runs no process")
    dev, backing, link = device
    path = dev if rt.image == "host" else "/dev/xvda"
    sandbox = rt.run("blk")
    try:
        config = rt.container_config("c", ["sh", "-c", SCRIPT.format(dev=path)])
        config.devices.append(pb.Device(container_path=path, host_path=str(link),
                                        permissions="mrw"))
        cid = rt.client.create_container(sandbox[0], config, sandbox[1])
        rt.client.start_container(cid)
        st = rt.wait_exited(cid, 60.0)
        log = Path(sandbox[1].log_directory, config.log_path).read_text()
        assert st.exit_code == 0 and "written" in log and DATA.decode() in log, (st.message,
                                                                                 log)
        assert read_back(backing, len(DATA)) == DATA
        if rt.image == "host":
            elsewhere = rt.container_config("elsewhere", ["true"])
            elsewhere.devices.append(pb.Device(container_path="/dev/xvda-pv-test",
                                               host_path=str(link), permissions="mrw"))
            with pytest.raises(CriError, match="shares the node's /dev"):
                rt.client.create_container(sandbox[0], elsewhere, sandbox[1])
            assert not os.path.lexists("/dev/xvda-pv-test")
        if rt.name == "embedded":  # no devices cgroup: a read-only device is refused, not
            # given writable (a read-only claim's block volume)
            read_only = rt.container_config("ro", ["true"])
            read_only.devices.append(pb.Device(container_path=path, host_path=str(link),
                                               permissions="r"))
            with pytest.raises(CriError, match="cannot give a device read-only"):
                rt.client.create_container(sandbox[0], read_only, sandbox[1])
    finally:
        cleanup(rt.client, rt.run_label)
