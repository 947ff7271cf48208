#!/usr/bin/env python3
"""Build podvisor's two test images as OCI-layout tarballs, offline, with the standard library.

    build_images.py --pause PAUSE_BINARY --busybox BUSYBOX_BINARY --out DIR

writes DIR/pause.tar (`localhost/podvisor/pause:1`, entrypoint `/pause`) and DIR/busybox.tar
(`localhost/podvisor/busybox:1`, `/bin/busybox` plus one symlink per applet in /bin, so `sh`,
`sleep`, `echo`, `cat`... exist). Each tarball is an OCI image layout (`oci-layout`, `index.json`,
`blobs/sha256/...`) whose index entry carries the `io.containerd.image.name` annotation, which is
how `ctr -n k8s.io images import` names the image. Output is byte-for-byte reproducible (fixed
mtimes, owners and gzip header), so re-running changes nothing.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import platform
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAUSE_IMAGE = "localhost/podvisor/pause:1"
BUSYBOX_IMAGE = "localhost/podvisor/busybox:1"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}


@dataclass(frozen=True)
class Entry:
    """One file-system entry of a layer: a directory, a regular file or a symlink."""

    path: str
    mode: int
    data: bytes | None = None  # regular file contents
    link: str | None = None  # symlink target


@dataclass(frozen=True)
class Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, **extra: Any) -> dict[str, Any]:
        size = len(self.data)
        return {"mediaType": self.media_type, "digest": self.digest, "size": size, **extra}


def oci_arch() -> str:
    machine = platform.machine()
    return _ARCH.get(machine, machine)


def layer_tar(entries: list[Entry]) -> bytes:
    """An uncompressed, reproducible tar of the entries (root-owned, mtime 0)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.path)
            info.mode, info.uid, info.gid, info.mtime = entry.mode, 0, 0, 0
            if entry.link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, entry.link
                tar.addfile(info)
            elif entry.data is not None:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
            else:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
    return buf.getvalue()


def image_layout(name: str, entries: list[Entry], config: dict[str, Any]) -> bytes:
    """An OCI image layout holding one single-layer image, as tar bytes."""
    raw = layer_tar(entries)
    layer = Blob(LAYER_TYPE, gzip.compress(raw, compresslevel=6, mtime=0))
    arch = oci_arch()
    image_config = {
        "architecture": arch,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
        "history": [{"created_by": "podvisor deploy/containerd/build_images.py"}],
    }
    cfg = Blob(CONFIG_TYPE, _json(image_config))
    manifest = Blob(
        MANIFEST_TYPE,
        _json({"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
               "config": cfg.descriptor(), "layers": [layer.descriptor()]}),
    )
    annotations = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
    }
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest.descriptor(platform={"architecture": arch, "os": "linux"},
                                          annotations=annotations)],
    }
    files = [Entry("blobs", 0o755), Entry("blobs/sha256", 0o755)]
    files += [Entry("blobs/sha256/" + b.digest.split(":")[1], 0o644, b.data)
              for b in (layer, cfg, manifest)]
    files += [Entry("oci-layout", 0o644, _json({"imageLayoutVersion": "1.0.0"})),
              Entry("index.json", 0o644, _json(index))]
    return layer_tar(files)


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def base_entries() -> list[Entry]:
    """Directories and files every image gets (runc creates /proc, /sys and /dev itself)."""
    return [
        Entry("bin", 0o755), Entry("dev", 0o755), Entry("etc", 0o755), Entry("proc", 0o755),
        Entry("sys", 0o755), Entry("tmp", 0o1777), Entry("root", 0o700),
        Entry("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\n"
                                   b"nobody:x:65534:65534:nobody:/:/bin/false\n"),
        Entry("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n"),
    ]


def pause_image(pause_binary: Path) -> bytes:
    entries = [*base_entries(), Entry("pause", 0o755, pause_binary.read_bytes())]
    return image_layout(PAUSE_IMAGE, entries, {"Entrypoint": ["/pause"], "Env": [DEFAULT_PATH]})


def busybox_applets(busybox: Path) -> list[str]:
    out = subprocess.run([str(busybox), "--list"], check=True, capture_output=True, text=True)
    return sorted({a.strip() for a in out.stdout.split() if a.strip() and "/" not in a})


def busybox_image(busybox: Path) -> bytes:
    entries = [*base_entries(), Entry("bin/busybox", 0o755, busybox.read_bytes())]
    entries += [Entry("bin/" + a, 0o777, link="busybox")
                for a in busybox_applets(busybox) if a != "busybox"]
    return image_layout(BUSYBOX_IMAGE, entries, {"Cmd": ["sh"], "Env": [DEFAULT_PATH]})


def write_if_changed(path: Path, data: bytes) -> bool:
    if path.exists() and path.read_bytes() == data:
        return False
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pause", type=Path, required=True, help="static pause binary")
    parser.add_argument("--busybox", type=Path, required=True, help="static busybox binary")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    args = parser.parse_args(argv)
    for binary in (args.pause, args.busybox):
        if not binary.is_file():
            print(f"build_images: {binary}: no such file", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for file_name, data in (("pause.tar", pause_image(args.pause)),
                            ("busybox.tar", busybox_image(args.busybox))):
        changed = write_if_changed(args.out / file_name, data)
        print(f"build_images: {args.out / file_name} {'written' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
