"""What keeps an idle sync loop cheap: a quiet runtime is not listed again while the event
stream is live, housekeeping shares the workers' listing, an unchanged raw pod of a source set
is not parsed again, mountinfo is parsed once per change (unit tests over the CRI fake)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.common import FakeClock
from podvisor.common.logs import MemoryLogger
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.pod import parse as pod_parse
from podvisor.services.syncloop import labels as L
from podvisor.services.syncloop import loop as loop_module
from podvisor.services.syncloop.cgroupfs import FakeCgroupFS
from podvisor.services.syncloop.podcache import RuntimeCache
from podvisor.services.syncloop.podcgroups import new_pod_cgroups
from tests.services.syncloop.test_syncloop_events import Harness, manifest

MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
"""


def _lists(cri: FakeRuntimeClient) -> int:
    return len(cri.method_calls("ListPodSandbox"))


def _never(name: str, count: int) -> bool:
    return False


def test_a_quiet_watched_runtime_is_not_listed_again() -> None:
    cri, clock = FakeRuntimeClient(), FakeClock(100.0)
    cache = RuntimeCache(cri, clock, lambda: 1000.0, max_age=5.0, quiet_max_age=30.0)
    cache.pod("u1", 99.0, _never)
    assert _lists(cri) == 1
    clock.now = 110.0                                  # unwatched: 5 s at most, as before
    cache.pod("u1", 0.0, _never)
    assert _lists(cri) == 2
    cache.watched(True)                                # the stream goes live: a change
    clock.now = 116.0
    cache.pod("u1", 0.0, _never)                       # (too old for the old rules too)
    assert _lists(cri) == 3
    clock.now = 125.0
    cache.pod("u1", 120.0, _never)                     # older than asked, 9 s old: quiet
    cache.pod_uids(2.0)
    assert _lists(cri) == 3
    cache.changed()                                    # an event: list again
    cache.pod_uids(2.0)
    assert _lists(cri) == 4
    clock.now = 156.0                                  # quiet, but older than 30 s
    cache.pod("u1", 0.0, _never)
    assert _lists(cri) == 5
    cache.watched(False)                               # stream down: the old rules
    clock.now = 160.0
    cache.pod("u1", 157.0, _never)
    assert _lists(cri) == 6


def test_a_change_during_a_listing_leaves_it_unquiet() -> None:
    cri, clock = FakeRuntimeClient(), FakeClock(100.0)
    cache = RuntimeCache(cri, clock, lambda: 1000.0, max_age=5.0)
    cache.watched(True)
    real = cri.list_containers

    def racing(filter: Any = None) -> list[pb.Container]:
        cache.changed()                                # an event while the listing runs
        return real(filter)

    cri.list_containers = racing  # type: ignore[method-assign]
    cache.pod_uids(2.0)
    cri.list_containers = real  # type: ignore[method-assign]
    clock.now += 3
    cache.pod_uids(2.0)
    assert _lists(cri) == 2


def test_housekeeping_shares_the_listing_and_sees_no_orphan_in_a_pod_just_terminated(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.loop.deps.housekeeping_interval = 2.0
    cache = h.sync.cache
    assert cache is not None
    cache.watched(True)
    h.set(manifest("u1"), manifest("u2"))
    for _ in range(2):                                 # the listing after the starts
        h.now += 2
        h.settle()
    before = _lists(h.cri)
    for _ in range(5):                                 # 10 s of housekeeping, nothing changes
        h.now += 2
        h.settle()
    assert _lists(h.cri) == before
    h.set(manifest("u1"))                              # u2 goes: terminated (acted: a change)
    assert {s.labels[L.POD_UID] for s in h.cri.list_pod_sandbox()} == {"u1"}
    assert "u2" not in h.loop.deps.table.workers
    for _ in range(3):
        h.now += 2
        h.settle()
    assert not [e for e in h.log.events if e["event"] == "syncloop.pod.orphan"]


def test_a_listing_from_before_a_termination_shows_no_orphan(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.loop.deps.housekeeping_interval = 2.0
    h.set(manifest("u1"), manifest("u2"))
    # as if the pool listed just before u2's worker finished its termination
    stale = {"u1", "u2"}
    h.loop.handle_pod_set("file", [manifest("u1")], h.now)
    h.settle()
    assert "u2" not in h.loop.deps.table.workers
    h.loop._housekeeping_done(stale, None, set(), h.now - 0.5)
    assert "u2" not in h.loop.deps.table.workers      # not an orphan: killed by us after
    assert not [e for e in h.log.events if e["event"] == "syncloop.pod.orphan"]
    h.loop._housekeeping_done({"u1", "u3"}, None, set(), h.now)
    assert "u3" in h.loop.deps.table.workers          # a real orphan still is one


def test_pods_off_the_bus_are_rebuilt_not_validated_again(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A source validated its pods once; the loop rebuilds them (``pod_from_wire``), never
    validates them again, and drops a malformed one (a bug upstream) with an error logged."""
    h = Harness(tmp_path)
    rebuilt: list[Any] = []
    real = loop_module.pod_from_wire

    def counting(raw: Any, where: str = "") -> Any:
        rebuilt.append(raw)
        return real(raw, where=where)

    def no_validation(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a pod off the bus was validated again")

    one, two, changed = manifest("u1"), manifest("u2"), manifest("u2", names=("a",))
    monkeypatch.setattr(loop_module, "pod_from_wire", counting)
    monkeypatch.setattr(pod_parse, "parse_spec", no_validation)  # any pod_from_dict call
    h.set(one, two)
    assert len(rebuilt) == 2
    h.set(one, changed, {"metadata": {"uid": "u9"}}, ["not", "a", "pod"])
    [w] = [w for w in h.loop.deps.table.workers.values() if w.uid == "u2"]
    assert w.pod is not None and [c.name for c in w.pod.spec.containers] == ["a"]
    assert set(h.loop.deps.table.workers) == {"u1", "u2"}   # the others went on
    invalid = [e for e in h.log.events if e["event"] == "syncloop.pod.invalid"]
    assert len(invalid) == 2 and all(e["source"] == "file" for e in invalid)
    assert "not a validated pod wire form" in invalid[0]["error"]


def test_mountinfo_is_parsed_again_only_when_it_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    from podvisor.services.syncloop import podcgroups

    fs = FakeCgroupFS(MOUNTINFO, ["/sys/fs/cgroup/cpu/podvisor/podu7"])
    cg = new_pod_cgroups("/podvisor", fs, MemoryLogger())
    calls: list[int] = []
    real = podcgroups.parse_mountinfo

    def counting(text: str) -> Any:
        calls.append(1)
        return real(text)

    monkeypatch.setattr(podcgroups, "parse_mountinfo", counting)
    first = cg.leftovers(set())
    assert first == {"u7"}
    assert cg.leftovers(set()) == first and len(calls) == 1
    fs.text += "\n"
    cg.leftovers(set())
    assert len(calls) == 2


def test_a_periodic_resync_that_needs_nothing_stays_on_the_loop_thread(tmp_path: Path) -> None:
    """The kubelet's 1 min resync of a running pod: a full SyncPod against the shared listing,
    done on the loop thread when it needs no CRI call (no two thread hand-offs per pod); a pod
    that needs something (here: a container to restart) still goes to a pool thread."""
    h = Harness(tmp_path)
    submitted: list[str] = []
    inline = h.loop.deps.submit
    h.loop.deps.submit = lambda fn: (submitted.append("work"), inline(fn))[1]
    h.set(manifest(uid="u1", names=("a",)), manifest(uid="u2", names=("b",)))
    h.events()
    h.now += 1
    h.loop.deps.sync.cache.pod("u1", h.now, _never)   # a listing newer than both syncs
    h.set_mark()
    submitted.clear()
    h.now += 100                                     # both due for their periodic resync
    h.loop.deps.sync.cache._max_age = 1e9            # (the listing stays usable)
    h.settle(1)
    assert h.calls_since_mark() == [] and submitted == []
    assert set(h.running("u1")) == {"a"} and set(h.running("u2")) == {"b"}

    h.cri.exit_container(h.running("u2")["b"], 1)    # (the event is not delivered)
    h.now += 100                                     # the listing predates the last syncs:
    h.settle(2)                                      # listing again is a pool thread's job
    assert submitted, "a resync that must act goes to the pool"
    assert "StartContainer" in h.calls_since_mark()
