"""OCI pulls and image containers on the embedded runtime, against a real registry: Debian's
``docker-registry`` on a free 127.0.0.1 port (anonymous, and behind basic auth with an htpasswd
file), an image built offline (deploy/containerd/build_images.py) pushed with ``skopeo``."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.cri import CriError
from podvisor.services.runtime.imagestore import unpack_layer
from podvisor.services.runtime.native import monitor_binary
from tests.services.conftest import running_embedded
from tests.support.registry import Registry
from tests.support.registry import registries as running_registries


@pytest.fixture(scope="module")
def registries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, Registry]]:
    with running_registries(tmp_path_factory.mktemp("registry")) as regs:
        yield regs


def _sandbox(rt: Any, tmp: Path, name: str) -> tuple[str, pb.PodSandboxConfig]:
    config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, namespace="images", uid=f"uid-{name}"),
        hostname=name, log_directory=str(tmp / "logs" / name))
    (tmp / "logs" / name).mkdir(parents=True, exist_ok=True)
    return rt.client.run_pod_sandbox(config), config


@pytest.fixture(params=["c", "python"])
def monitored(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The embedded runtime with the C monitor, then with the Python one."""
    if request.param == "c" and monitor_binary().path is None:
        pytest.skip(f"C monitor unavailable: {monitor_binary().why}")
    env = {"PODVISOR_MONITOR": "python"} if request.param == "python" else {}
    with running_embedded("pvimg", env) as rt:
        yield rt


def _run(rt: Any, poll: Any, tmp: Path, pod: str, config: pb.ContainerConfig
         ) -> tuple[pb.ContainerStatus, str]:
    sid, sconfig = _sandbox(rt, tmp, pod)
    cid = rt.client.create_container(sid, config, sconfig)
    rt.client.start_container(cid)
    st = poll(lambda: (s := rt.client.container_status(cid)).state == pb.CONTAINER_EXITED and s,
              30.0, "the image container to exit")
    log = (tmp / "logs" / pod / config.log_path).read_text()
    rt.client.stop_pod_sandbox(sid)
    rt.client.remove_container(cid)
    rt.client.remove_pod_sandbox(sid)
    return st, log


def test_pull_run_inside_image_and_remove(registries: tuple[Registry, Registry],
                                          monitored: Any, poll: Any,
                                          tmp_path: Path) -> None:
    anon, _ = registries
    rt = monitored
    ref = f"{anon.host}/podvisor/busybox:1"
    sid, sconfig = _sandbox(rt, tmp_path, "early")
    with pytest.raises(CriError, match="not present"):
        rt.client.create_container(sid, pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image=ref),
            log_path="c.log"), sconfig)
    image_id = rt.client.pull_image(ref)
    assert image_id.startswith("sha256:")
    listed = {i.id: i for i in rt.client.list_images()}
    assert listed[image_id].repo_tags == [ref] and listed[image_id].size > 500_000
    used = rt.client.image_fs_info().image_filesystems[0].used_bytes.value
    assert used > 500_000  # busybox unpacked: real bytes
    # The container runs inside the image's root: its /bin/sh is the image's busybox, a file it
    # writes is not on the host, /etc/hostname is the pod's, env/cmd come from the image.
    marker = f"/pv-marker-{os.getpid()}"
    volume = tmp_path / "volume"
    volume.mkdir()
    script = (f"readlink /bin/sh; echo hi > {marker}; cat {marker}; cat /etc/hostname; "
              "echo PATH=$PATH; ls /proc/self/ >/dev/null && echo proc-ok; "
              "echo from-container > /data/out; id -u; pwd")
    st, log = _run(rt, poll, tmp_path, "inimage", pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image=ref),
        args=["sh", "-c", script], log_path="c.log",  # args replace the image's Cmd
        working_dir="/tmp",
        mounts=[pb.Mount(container_path="/data", host_path=str(volume))]))
    assert st.exit_code == 0, (st.reason, st.message, log)
    for want in ("busybox", " hi", "inimage", "proc-ok", "PATH=/usr/local/sbin", " 0", "/tmp"):
        assert want in log, (want, log)
    assert not os.path.exists(marker)  # written in the container's own layer
    assert (volume / "out").read_text() == "from-container\n"
    # readOnlyRootFilesystem applies to the image's root
    ro = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="ro"),
                            image=pb.ImageSpec(image=ref), command=["sh", "-c",
                                                                    "echo x > /x || echo ro-ok"],
                            log_path="ro.log")
    ro.linux.security_context.readonly_rootfs = True
    st, log = _run(rt, poll, tmp_path, "readonly", ro)
    assert st.exit_code == 0 and "ro-ok" in log, log
    rt.client.remove_image(ref)
    assert rt.client.image_status(ref) is None
    assert rt.client.image_fs_info().image_filesystems[0].used_bytes.value < used // 10


def test_basic_auth_and_missing_tag(registries: tuple[Registry, Registry],
                                    embedded_runtime: Any) -> None:
    anon, authed = registries
    rt = embedded_runtime
    ref = f"{authed.host}/private/busybox:1"
    with pytest.raises(CriError, match="user name and password"):
        rt.client.pull_image(ref)
    with pytest.raises(CriError, match=r"UNAUTHORIZED|authentication required"):
        rt.client.pull_image(ref, auth=pb.AuthConfig(username="puller", password="wrong"))
    assert rt.client.pull_image(
        ref, auth=pb.AuthConfig(username="puller", password="s3cret")).startswith("sha256:")
    with pytest.raises(CriError, match=r"MANIFEST_UNKNOWN|manifest unknown"):
        rt.client.pull_image(f"{anon.host}/podvisor/busybox:nope")
    with pytest.raises(CriError, match="invalid image name"):
        rt.client.pull_image("UPPER/Case")


def test_concurrent_pulls_of_one_image_are_one_download(
        registries: tuple[Registry, Registry], embedded_runtime: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor
    anon, _ = registries
    ref = f"{anon.host}/podvisor/busybox:1"
    with ThreadPoolExecutor(4) as pool:
        ids = set(pool.map(lambda _: embedded_runtime.client.pull_image(ref), range(4)))
    assert len(ids) == 1
    layers = embedded_runtime.root / "images" / "layers"
    assert len([p for p in layers.iterdir() if p.is_dir()]) == 1


def _tar(entries: list[tuple[str, bytes | None]]) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return tarfile.open(fileobj=buf, mode="r")


@pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts are 0/0 devices: mknod needs root")
def test_unpack_whiteouts_opaque_and_escapes(tmp_path: Path) -> None:
    dest = tmp_path / "layer"
    dest.mkdir()
    unpack_layer(_tar([("etc", None), ("etc/.wh.passwd", b""), ("var", None),
                       ("var/.wh..wh..opq", b""), ("var/new", b"x")]), dest)
    st = os.lstat(dest / "etc" / "passwd")
    assert os.major(st.st_rdev) == 0 and os.minor(st.st_rdev) == 0
    assert os.getxattr(dest / "var", "trusted.overlay.opaque") == b"y"
    assert (dest / "var" / "new").read_bytes() == b"x"
    with pytest.raises(Exception, match="escapes"):
        unpack_layer(_tar([("../evil", b"x")]), tmp_path / "layer")


def test_image_pod_on_each_runtime(registries: tuple[Registry, Registry], cri_runtime: Any,
                                   poll: Any) -> None:
    """The same pull + container on the embedded runtime and on containerd (which reaches a
    loopback registry over plain HTTP by default, as the embedded runtime does)."""
    anon, _ = registries
    rt = cri_runtime
    if rt.name == "fake":
        pytest.skip("fake: pulls nothing and runs no process")
    ref = f"{anon.host}/podvisor/busybox:1"
    image_id = rt.client.pull_image(ref)
    try:
        image = rt.client.image_status(ref)
        assert image is not None and image.size > 500_000 and ref in image.repo_tags
        assert image_id in {i.id for i in rt.client.list_images()} or image.id == image_id
        sandbox = rt.run("imgpod")
        marker = f"/pv-marker-{rt.name}-{os.getpid()}"
        config = rt.container_config("c", ["sh", "-c", f"readlink /bin/sh; echo x > {marker}; "
                                                       f"cat {marker}"])
        config.image.image = ref
        cid = rt.client.create_container(sandbox[0], config, sandbox[1])
        rt.client.start_container(cid)
        st = rt.wait_exited(cid, 60.0)
        log = Path(sandbox[1].log_directory, config.log_path).read_text()
        assert st.exit_code == 0 and "busybox" in log and " x" in log, (st.message, log)
        assert not os.path.exists(marker)
    finally:
        from tests.services.conftest import cleanup
        cleanup(rt.client, rt.run_label)
        # containerd's RemoveImage drops every name of the image: when the suite's own
        # busybox (same content, another name) shares it, only that would be lost; keep it.
        status = rt.client.image_status(ref)
        if status is not None and set(status.repo_tags) <= {ref}:
            rt.client.remove_image(ref)


class _TokenFront:
    """A bearer-token front for the anonymous registry: /v2/ answers 401 with a Bearer
    challenge; /token trades puller:s3cret (basic) for a token; requests with the token are
    passed to the registry."""

    def __init__(self, upstream: str) -> None:
        import base64
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        import requests

        front = self
        self.token_requests: list[str] = []
        good = "Basic " + base64.b64encode(b"puller:s3cret").decode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                port = self.server.server_address[1]
                if self.path.startswith("/token"):
                    front.token_requests.append(self.path)
                    ok = self.headers.get("Authorization") == good
                    body = b'{"token": "T0K3N"}' if ok else b'{"errors": [{"code": ' \
                        b'"UNAUTHORIZED", "message": "bad credentials"}]}'
                    self.send_response(200 if ok else 401)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if self.headers.get("Authorization") != "Bearer T0K3N":
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", (
                        f'Bearer realm="http://127.0.0.1:{port}/token",service="front",'
                        'scope="repository:podvisor/busybox:pull"'))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                up = requests.get(f"http://{upstream}{self.path}", timeout=30, headers={
                    "Accept": self.headers.get("Accept", "*/*")})
                self.send_response(up.status_code)
                for key in ("Content-Type", "Docker-Content-Digest"):
                    if key in up.headers:
                        self.send_header(key, up.headers[key])
                self.send_header("Content-Length", str(len(up.content)))
                self.end_headers()
                self.wfile.write(up.content)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_bearer_token_challenge(registries: tuple[Registry, Registry],
                                embedded_runtime: Any) -> None:
    anon, _ = registries
    front = _TokenFront(anon.host)
    try:
        ref = f"{front.host}/podvisor/busybox:1"
        with pytest.raises(CriError, match="bad credentials"):
            embedded_runtime.client.pull_image(
                ref, auth=pb.AuthConfig(username="puller", password="nope"))
        image_id = embedded_runtime.client.pull_image(
            ref, auth=pb.AuthConfig(username="puller", password="s3cret"))
        assert image_id.startswith("sha256:")
        assert any("service=front" in p and "scope=repository" in p
                   for p in front.token_requests)
    finally:
        front.close()


def test_mirror_first_and_settings(registries: tuple[Registry, Registry],
                                   tmp_path: Path) -> None:
    """imageRegistries: a host's mirror is tried first (here the only one that answers);
    loopback hosts are plain HTTP by default, others HTTPS unless plainHTTP."""
    from podvisor.services.runtime import registry as reg
    from podvisor.services.runtime.imagestore import ImageStore

    anon, _ = registries
    settings = reg.RegistrySettings.from_config(
        {"registry.invalid:5000": {"mirrors": [anon.host]}, "10.1.2.3:5000": {"plainHTTP": True}})
    assert [e[0] for e in settings.endpoints("registry.invalid:5000")] == [
        f"http://{anon.host}", "https://registry.invalid:5000"]
    assert settings.endpoints("10.1.2.3:5000")[0][0] == "http://10.1.2.3:5000"
    assert settings.endpoints("docker.io")[0][0] == "https://registry-1.docker.io"
    store = ImageStore(tmp_path / "store", settings)
    rec = store.pull("registry.invalid:5000/podvisor/busybox:1")
    assert rec.repo_tags == ["registry.invalid:5000/podvisor/busybox:1"]
    with pytest.raises(ValueError, match="unknown key"):
        reg.RegistrySettings.from_config({"h": {"insecure": True}})
    assert reg.parse_reference("busybox") == reg.Reference("docker.io", "library/busybox",
                                                           "latest")
