"""source-api's resume point (unit): the version moves with events and bookmarks together with
the set it stands for; the store round-trips it atomically and refuses a file for another
server/selector or a damaged one (set aside, so the next start lists)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from podvisor.common.logs import MemoryLogger
from podvisor.services.sources.api_resume import ResumeStore
from podvisor.services.sources.api_source import ApiPodState


def pod(uid: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": uid, "uid": uid, "resourceVersion": rv}}


def test_state_version_follows_events_and_bookmarks() -> None:
    wakes: list[int] = []
    state = ApiPodState(lambda: wakes.append(1))
    state.listed([pod("a", "3")], "5")
    changes, rv, items = state.snapshot()
    assert (rv, [i["metadata"]["uid"] for i in items]) == ("5", ["a"])
    state.event("ADDED", pod("b", "6"))
    state.event("BOOKMARK", {"metadata": {"resourceVersion": "9"}})
    later, rv, items = state.snapshot()
    assert later == changes + 2 and rv == "9"
    assert sorted(i["metadata"]["uid"] for i in items) == ["a", "b"]
    assert state.take() is not None and state.take() is None  # a bookmark changes no set
    state.event("DELETED", pod("a", "10"))
    assert [i["metadata"]["uid"] for i in state.snapshot()[2]] == ["b"]


def test_resumed_state_is_published_at_once() -> None:
    state = ApiPodState(lambda: None)
    state.resumed([pod("a", "3")], "7")
    taken = state.take()
    assert taken is not None and [i["metadata"]["uid"] for i in taken] == ["a"]
    assert state.snapshot()[1] == "7"


def test_store_round_trip_and_refusals(tmp_path: Path) -> None:
    log = MemoryLogger()
    path = tmp_path / "state" / "source-api.json"
    store = ResumeStore(path, log, server="h:1", selector="spec.nodeName=n")
    assert store.load() is None
    store.save("12", [pod("a", "3")])
    point = store.load()
    assert point is not None and point.rv == "12" and point.items == [pod("a", "3")]
    assert not path.with_name(path.name + ".tmp").exists()
    # saved for another node: not used, kept
    other = ResumeStore(path, log, server="h:1", selector="spec.nodeName=m")
    assert other.load() is None and path.exists()
    # damaged: not used, set aside
    path.write_text("{not json")
    assert store.load() is None
    assert not path.exists() and path.with_name(path.name + ".corrupt").exists()
    assert [e["event"] for e in log.events] == ["source.api.resume_other",
                                                "source.api.resume_unreadable"]
