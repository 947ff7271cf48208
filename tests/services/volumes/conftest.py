"""The volume tests' API: the stand-in API server with its volume controllers (binding,
provisioning, attach), both stopped after the test, and the mounts a failed test left under its
tmp_path lazily unmounted. ``api`` is the server; ``controllers`` the controllers, for a test
that plays a provisioner or the external attacher."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.volumes.claimpods import mounts_under
from tests.support.kubeapi import KubeApi
from tests.support.kubeapi.volumes import VolumeControllers


@pytest.fixture
def volume_api(tmp_path: Path) -> Iterator[tuple[KubeApi, VolumeControllers]]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    controllers = VolumeControllers(server).start()
    yield server, controllers
    controllers.stop()
    server.stop()
    for point in reversed(mounts_under(tmp_path)):  # a failed test's leftovers
        subprocess.run(["umount", "-l", point], check=False)


@pytest.fixture
def api(volume_api: tuple[KubeApi, VolumeControllers]) -> KubeApi:
    return volume_api[0]


@pytest.fixture
def controllers(volume_api: tuple[KubeApi, VolumeControllers]) -> VolumeControllers:
    return volume_api[1]
