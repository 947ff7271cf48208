"""CRI contract: bind mounts (what the sync loop sends for emptyDir and hostPath volumes).

Both runtimes: a read-write directory, a read-only one, a single file and a missing host path
(created, as containerd does) are seen by the container and by ExecSync at their container
paths, writes land in the host directory, and the mounts are the container's alone: the host
never sees them. The embedded runtime applies them in a private mount namespace per container
(monitor.c ``apply_mounts``; the Python monitor's twin is checked in test_embedded_monitors).
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from podvisor.services.runtime.monitor import mount_setattr_works
from tests.services.conftest import RuntimeUnderTest, only_embedded, poll, runs_processes
from tests.services.cri.test_contract_io import parse_log

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")


def check_bind_mounts(rt: RuntimeUnderTest, tmp: Path) -> None:
    """Start a container with four bind mounts and check what it and ExecSync see."""
    src, ro, one, made = tmp / "src", tmp / "ro", tmp / "one.txt", tmp / "made"
    src.mkdir(parents=True)
    ro.mkdir()
    (src / "in").write_text("from the host\n")
    (ro / "keep").write_text("read only\n")
    one.write_text("one file\n")
    ctr = tmp / "ctr"  # container paths: created inside the container's view only
    script = (f"cat {ctr}/rw/in {ctr}/ro/keep {ctr}/one.txt; echo written > {ctr}/rw/out; "
              f"if echo x 2>/dev/null > {ctr}/ro/new; then echo ro-writable; "
              f"else echo ro-refused; fi; echo made > {ctr}/made/m; echo done; exec sleep 1000")
    sid, sconfig = rt.run("mounts")
    config = rt.container_config("c", ["sh", "-c", script])
    config.mounts.extend([
        pb.Mount(host_path=str(src), container_path=f"{ctr}/rw"),
        pb.Mount(host_path=str(ro), container_path=f"{ctr}/ro", readonly=True),
        pb.Mount(host_path=str(one), container_path=f"{ctr}/one.txt", readonly=True),
        pb.Mount(host_path=str(made), container_path=f"{ctr}/made"),
    ])
    cid = rt.client.create_container(sid, config, sconfig)
    rt.client.start_container(cid)
    log = rt.client.container_status(cid).log_path

    def said_done() -> bool:
        return os.path.exists(log) and any(r[2] == "done" for r in parse_log(log))

    poll(said_done, 30.0, "the container to run its script")
    out = [text for stream, _tag, text in parse_log(log) if stream == "stdout"]
    assert out == ["from the host", "read only", "one file", "ro-refused", "done"]
    assert (src / "out").read_text() == "written\n"
    assert (made / "m").read_text() == "made\n"
    assert not (ro / "new").exists()
    # The host never sees the container's mounts (the embedded runtime made empty mount points).
    assert not (ctr / "rw" / "in").exists() and not (ctr / "made" / "m").exists()
    # ExecSync (exec probes, preStop hooks) sees the container's view.
    resp = rt.client.exec_sync(cid, ["cat", f"{ctr}/rw/out", f"{ctr}/one.txt"], 10)
    assert (resp.exit_code, resp.stdout) == (0, b"written\none file\n")


def test_bind_mounts(cri_runtime: RuntimeUnderTest) -> None:
    runs_processes(cri_runtime, "mounts")
    check_bind_mounts(cri_runtime, cri_runtime.tmp)


@pytest.mark.parametrize("mount, expect", [
    (pb.Mount(host_path="relative", container_path="/x"), "both paths must be absolute"),
    (pb.Mount(host_path="/tmp", container_path="x"), "both paths must be absolute"),
    (pb.Mount(host_path="/tmp", container_path="/x", propagation=pb.PROPAGATION_BIDIRECTIONAL),
     "propagation PROPAGATION_BIDIRECTIONAL is not supported"),
])
def test_unsupported_mounts_are_refused_at_create(cri_runtime: RuntimeUnderTest,
                                                  mount: pb.Mount, expect: str) -> None:
    only_embedded(cri_runtime, "containerd's own rules for mounts")
    sid, sconfig = cri_runtime.run("badmount")
    config = cri_runtime.container_config("c", ["true"])
    config.mounts.append(mount)
    with pytest.raises(CriError) as info:
        cri_runtime.client.create_container(sid, config, sconfig)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert expect in info.value.message


def check_recursive_read_only(rt: RuntimeUnderTest, tmp: Path) -> None:
    """A host directory with a tmpfs mounted under it (``sub``), mounted twice in a container:
    ``recursive_read_only`` (CRI 1.30, the kubelet's ``recursiveReadOnly`` resolved to it) and a
    plain ``readonly``. Read-only is the bind's alone, so the plain one's submount stays
    writable; the recursive one makes the submount read-only too (the embedded runtime:
    ``mount_setattr`` with ``AT_RECURSIVE``). The host's own tmpfs stays writable."""
    vol = tmp / "vol"
    (vol / "sub").mkdir(parents=True)
    assert os.system(f"mount -t tmpfs -o size=1m pvrro {vol / 'sub'}") == 0
    try:
        ctr = tmp / "ctr"
        script = "; ".join(
            f"if echo x 2>/dev/null > {ctr}/{where}; then echo {where}:writable; "
            f"else echo {where}:refused; fi"
            for where in ("rro/top", "rro/sub/in", "plain/sub/in2")) + "; echo done; " \
            "exec sleep 1000"
        sid, sconfig = rt.run("rro")
        config = rt.container_config("c", ["sh", "-c", script])
        config.mounts.extend([
            pb.Mount(host_path=str(vol), container_path=f"{ctr}/rro", readonly=True,
                     recursive_read_only=True),
            pb.Mount(host_path=str(vol), container_path=f"{ctr}/plain", readonly=True),
        ])
        cid = rt.client.create_container(sid, config, sconfig)
        rt.client.start_container(cid)
        log = rt.client.container_status(cid).log_path

        def said_done() -> bool:
            return os.path.exists(log) and any(r[2] == "done" for r in parse_log(log))

        poll(said_done, 30.0, "the container to run its script")
        out = [text for stream, _tag, text in parse_log(log) if stream == "stdout"]
        assert out == ["rro/top:refused", "rro/sub/in:refused", "plain/sub/in2:writable",
                       "done"]
        assert (vol / "sub" / "in2").read_text() == "x\n"
        (vol / "sub" / "host").write_text("still writable on the host\n")
        rt.client.stop_container(cid, 0)
    finally:
        os.system(f"umount -l {vol / 'sub'}")


def test_runtime_handlers_and_recursive_read_only(cri_runtime: RuntimeUnderTest) -> None:
    """Status lists the runtime's handlers and whether each makes recursive read-only mounts:
    the embedded runtime "" and ``podvisor`` (both, where the kernel has mount_setattr), and
    makes them; containerd 1.6 predates ``runtime_handlers`` and lists none (so the kubelet
    never asks it for one)."""
    runs_processes(cri_runtime, "mounts")
    handlers = {h.name: h.features.recursive_read_only_mounts
                for h in cri_runtime.client.status().runtime_handlers}
    if cri_runtime.name == "embedded":
        rro = mount_setattr_works()  # Linux 5.12
        assert handlers == {"": rro, "podvisor": rro}
        if not rro:
            pytest.skip("the kernel has no mount_setattr (Linux < 5.12)")
        check_recursive_read_only(cri_runtime, cri_runtime.tmp)
    else:
        assert handlers == {}


def test_recursive_read_only_needs_a_read_only_private_mount(
        cri_runtime: RuntimeUnderTest) -> None:
    only_embedded(cri_runtime, "containerd's own rules for mounts")
    sid, sconfig = cri_runtime.run("badrro")
    for mount, expect in (
            (pb.Mount(host_path="/tmp", container_path="/x", recursive_read_only=True),
             "recursive read-only mount must be read-only"),
            (pb.Mount(host_path="/tmp", container_path="/x", readonly=True,
                      recursive_read_only=True, propagation=pb.PROPAGATION_HOST_TO_CONTAINER),
             "recursive read-only mount requires private propagation")):
        config = cri_runtime.container_config("c", ["true"])
        config.mounts.append(mount)
        with pytest.raises(CriError) as info:
            cri_runtime.client.create_container(sid, config, sconfig)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert expect in info.value.message


def test_a_handler_the_runtime_does_not_have_fails_the_sandbox(
        cri_runtime: RuntimeUnderTest) -> None:
    """RunPodSandbox with an unknown ``runtime_handler``: refused with the runtime's words
    (containerd's "no runtime for ... is configured"); a known one runs."""
    runs_processes(cri_runtime, "handlers")
    with pytest.raises(CriError) as info:
        cri_runtime.client.run_pod_sandbox(cri_runtime.sandbox_config("nohandler"), "gvisor")
    assert 'no runtime for "gvisor" is configured' in info.value.message
    known = "podvisor" if cri_runtime.name == "embedded" else "runc"
    sid = cri_runtime.client.run_pod_sandbox(cri_runtime.sandbox_config("handler"), known)
    assert cri_runtime.client.pod_sandbox_status(sid).runtime_handler == known
