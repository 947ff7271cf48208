"""The embedded runtime's image model: one built-in image, ``host``, that runs the command on the
host filesystem. Pulling real OCI images comes later; until then other references fail clearly."""

from __future__ import annotations

import hashlib
import os

import grpc
from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime.faults import Fault

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


def resolve(ref: str) -> pb.Image | None:
    return host_image() if is_host(ref) else None


def require(ref: str) -> pb.Image:
    image = resolve(ref)
    if image is None:
        raise Fault(grpc.StatusCode.NOT_FOUND, _missing(ref))
    return image


def pull(ref: str) -> str:
    if is_host(ref):
        return HOST_IMAGE_ID
    raise Fault(grpc.StatusCode.UNIMPLEMENTED, _missing(ref) + "; pulling OCI images is not "
                "supported yet")


def remove(ref: str) -> None:
    if is_host(ref):
        raise Fault(grpc.StatusCode.FAILED_PRECONDITION,
                    "image 'host' is built into the embedded runtime and cannot be removed")


def _missing(ref: str) -> str:
    return (f"image {ref!r} is not available in the embedded runtime: it only has the built-in "
            f"image {HOST_IMAGE!r}, which runs commands on the host filesystem")
