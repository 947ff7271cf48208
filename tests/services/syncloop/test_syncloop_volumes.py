"""Volumes before the sandbox: the kubelet's hostPath type check and emptyDir directories."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
from pathlib import Path

import pytest

from podvisor.services.pod import pod_from_dict
from podvisor.services.pod.model import HostPathType, HostPathVolume
from podvisor.services.syncloop.volumes import check_host_path, setup_volumes
from tests.services.syncloop.test_podworkers import Harness, manifest


def check(path: Path | str, kind: HostPathType) -> str | None:
    return check_host_path(HostPathVolume(str(path), kind))


def test_or_create_types_make_what_is_missing(tmp_path: Path) -> None:
    assert check(tmp_path / "a" / "b", HostPathType.DIRECTORY_OR_CREATE) is None
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o755 & ~_umask()
    assert check(tmp_path / "f", HostPathType.FILE_OR_CREATE) is None
    assert (tmp_path / "f").is_file() and (tmp_path / "f").read_bytes() == b""
    # present and of the right kind: left alone
    (tmp_path / "f").write_text("keep")
    assert check(tmp_path / "f", HostPathType.FILE_OR_CREATE) is None
    assert (tmp_path / "f").read_text() == "keep"
    # FileOrCreate does not make the file's directory (the kubelet's rule)
    why = check(tmp_path / "no" / "f", HostPathType.FILE_OR_CREATE)
    assert why == f"hostPath type check failed: creating {tmp_path}/no/f: No such file or directory"


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


@pytest.mark.parametrize("kind, what", [
    (HostPathType.DIRECTORY, "a directory"), (HostPathType.FILE, "a file"),
    (HostPathType.SOCKET, "a socket file"), (HostPathType.CHAR_DEVICE, "a character device"),
    (HostPathType.BLOCK_DEVICE, "a block device"),
    (HostPathType.DIRECTORY_OR_CREATE, "a directory"),
    (HostPathType.FILE_OR_CREATE, "a file"),
])
def test_wrong_kind_or_missing_is_refused_with_the_kubelets_words(
        tmp_path: Path, kind: HostPathType, what: str) -> None:
    (tmp_path / "file").write_text("x")
    wrong = tmp_path if kind in (HostPathType.FILE, HostPathType.FILE_OR_CREATE) \
        else tmp_path / "file"
    assert check(wrong, kind) == f"hostPath type check failed: {wrong} is not {what}"
    if "OrCreate" not in str(kind):
        missing = tmp_path / "missing"
        assert check(missing, kind) == f"hostPath type check failed: {missing} is not {what}"
        assert not missing.exists()


def test_right_kinds_pass(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert check(tmp_path, HostPathType.DIRECTORY) is None
    assert check(tmp_path / "file", HostPathType.FILE) is None
    assert check("/dev/null", HostPathType.CHAR_DEVICE) is None
    short = Path(tempfile.mkdtemp(prefix="pvsock", dir="/tmp"))
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(short / "s"))
            assert check(short / "s", HostPathType.SOCKET) is None
    finally:
        (short / "s").unlink(missing_ok=True)
        short.rmdir()
    # no type: no check at all, nothing made
    assert check(tmp_path / "missing", HostPathType.UNSET) is None
    assert not (tmp_path / "missing").exists()


def test_setup_volumes_makes_empty_dirs_and_names_failed_volumes(tmp_path: Path) -> None:
    pod = pod_from_dict(manifest(volumes=[
        {"name": "scratch", "emptyDir": {}},
        {"name": "ok", "hostPath": {"path": str(tmp_path), "type": "Directory"}},
        {"name": "bad", "hostPath": {"path": str(tmp_path / "nope"), "type": "Directory"}},
    ])).pod
    errors = setup_volumes(pod, tmp_path / "pods")
    assert errors == {"bad": f"hostPath type check failed: {tmp_path}/nope is not a directory"}
    scratch = tmp_path / "pods/u1/volumes/kubernetes.io~empty-dir/scratch"
    assert stat.S_IMODE(scratch.stat().st_mode) == 0o777


def test_a_failed_volume_keeps_the_pod_from_starting_until_it_is_fixed(tmp_path: Path) -> None:
    """No sandbox and no container while a hostPath fails its check: the pod waits, the error
    (the kubelet's FailedMount message) is reported, and the worker retries after its delay."""
    h = Harness(tmp_path)
    data = tmp_path / "data"
    h.set(manifest(containers=[{"name": "a", "image": "host"}], volumes=[
        {"name": "data", "hostPath": {"path": str(data), "type": "Directory"}}]))
    assert h.cri.method_calls("RunPodSandbox") == [] and h.running() == {}
    entry = h.desired.items["u1"]
    assert entry.message == (f'MountVolume.SetUp failed for volume "data" : hostPath type '
                                f"check failed: {data} is not a directory")
    line = h.log.named("syncloop.volume.failed")[0]
    assert (line["volume"], line["pod_uid"]) == ("data", "u1")
    data.mkdir()
    h.now += 20
    h.settle()
    assert "a" in h.running()
