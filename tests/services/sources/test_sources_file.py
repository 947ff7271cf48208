"""File source: the pure reader, the inotify watcher and the poll loop on a real tmp dir."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from podvisor.common import FakeClock
from podvisor.services.pod import CONFIG_SEEN_ANNOTATION, PodValidationError, pod_from_dict
from podvisor.services.sources.common import FirstSeen, SourceSet
from podvisor.services.sources.file_source import FileSource
from podvisor.services.sources.files import read_capped, read_static_pods
from podvisor.services.sources.watcher import DirWatcher, new_inotify_watcher

NODE = "node-a"


def pod_yaml(name: str, cmd: str = "sleep") -> str:
    return (f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n"
            f"  - name: c\n    image: host\n    command: [{cmd}]\n")


def seen() -> FirstSeen:
    return FirstSeen(lambda: 1_700_000_000.0)


def read(path: Path) -> SourceSet:
    return read_static_pods(path, NODE, seen())


def names(result: SourceSet | None) -> list[str]:
    return [p.name for p in result.pods] if result is not None else []


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``check`` (which may block briefly itself) until True; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"


# --- the pure reader ---------------------------------------------------------------------------


def test_missing_path_is_an_empty_set(tmp_path: Path) -> None:
    result = read(tmp_path / "nope")
    assert result.pods == () and result.errors == () and result.source == "file"


def test_empty_dir_is_an_empty_set(tmp_path: Path) -> None:
    assert read(tmp_path).pods == ()


def test_reads_every_pod_in_file_name_order(tmp_path: Path) -> None:
    for name in ("b", "a", "c"):
        (tmp_path / f"{name}.yaml").write_text(pod_yaml(name))
    result = read(tmp_path)
    assert names(result) == [f"{n}-{NODE}" for n in ("a", "b", "c")]
    pod = result.pods[0]
    assert pod.origin is not None and pod.origin.location == str(tmp_path / "a.yaml")
    assert pod.metadata.annotations["kubernetes.io/config.source"] == "file"
    assert pod_from_dict(pod.to_dict()).pod == pod


def test_dotfiles_and_subdirs_are_ignored(tmp_path: Path) -> None:
    (tmp_path / ".hidden.yaml").write_text(pod_yaml("hidden"))
    (tmp_path / ".web.yaml.swp").write_text("garbage: [")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.yaml").write_text(pod_yaml("deep"))
    (tmp_path / "top.yaml").write_text(pod_yaml("top"))
    result = read(tmp_path)
    assert names(result) == [f"top-{NODE}"]
    assert result.errors == ()
    assert any("not recursing" in n for n in result.notes)


def test_bad_files_never_hide_good_ones(tmp_path: Path) -> None:
    (tmp_path / "a-good.yaml").write_text(pod_yaml("good"))
    (tmp_path / "b-invalid.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: [\n")
    (tmp_path / "c-deploy.yaml").write_text("apiVersion: apps/v1\nkind: Deployment\n")
    (tmp_path / "d-noimage.yaml").write_text(pod_yaml("noimage").replace("    image: host\n",
                                                                         ""))
    (tmp_path / "e-two.yaml").write_text(pod_yaml("x") + "---\n" + pod_yaml("y"))
    (tmp_path / "f-also-good.json").write_text(
        '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},'
        '"spec":{"containers":[{"name":"c","image":"host"}]}}')
    result = read(tmp_path)
    assert names(result) == [f"good-{NODE}", f"j-{NODE}"]
    by_file = {Path(e.location).name: e for e in result.errors}
    assert set(by_file) == {"b-invalid.yaml", "c-deploy.yaml", "d-noimage.yaml", "e-two.yaml"}
    assert "invalid YAML" in by_file["b-invalid.yaml"].reason
    assert by_file["c-deploy.yaml"].field == "kind"
    assert (by_file["d-noimage.yaml"].field, by_file["d-noimage.yaml"].reason) == (
        "spec.containers[0].image", "required")
    assert "2 YAML documents" in by_file["e-two.yaml"].reason
    message = result.to_value(1.0)
    assert {"file": str(tmp_path / "d-noimage.yaml"), "field": "spec.containers[0].image",
            "reason": "required"} in message.errors
    assert len(message.pods) == 2


def test_oversized_file_is_rejected_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(20 * 1024 * 1024)  # sparse: 20 MiB of size, nothing to read
    (tmp_path / "ok.yaml").write_text(pod_yaml("ok"))
    result = read(tmp_path)
    assert names(result) == [f"ok-{NODE}"]
    (error,) = result.errors
    assert error.location == str(big) and "larger than 10 MiB" in error.reason


def test_read_capped_reads_at_most_cap_plus_one(tmp_path: Path) -> None:
    small = tmp_path / "f"
    small.write_bytes(b"x" * 10)
    assert read_capped(small, 10) == b"x" * 10
    with pytest.raises(PodValidationError, match="larger than"):
        read_capped(small, 9)


def test_special_files_do_not_block(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.yaml")
    (tmp_path / "ok.yaml").write_text(pod_yaml("ok"))
    result = read(tmp_path)
    assert names(result) == [f"ok-{NODE}"]
    assert any("not a regular file" in n for n in result.notes)


def test_single_file_path(tmp_path: Path) -> None:
    file = tmp_path / "one.yaml"
    file.write_text(pod_yaml("one"))
    assert names(read(file)) == [f"one-{NODE}"]


def test_duplicate_pod_names_are_both_read(tmp_path: Path) -> None:
    """Duplicates are the merge's to judge (first by file name wins); the source reports all."""
    (tmp_path / "1.yaml").write_text(pod_yaml("same"))
    (tmp_path / "2.yaml").write_text(pod_yaml("same", cmd="other"))
    result = read(tmp_path)
    assert names(result) == [f"same-{NODE}"] * 2
    assert result.pods[0].uid != result.pods[1].uid


def test_uid_is_stable_between_reads(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(pod_yaml("a"))
    assert read(tmp_path).pods[0].uid == read(tmp_path).pods[0].uid


# --- the watcher -------------------------------------------------------------------------------


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[Callable[[Path], DirWatcher]]:
    made: list[DirWatcher] = []

    def make(path: Path) -> DirWatcher:
        made.append(new_inotify_watcher(path))
        made[-1].wait(0)  # establish the watch
        return made[-1]

    yield make
    for w in made:
        w.close()


def drained(w: DirWatcher) -> bool:
    """True once nothing more is pending."""
    return not w.wait(0)


@pytest.mark.parametrize("action", ["create", "modify", "delete", "rename_in", "rename_out"])
def test_watcher_sees_changes(tmp_path: Path, watch: Callable[[Path], DirWatcher],
                              action: str) -> None:
    existing = tmp_path / "a.yaml"
    existing.write_text(pod_yaml("a"))
    outside = tmp_path.parent / f"{tmp_path.name}-outside.yaml"
    outside.write_text(pod_yaml("o"))
    w = watch(tmp_path)
    eventually(lambda: drained(w))
    if action == "create":
        (tmp_path / "b.yaml").write_text(pod_yaml("b"))
    elif action == "modify":
        with existing.open("a") as f:
            f.write("# edited\n")
    elif action == "delete":
        existing.unlink()
    elif action == "rename_in":
        outside.rename(tmp_path / "moved.yaml")
    else:
        existing.rename(outside.with_name(outside.name + "2"))
    eventually(lambda: w.wait(0.2))
    outside.unlink(missing_ok=True)
    outside.with_name(outside.name + "2").unlink(missing_ok=True)


def test_watcher_ignores_dotfiles(tmp_path: Path, watch: Callable[[Path], DirWatcher]) -> None:
    w = watch(tmp_path)
    (tmp_path / ".swap").write_text("x")
    (tmp_path / ".swap").unlink()
    assert not w.wait(0.2)
    (tmp_path / "real.yaml").write_text("x")  # a real change after is still seen
    eventually(lambda: w.wait(0.2))


def test_watcher_ignores_subdirectory_contents(tmp_path: Path,
                                               watch: Callable[[Path], DirWatcher]) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    w = watch(tmp_path)
    (sub / "deep.yaml").write_text("x")
    assert not w.wait(0.2)


def test_watcher_coalesces_a_burst(tmp_path: Path, watch: Callable[[Path], DirWatcher]) -> None:
    w = watch(tmp_path)
    for i in range(50):
        (tmp_path / f"p{i}.yaml").write_text(pod_yaml(f"p{i}"))
    eventually(lambda: w.wait(0.2))
    # At most a straggler or two after one coalesced wake-up, then quiet.
    eventually(lambda: drained(w))


def test_watcher_follows_a_directory_created_later(tmp_path: Path,
                                                   watch: Callable[[Path], DirWatcher]) -> None:
    target = tmp_path / "manifests"
    w = watch(target)
    target.mkdir()
    eventually(lambda: w.wait(0.2))
    eventually(lambda: drained(w))
    (target / "a.yaml").write_text(pod_yaml("a"))
    eventually(lambda: w.wait(0.2))


def test_watcher_survives_directory_removal_and_recreation(
        tmp_path: Path, watch: Callable[[Path], DirWatcher]) -> None:
    target = tmp_path / "manifests"
    target.mkdir()
    w = watch(target)
    target.rmdir()
    eventually(lambda: w.wait(0.2))
    target.mkdir()
    eventually(lambda: w.wait(0.2))
    eventually(lambda: drained(w))
    (target / "a.yaml").write_text(pod_yaml("a"))
    eventually(lambda: w.wait(0.2))


# --- the poll loop -----------------------------------------------------------------------------


def poll_until(source: FileSource, match: Callable[[SourceSet], bool],
               timeout: float = 10.0) -> SourceSet:
    """Poll the source (each poll waits on inotify) until it returns a matching set."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = source.poll(0.2)
        if result is not None and match(result):
            return result
    raise AssertionError("no matching set in time")


def test_file_source_reads_at_once_on_change_and_on_relist(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    (tmp_path / "a.yaml").write_text(pod_yaml("a"))
    source = FileSource(tmp_path, NODE, period=20.0, watcher=new_inotify_watcher(tmp_path),
                        clock=clock, wall=lambda: 1_700_000_000.0)
    try:
        first = source.poll(0.0)
        assert first is not None and names(first) == [f"a-{NODE}"]
        assert source.poll(0.05) is None  # nothing changed, nothing due
        clock.now += 1.0  # the early re-publish after the first read
        again = source.poll(0.0)
        assert again is not None and again.pods == first.pods
        seen_at = first.pods[0].metadata.annotations[CONFIG_SEEN_ANNOTATION]

        (tmp_path / "b.yaml").write_text(pod_yaml("b"))
        latest = poll_until(source, lambda r: names(r) == [f"a-{NODE}", f"b-{NODE}"])
        assert latest.pods[0].metadata.annotations[CONFIG_SEEN_ANNOTATION] == seen_at

        eventually(lambda: source.poll(0.05) is None)
        clock.now += 20.0  # the relist period
        relisted = source.poll(0.0)
        assert relisted is not None and len(relisted.pods) == 2
    finally:
        source.close()


def test_file_source_missing_dir_then_created(tmp_path: Path) -> None:
    target = tmp_path / "later"
    source = FileSource(target, NODE, period=20.0, watcher=new_inotify_watcher(target),
                        clock=FakeClock(1000.0))
    try:
        first = source.poll(0.0)
        assert first is not None and first.pods == ()
        target.mkdir()
        (target / "a.yaml").write_text(pod_yaml("a"))
        poll_until(source, lambda r: names(r) == [f"a-{NODE}"])
    finally:
        source.close()
