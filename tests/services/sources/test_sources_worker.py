"""The file parse cache. (The helper-thread plumbing the source processes had here,
``LoopWorker`` and ``run_in_thread``, is the service loop's worker now: its tests are in
tests/common/test_service_worker.py.)"""

from __future__ import annotations

import time
from pathlib import Path

from podvisor.common import FakeClock
from podvisor.services.sources.common import FirstSeen
from podvisor.services.sources.files import ParseCache, read_static_pods

POD = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n"
       "  - name: c\n    image: host\n")


def later() -> int:
    """A wall clock a minute ahead: every file just written counts as settled."""
    return time.time_ns() + 60 * 10**9


def test_parse_cache_reuses_unchanged_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(POD.format(name="a"))
    (tmp_path / "bad.yaml").write_text("kind: Deployment\napiVersion: apps/v1\n")
    cache = ParseCache(wall_ns=later)
    seen = FirstSeen(lambda: 0.0)
    first = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert cache.hits == 0
    second = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert cache.hits == 2 and second == first
    (tmp_path / "a.yaml").write_text(POD.format(name="a2"))
    third = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert cache.hits == 3 and [p.name for p in third.pods] == ["a2-n"]
    (tmp_path / "bad.yaml").unlink()
    fourth = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert fourth.errors == () and cache.hits == 4


def test_parse_cache_reuses_built_pods_and_their_wire_form(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(POD.format(name="a"))
    cache = ParseCache(wall_ns=later)
    clock = FakeClock(wall=0.0)
    seen = FirstSeen(clock.wall)
    first = read_static_pods(tmp_path, "n", seen, cache=cache)
    second = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert second.pods[0] is first.pods[0] and second.wire[0] is first.wire[0]
    assert second.to_value(0.0).pods == [first.pods[0].to_dict()]
    # the first-seen time is not from the file: when it moves, the pod is rebuilt with it
    seen.forget_except([])
    clock.wall_now = 100.0
    third = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert cache.hits == 2
    assert third.pods[0].metadata.annotations["kubernetes.io/config.seen"] != \
        first.pods[0].metadata.annotations["kubernetes.io/config.seen"]
    assert third.to_value(0.0).pods == [third.pods[0].to_dict()]


def test_parse_cache_rereads_files_changed_within_the_last_seconds(tmp_path: Path) -> None:
    """Two same-size writes within one timestamp tick leave the stat equal: a file changed
    less than ``recent_ns`` ago is read again even though its stat matches."""
    file = tmp_path / "a.yaml"
    file.write_text(POD.format(name="a"))
    changed = max(file.stat().st_mtime_ns, file.stat().st_ctime_ns)
    now = changed + 10**9
    cache = ParseCache(wall_ns=lambda: now, recent_ns=2 * 10**9)
    seen = FirstSeen(lambda: 0.0)
    first = read_static_pods(tmp_path, "n", seen, cache=cache)
    second = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert cache.hits == 0  # read again...
    assert cache.rereads == 1 and second.pods[0] is first.pods[0]  # ...same bytes: not parsed
    now = changed + 3 * 10**9
    read_static_pods(tmp_path, "n", seen, cache=cache)
    assert cache.hits == 1
    # a same-size rewrite within the window is read and parsed again
    file.write_text(POD.format(name="b"))
    now = max(file.stat().st_mtime_ns, file.stat().st_ctime_ns) + 10**9
    third = read_static_pods(tmp_path, "n", seen, cache=cache)
    assert [p.name for p in third.pods] == ["b-n"] and cache.rereads == 1
