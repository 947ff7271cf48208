"""``nodeInfo.kubeletVersion`` that tells the truth (issue 26; KUBELET.md, "kubeletVersion and
skew").

podvisor follows the kubelet's behaviour of the Kubernetes minors ``OLDEST``..``NEWEST`` (the
releases KUBELET.md was read from). The version-skew policy: a kubelet may not be newer than
kube-apiserver and may be up to three minors older. So the minor reported is the newest
podvisor implements that the API server allows: ``min(NEWEST, server minor)``; an API server
older than ``OLDEST`` is refused (podvisor would have to claim a behaviour it does not have, or
be newer than the server), and one more than three minors ahead is reported as unsupported
skew (the Node still registers, as a kubelet would). The version is a semver
``v1.<minor>.0``; podvisor's own version goes where distributions put theirs, in the build
metadata: ``v1.33.0+podvisor-0.1.0`` (k3s: ``v1.33.0+k3s1``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

__all__ = ["NEWEST", "OLDEST", "SkewRefused", "VersionChoice", "choose", "podvisor_version"]

OLDEST = 29
NEWEST = 33
MAX_OLDER = 3  # the policy: a kubelet up to three minors older than kube-apiserver

_GIT_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


class SkewRefused(Exception):
    """The API server is older than any minor podvisor implements."""


@dataclass(frozen=True)
class VersionChoice:
    kubelet_version: str
    server: str  # the API server's gitVersion
    warning: str  # '' or why the skew is unsupported


def podvisor_version() -> str:
    try:
        return metadata.version("podvisor")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def server_minor(version: dict[str, object]) -> tuple[int, int]:
    """(major, minor) of a ``/version`` answer (gitVersion first; ``minor`` may read "33+")."""
    match = _GIT_VERSION.match(str(version.get("gitVersion") or ""))
    if match:
        return int(match.group(1)), int(match.group(2))
    major = re.match(r"\d+", str(version.get("major") or ""))
    minor = re.match(r"\d+", str(version.get("minor") or ""))
    if not major or not minor:
        raise ValueError(f"cannot read the API server's version from {version!r}")
    return int(major.group()), int(minor.group())


def choose(version: dict[str, object], own: str | None = None) -> VersionChoice:
    """The kubeletVersion to report to the API server whose ``/version`` is ``version``."""
    own = own or podvisor_version()
    git = str(version.get("gitVersion") or f"v{version.get('major')}.{version.get('minor')}")
    major, minor = server_minor(version)
    if major != 1 or minor < OLDEST:
        raise SkewRefused(
            f"kube-apiserver {git} is older than v1.{OLDEST}, the oldest Kubernetes minor "
            f"whose kubelet podvisor implements (v1.{OLDEST}-v1.{NEWEST}); the version-skew "
            "policy forbids a kubelet newer than its API server")
    reported = min(NEWEST, minor)
    warning = ""
    if minor - reported > MAX_OLDER:
        warning = (f"kubelet v1.{reported} is more than {MAX_OLDER} minors older than "
                   f"kube-apiserver {git}: unsupported by the version-skew policy")
    build = re.sub(r"[^0-9A-Za-z.-]", "-", own)
    return VersionChoice(f"v1.{reported}.0+podvisor-{build}", git, warning)
