"""A real OCI registry for tests: Debian's ``docker-registry`` on a free 127.0.0.1 port
(anonymous, or behind basic auth with an htpasswd file), holding the busybox image built offline
by deploy/containerd/build_images.py and pushed with ``skopeo``."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("docker-registry", "skopeo")
BUSYBOX = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if Path(p).is_file()), "")


def _build_images() -> Any:
    spec = importlib.util.spec_from_file_location(
        "build_images", ROOT / "deploy" / "containerd" / "build_images.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_images"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT
    proc: subprocess.Popen[bytes]
    user: str = ""
    password: str = ""


def _start_registry(base: Path, auth: bool) -> Registry:
    port = _free_port()
    config = [
        "version: 0.1", "log: {level: error}",
        f"storage: {{filesystem: {{rootdirectory: {base / 'data'}}}, delete: {{enabled: true}}}}",
        f"http: {{addr: 127.0.0.1:{port}}}",
    ]
    user, password = "", ""
    if auth:
        import bcrypt
        user, password = "puller", "s3cret"
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        (base / "htpasswd").write_text(f"{user}:{hashed}\n")
        config.append(f"auth: {{htpasswd: {{realm: podvisor, path: {base / 'htpasswd'}}}}}")
    (base / "config.yml").write_text("\n".join(config) + "\n")
    with open(base / "registry.log", "wb") as err:
        proc = subprocess.Popen(["docker-registry", "serve", str(base / "config.yml")],
                                stdout=subprocess.DEVNULL, stderr=err)
    reg = Registry(f"127.0.0.1:{port}", proc, user, password)

    def up() -> bool:
        assert proc.poll() is None, (base / "registry.log").read_text()
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    from tests.conftest import wait_for_impl
    wait_for_impl(up, 20.0)
    return reg


def _push(reg: Registry, archive: Path, name: str) -> None:
    cmd = ["skopeo", "copy", "--dest-tls-verify=false", f"oci-archive:{archive}",
           f"docker://{reg.host}/{name}"]
    if reg.user:
        cmd.insert(2, f"--dest-creds={reg.user}:{reg.password}")
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)


@contextlib.contextmanager
def registries(base: Path) -> Iterator[tuple[Registry, Registry]]:
    """(anonymous, basic auth puller:s3cret) registries, both holding podvisor/busybox:1
    (private/busybox:1 behind auth; the anonymous one also podvisor/busybox:other, another image
    on the same layer); skips the test when a tool is missing."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing or not BUSYBOX:
        pytest.skip(f"needs {', '.join(missing) or 'a static busybox'} (.ci/test-packages.txt)")
    base.mkdir(parents=True, exist_ok=True)
    archive = base / "busybox.tar"
    build = _build_images()
    archive.write_bytes(build.busybox_image(Path(BUSYBOX)))
    # another image (its own id) sharing the busybox layer: podvisor/busybox:other
    entries = [*build.base_entries(), build.Entry("bin/busybox", 0o755, Path(BUSYBOX).read_bytes())]
    entries += [build.Entry("bin/" + a, 0o777, link="busybox")
                for a in build.busybox_applets(Path(BUSYBOX)) if a != "busybox"]
    other = base / "other.tar"
    other.write_bytes(build.image_layout("localhost/podvisor/busybox:other", entries,
                                         {"Cmd": ["sh"], "Env": [build.DEFAULT_PATH, "V=2"]}))
    (base / "anon").mkdir()
    (base / "auth").mkdir()
    anon = _start_registry(base / "anon", auth=False)
    try:
        authed = _start_registry(base / "auth", auth=True)
        try:
            _push(anon, archive, "podvisor/busybox:1")
            _push(anon, other, "podvisor/busybox:other")
            _push(authed, archive, "private/busybox:1")
            yield anon, authed
        finally:
            authed.proc.terminate()
            authed.proc.wait(10)
    finally:
        anon.proc.terminate()
        anon.proc.wait(10)


def push_bulky_image(reg: Registry, base: Path, name: str, size: int) -> None:
    """Push ``name`` to ``reg``: one layer holding ``size`` random bytes (incompressible, so
    the image takes about twice ``size`` in a runtime's store: the blob and the unpacked
    layer)."""
    import os

    build = _build_images()
    entries = [*build.base_entries(), build.Entry("bulk", 0o644, os.urandom(size))]
    archive = base / "bulky.tar"
    archive.write_bytes(build.image_layout(f"localhost/{name}", entries, {"Cmd": ["sh"]}))
    _push(reg, archive, name)
