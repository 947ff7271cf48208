"""Every shipped example manifest is valid, warning-free, and reads as one set per folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from podvisor.services.pod import decode_pod
from podvisor.services.sources.common import FirstSeen
from podvisor.services.sources.files import read_static_pods

EXAMPLES = Path(__file__).resolve().parents[3] / "deploy" / "examples"
SHIPPED = {"web.yaml", "init.yaml", "logger.yaml"}
MANIFESTS = [folder / name for folder in (EXAMPLES, EXAMPLES / "containerd")
             for name in sorted(SHIPPED)]


def test_there_are_examples() -> None:
    assert all(p.is_file() for p in MANIFESTS)


@pytest.mark.parametrize("path", MANIFESTS, ids=[str(p.relative_to(EXAMPLES)) for p in MANIFESTS])
def test_example_is_valid_without_warnings(path: Path) -> None:
    parsed = decode_pod(path.read_bytes(), str(path))
    assert parsed.warnings == ()
    images = {c.image for c in parsed.pod.all_containers()}
    assert images == ({"localhost/podvisor/busybox:1"} if path.parent.name == "containerd"
                      else {"host"})


@pytest.mark.parametrize("folder", [EXAMPLES, EXAMPLES / "containerd"], ids=["embedded",
                                                                             "containerd"])
def test_example_folder_reads_cleanly(folder: Path) -> None:
    result = read_static_pods(folder, "node", FirstSeen(lambda: 0.0))
    assert [e for e in result.errors if Path(e.location).name in SHIPPED] == []
    assert {p.name for p in result.pods} >= {"logger-node", "web-node", "with-init-node"}
