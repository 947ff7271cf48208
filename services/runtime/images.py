"""The embedded runtime's images: the built-in ``host`` image, which runs the command on the host
filesystem, and OCI images pulled from registries into the content-addressed store
(imagestore.py), whose containers run inside the image's root filesystem."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypedDict

import grpc
from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.runtime import registry as reg
from podvisor.services.runtime.faults import Fault
from podvisor.services.runtime.imagestore import ImageError, ImageRecord, ImageStore, Progress

HOST_IMAGE = "host"
HOST_IMAGE_ID = "sha256:" + hashlib.sha256(b"podvisor host image v1").hexdigest()
_HOST_NAMES = {HOST_IMAGE, "host:latest", "docker.io/library/host:latest", HOST_IMAGE_ID}
# The image's "config": what an OCI image would bring (PATH, working dir).
HOST_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
HOST_WORKDIR = "/"


def is_host(ref: str) -> bool:
    return ref in _HOST_NAMES


def host_image() -> pb.Image:
    return pb.Image(
        id=HOST_IMAGE_ID, repo_tags=[HOST_IMAGE], size=0, spec=pb.ImageSpec(image=HOST_IMAGE),
        uid=pb.Int64Value(value=os.geteuid()),  # it runs as the runtime's user (the kubelet's
        # runAsNonRoot check reads this)
        pinned=True,  # never garbage-collected: it is not stored anywhere
    )


def image_of(rec: ImageRecord) -> pb.Image:
    image = pb.Image(id=rec.id, repo_tags=rec.repo_tags, repo_digests=rec.repo_digests,
                     size=rec.size, spec=pb.ImageSpec(image=rec.id))
    user = str(rec.config.get("User") or "").split(":", 1)[0]
    if user.isdigit():
        image.uid.value = int(user)
    elif user:
        image.username = user
    return image


class Images:
    """The host image plus the store; every error is a Fault with the reason."""

    def __init__(self, root: Path, registries: Mapping[str, Any] | None = None,
                 wall: Callable[[], int] = SYSTEM_CLOCK.wall_ns) -> None:
        try:
            settings = reg.RegistrySettings.from_config(dict(registries or {}))
        except ValueError as exc:
            raise Fault(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        self.store = ImageStore(root, settings, wall)

    def list(self, want: str = "") -> list[pb.Image]:
        if want:
            one = self.resolve(want)
            return [one] if one is not None else []
        return [host_image(), *(image_of(r) for r in self.store.images())]

    def resolve(self, ref: str) -> pb.Image | None:
        if is_host(ref):
            return host_image()
        rec = self.store.resolve(ref)
        return image_of(rec) if rec is not None else None

    def record(self, ref: str) -> ImageRecord | None:
        """The stored image behind ``ref`` (None for ``host``); NOT_FOUND when absent."""
        if is_host(ref):
            return None
        rec = self.store.resolve(ref)
        if rec is None:
            raise Fault(grpc.StatusCode.NOT_FOUND,
                        f"image {ref!r} is not present in the embedded runtime: pull it first")
        return rec

    def require(self, ref: str) -> pb.Image:
        image = self.resolve(ref)
        if image is None:
            raise Fault(grpc.StatusCode.NOT_FOUND,
                        f"image {ref!r} is not present in the embedded runtime: pull it first")
        return image

    def pull(self, ref: str, auth: pb.AuthConfig | None = None,
             progress: Progress | None = None) -> str:
        if is_host(ref):
            return HOST_IMAGE_ID
        creds = None
        if auth is not None:
            creds = reg.Credentials.from_auth(auth.username, auth.password, auth.auth,
                                              auth.identity_token, auth.registry_token)
        board = ProgressBoard(self.store.root / "progress", ref)
        try:
            return self.store.pull(ref, creds, progress or board.update).id
        except reg.InvalidReference as exc:
            raise Fault(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except reg.RegistryError as exc:
            code = grpc.StatusCode.NOT_FOUND if exc.not_found else (
                grpc.StatusCode.PERMISSION_DENIED if exc.status in (401, 403)
                else grpc.StatusCode.UNAVAILABLE)
            raise Fault(code, f"pulling image {ref!r}: {exc}") from None
        except (ImageError, OSError, ValueError, KeyError) as exc:
            raise Fault(grpc.StatusCode.INTERNAL, f"pulling image {ref!r}: {exc}") from None
        finally:
            board.close()

    def remove(self, ref: str, layers_in_use: Iterable[str] = ()) -> None:
        if is_host(ref):
            raise Fault(grpc.StatusCode.FAILED_PRECONDITION,
                        "image 'host' is built into the embedded runtime and cannot be removed")
        self.store.remove(ref, layers_in_use)  # removing an absent image is not an error (CRI)

    def usage(self) -> tuple[int, int]:
        return self.store.used_bytes()


class _Layer(TypedDict):
    """A layer's line of a progress file."""

    phase: str
    done: int
    total: int


def progress_file(directory: Path, ref: str) -> Path:
    """Where a pull of ``ref`` publishes its per-layer progress (``podvisorctl images pull``
    reads it: CRI PullImage has no progress stream)."""
    return directory / (hashlib.sha256(ref.encode()).hexdigest()[:24] + ".json")


class ProgressBoard:
    """Per-layer progress of one pull, written (atomically, at most every 0.1 s and at each
    phase change) to ``progress_file``; removed when the pull ends."""

    def __init__(self, directory: Path, ref: str,
                 mono: Callable[[], float] = SYSTEM_CLOCK.monotonic) -> None:
        self.path = progress_file(directory, ref)
        self._mono = mono
        self.ref = ref
        self.layers: dict[str, _Layer] = {}
        self._last = 0.0
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)

    def update(self, digest: str, phase: str, done: int, total: int) -> None:
        with self._lock:
            before = self.layers.get(digest)
            old = before["phase"] if before is not None else None
            self.layers[digest] = {"phase": phase, "done": done, "total": total}
            now = self._mono()
            if phase == old and now - self._last < 0.1:
                return
            self._last = now
            tmp = self.path.with_suffix(f".{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps({"ref": self.ref, "layers": self.layers}))
            os.replace(tmp, self.path)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)
