"""PodConfig merge: table-driven, pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from podvisor.services.pod import (
    CONFIG_SEEN_ANNOTATION,
    CONFIG_SOURCE_ANNOTATION,
    Pod,
    pod_from_dict,
)
from podvisor.services.syncloop.podconfig import PodOp, new_pod_config


@dataclass(frozen=True)
class P:
    """A compact description of a pod for the tables."""

    name: str
    uid: str = ""
    cmd: str = "a"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    deletion: str | None = None
    grace: int | None = None
    status: dict[str, Any] = field(default_factory=dict)
    location: str = ""

    def build(self) -> Pod:
        meta: dict[str, Any] = {"name": self.name, "namespace": "default",
                                "uid": self.uid or f"uid-{self.name}",
                                "labels": self.labels, "annotations": self.annotations}
        if self.deletion:
            meta["deletionTimestamp"] = self.deletion
        if self.grace is not None:
            meta["deletionGracePeriodSeconds"] = self.grace
        doc = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": self.status,
               "spec": {"containers": [{"name": "c", "image": "host", "command": [self.cmd]}]},
               "podvisor": {"source": "file",
                            "location": self.location or f"/pods/{self.name}.yaml"}}
        return pod_from_dict(doc).pod


T0 = "2024-01-01T00:00:00Z"
Step = tuple[str, list[P], list[tuple[PodOp, list[str]]]]

CASES: dict[str, list[Step]] = {
    "first empty set is an empty ADD": [
        ("file", [], [(PodOp.ADD, [])]),
        ("file", [], []),
    ],
    "first set adds, same set is a no-op": [
        ("file", [P("a"), P("b")], [(PodOp.ADD, ["a", "b"])]),
        ("file", [P("a"), P("b")], []),
    ],
    "absent pod is removed": [
        ("file", [P("a"), P("b")], [(PodOp.ADD, ["a", "b"])]),
        ("file", [P("b")], [(PodOp.REMOVE, ["a"])]),
        ("file", [], [(PodOp.REMOVE, ["b"])]),
    ],
    "spec change is an update": [
        ("file", [P("a")], [(PodOp.ADD, ["a"])]),
        ("file", [P("a", cmd="b")], [(PodOp.UPDATE, ["a"])]),
    ],
    "labels change is an update": [
        ("file", [P("a")], [(PodOp.ADD, ["a"])]),
        ("file", [P("a", labels={"x": "y"})], [(PodOp.UPDATE, ["a"])]),
    ],
    "user annotation change is an update": [
        ("file", [P("a")], [(PodOp.ADD, ["a"])]),
        ("file", [P("a", annotations={"x": "y"})], [(PodOp.UPDATE, ["a"])]),
    ],
    "config.* annotation change is nothing": [
        ("file", [P("a", annotations={CONFIG_SEEN_ANNOTATION: "1"})], [(PodOp.ADD, ["a"])]),
        ("file", [P("a", annotations={CONFIG_SEEN_ANNOTATION: "2",
                                      "kubernetes.io/config.hash": "h"})], []),
    ],
    "status-only change is a reconcile": [
        ("file", [P("a", status={"phase": "Pending"})], [(PodOp.ADD, ["a"])]),
        ("file", [P("a", status={"phase": "Running"})], [(PodOp.RECONCILE, ["a"])]),
    ],
    "deletion timestamp is a delete": [
        ("file", [P("a")], [(PodOp.ADD, ["a"])]),
        ("file", [P("a", deletion=T0, grace=5)], [(PodOp.DELETE, ["a"])]),
        ("file", [P("a", deletion=T0, grace=1)], [(PodOp.DELETE, ["a"])]),
        ("file", [P("a", deletion=T0, grace=1)], []),
    ],
    "new pod with a deletion timestamp is still an add": [
        ("file", [P("a", deletion=T0)], [(PodOp.ADD, ["a"])]),
    ],
    "spec and status change together is an update only": [
        ("file", [P("a")], [(PodOp.ADD, ["a"])]),
        ("file", [P("a", cmd="b", status={"phase": "Running"})], [(PodOp.UPDATE, ["a"])]),
    ],
    "emit order is REMOVE ADD UPDATE DELETE RECONCILE": [
        ("file", [P("gone"), P("upd"), P("del"), P("rec")],
         [(PodOp.ADD, ["del", "gone", "rec", "upd"])]),  # in file-name order
        ("file", [P("new"), P("upd", cmd="z"), P("del", deletion=T0),
                  P("rec", status={"phase": "Running"})],
         [(PodOp.REMOVE, ["gone"]), (PodOp.ADD, ["new"]), (PodOp.UPDATE, ["upd"]),
          (PodOp.DELETE, ["del"]), (PodOp.RECONCILE, ["rec"])]),
    ],
    "static pod edit (new UID) is remove + add": [
        ("file", [P("a", uid="u1")], [(PodOp.ADD, ["a"])]),
        ("file", [P("a", uid="u2", cmd="b")], [(PodOp.REMOVE, ["a"]), (PodOp.ADD, ["a"])]),
    ],
    "sources are independent": [
        ("file", [P("a")], [(PodOp.ADD, ["a"])]),
        ("http", [], [(PodOp.ADD, [])]),
        ("http", [P("b", location="http://h")], [(PodOp.ADD, ["b"])]),
        ("file", [], [(PodOp.REMOVE, ["a"])]),
    ],
    "first set with only a removal-free reconcile is impossible; second source first set": [
        ("http", [P("a", location="http://h")], [(PodOp.ADD, ["a"])]),
        ("file", [P("a", location="/pods/a.yaml")], [(PodOp.ADD, ["a"])]),
    ],
    "duplicate names: first by file name wins": [
        ("file", [P("a", uid="u2", location="/pods/2.yaml"),
                  P("a", uid="u1", location="/pods/1.yaml")], [(PodOp.ADD, ["a"])]),
        ("file", [P("a", uid="u2", location="/pods/2.yaml")],
         [(PodOp.REMOVE, ["a"]), (PodOp.ADD, ["a"])]),
    ],
    "duplicate UIDs: first wins": [
        ("file", [P("a", uid="u"), P("b", uid="u")], [(PodOp.ADD, ["a"])]),
    ],
}


@pytest.mark.parametrize("steps", list(CASES.values()), ids=list(CASES))
def test_merge_table(steps: list[Step]) -> None:
    config = new_pod_config({"file", "http"})
    for i, (source, pods, expected) in enumerate(steps):
        updates = config.apply(source, [p.build() for p in pods])
        got = [(u.op, [p.metadata.name for p in u.pods]) for u in updates]
        assert got == expected, f"step {i}"
        assert all(u.source == source for u in updates)


def test_duplicates_are_reported_and_cleared() -> None:
    config = new_pod_config({"file"})
    one, two = P("a", uid="u1", location="/p/1.yaml"), P("a", uid="u2", location="/p/2.yaml")
    config.apply("file", [two.build(), one.build()])
    dups = config.duplicates("file")
    assert len(dups) == 1
    assert (dups[0].uid, dups[0].location, dups[0].kept_location) == ("u2", "/p/2.yaml",
                                                                      "/p/1.yaml")
    assert "duplicate pod name 'a_default'" in dups[0].reason and "/p/1.yaml" in dups[0].reason
    assert [p.uid for p in config.pods()] == ["u1"]
    config.apply("file", [one.build()])
    assert config.duplicates("file") == ()


def test_sources_ready() -> None:
    config = new_pod_config({"file", "http"})
    assert not config.sources_ready()
    config.apply("file", [])
    assert not config.sources_ready() and config.seen_sources() == {"file"}
    config.apply("http", [])
    assert config.sources_ready()
    assert new_pod_config([]).sources_ready()


def test_update_keeps_first_seen_and_marks_source() -> None:
    config = new_pod_config({"file"})
    (add,) = config.apply("file", [P("a", annotations={CONFIG_SEEN_ANNOTATION: "t1"}).build()])
    assert add.pods[0].metadata.annotations[CONFIG_SOURCE_ANNOTATION] == "file"
    (upd,) = config.apply("file", [P("a", cmd="b",
                                     annotations={CONFIG_SEEN_ANNOTATION: "t2"}).build()])
    pod = upd.pods[0]
    assert upd.op is PodOp.UPDATE
    assert pod.metadata.annotations[CONFIG_SEEN_ANNOTATION] == "t1"
    assert pod.spec.containers[0].command == ("b",)
    assert config.pods() == [pod]


def test_reconcile_carries_new_status() -> None:
    config = new_pod_config({"file"})
    config.apply("file", [P("a").build()])
    (rec,) = config.apply("file", [P("a", status={"phase": "Running"}).build()])
    assert rec.pods[0].status == {"phase": "Running"}
    assert config.pods()[0].status == {"phase": "Running"}


def test_pods_lists_all_sources() -> None:
    config = new_pod_config({"file", "http"})
    config.apply("file", [P("a").build()])
    config.apply("http", [P("b").build()])
    assert sorted(p.name for p in config.pods()) == ["a", "b"]


def test_a_refused_pod_keeps_the_version_it_had() -> None:
    """[issue 24] A source that refuses a pod it sent before (an update podvisor cannot
    honour) names its UID in ``keep``: no REMOVE, no UPDATE; once it comes back changed, the
    UPDATE is against the version kept."""
    config = new_pod_config({"api"})
    config.apply("api", [P("a").build()])
    assert config.apply("api", [], keep={"uid-a"}) == []
    assert [p.uid for p in config.pods()] == ["uid-a"]
    [update] = config.apply("api", [P("a", cmd="b").build()])
    assert update.op is PodOp.UPDATE
    assert [u.op for u in config.apply("api", [], keep={"uid-x"})] == [PodOp.REMOVE]
