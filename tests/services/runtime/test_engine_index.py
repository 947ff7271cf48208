"""The embedded runtime's indexes: filtered lists by pod UID label, sandbox ID and full ID give
what a scan gives, name reservations hold, and a restart rebuilds them (in process, no gRPC)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.common.logs import MemoryLogger
from podvisor.services.runtime.engine import Engine
from podvisor.services.runtime.faults import Fault
from podvisor.services.runtime.index import POD_UID_LABEL
from podvisor.services.runtime.servicer import RuntimeServicer


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = Engine(tmp_path / "rt", MemoryLogger())
    e.start()
    yield e
    e.close()


def _sandbox(e: Engine, uid: str, attempt: int = 0) -> str:
    return e.run_sandbox(pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=uid, namespace="d", uid=uid, attempt=attempt),
        labels={POD_UID_LABEL: uid, "tier": "x"}), "")


def _container(e: Engine, sid: str, uid: str, name: str = "a", attempt: int = 0) -> str:
    return e.create_container(sid, pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name, attempt=attempt),
        image=pb.ImageSpec(image="host"), command=["true"],
        labels={POD_UID_LABEL: uid, "tier": "x"}))


def _ids(svc: RuntimeServicer, f: pb.ContainerFilter | None = None) -> set[str]:
    req = pb.ListContainersRequest(filter=f) if f is not None else pb.ListContainersRequest()
    resp: Any = svc.ListContainers(req, None)
    return {c.id for c in resp.containers}


def _sb_ids(svc: RuntimeServicer, f: pb.PodSandboxFilter) -> set[str]:
    resp: Any = svc.ListPodSandbox(pb.ListPodSandboxRequest(filter=f), None)
    return {s.id for s in resp.items}


def test_filtered_lists_match_a_scan(engine: Engine) -> None:
    svc = RuntimeServicer(engine)
    s1, s2 = _sandbox(engine, "u1"), _sandbox(engine, "u2")
    c1, c2 = _container(engine, s1, "u1"), _container(engine, s1, "u1", "b")
    c3 = _container(engine, s2, "u2")
    assert _ids(svc, pb.ContainerFilter(label_selector={POD_UID_LABEL: "u1"})) == {c1, c2}
    assert _ids(svc, pb.ContainerFilter(label_selector={POD_UID_LABEL: "u1", "tier": "y"})) == set()
    assert _ids(svc, pb.ContainerFilter(pod_sandbox_id=s2)) == {c3}
    assert _ids(svc, pb.ContainerFilter(pod_sandbox_id=s2[:8])) == {c3}   # a prefix: scanned
    assert _ids(svc, pb.ContainerFilter(id=c2)) == {c2}
    assert _ids(svc, pb.ContainerFilter(id=c2, pod_sandbox_id=s2)) == set()
    assert _ids(svc, pb.ContainerFilter(label_selector={"tier": "x"})) == {c1, c2, c3}
    assert _sb_ids(svc, pb.PodSandboxFilter(label_selector={POD_UID_LABEL: "u2"})) == {s2}
    assert _sb_ids(svc, pb.PodSandboxFilter(id=s1)) == {s1}
    engine.remove_container(c1)
    engine.remove_sandbox(s2)
    assert _ids(svc, pb.ContainerFilter(label_selector={POD_UID_LABEL: "u1"})) == {c2}
    assert _ids(svc, pb.ContainerFilter(label_selector={POD_UID_LABEL: "u2"})) == set()
    assert _sb_ids(svc, pb.PodSandboxFilter(label_selector={POD_UID_LABEL: "u2"})) == set()
    assert _ids(svc) == {c2}


def test_names_are_reserved_until_removed(engine: Engine) -> None:
    sid = _sandbox(engine, "u1")
    with pytest.raises(Fault) as err:
        _sandbox(engine, "u1")
    assert err.value.code is grpc.StatusCode.ALREADY_EXISTS
    cid = _container(engine, sid, "u1")
    with pytest.raises(Fault) as err:
        _container(engine, sid, "u1")
    assert err.value.code is grpc.StatusCode.ALREADY_EXISTS
    _container(engine, sid, "u1", attempt=1)
    engine.remove_container(cid)
    _container(engine, sid, "u1")                       # free again
    engine.remove_sandbox(sid)
    _sandbox(engine, "u1")


def test_restart_rebuilds_the_indexes(tmp_path: Path, engine: Engine) -> None:
    sid = _sandbox(engine, "u1")
    cid = _container(engine, sid, "u1")
    engine.close()
    again = Engine(tmp_path / "rt", MemoryLogger())
    again.start()
    try:
        svc = RuntimeServicer(again)
        assert _ids(svc, pb.ContainerFilter(label_selector={POD_UID_LABEL: "u1"})) == {cid}
        assert [c.id for c in again.containers_of(sid)] == [cid]
        with pytest.raises(Fault):
            _sandbox(again, "u1")
    finally:
        again.close()
