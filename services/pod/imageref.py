"""Image reference validation (the kubelet's InvalidImageName): Docker's reference grammar,
``[host[:port]/]path[:tag][@sha256:hex]`` with lowercase path components."""

from __future__ import annotations

import re

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*" \
        r"[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_REFERENCE = re.compile(
    rf"^(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
    r"(?:@sha256:[0-9a-f]{64})?$")


def image_reference_error(image: str) -> str | None:
    """None for a valid reference, else the kubelet's message."""
    if len(image) <= 4096 and _REFERENCE.match(image):
        return None
    return (f'Failed to apply default image tag "{image}": couldn\'t parse image name '
            f'"{image}": invalid reference format')
