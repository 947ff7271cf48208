"""The embedded runtime's store (services/runtime/store.py): the journal of sandboxes and
containers, the monitors' flat state files, compaction, a torn tail, and the import of the
previous layout (one directory per object)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.services.runtime import store as store_mod
from podvisor.services.runtime.model import Container, ExitInfo, Sandbox, SandboxState
from podvisor.services.runtime.store import JOURNAL, Store, StoreError

SPEC = b'{"argv": ["sleep", "1"], "env": [], "cwd": "/", "log_path": ""}'


def sandbox(n: int, state: SandboxState = SandboxState.READY) -> Sandbox:
    config = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(
        name=f"p{n}", namespace="ns", uid=f"u{n}"), labels={"n": str(n)})
    return Sandbox(f"s{n:063d}", config, 1000 + n, state, "")


def container(n: int, sb: Sandbox) -> Container:
    config = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=f"c{n}"),
                                image=pb.ImageSpec(image="host"), command=["sleep", "1"])
    return Container(f"c{n:063d}", sb.id, config, 2000 + n, f"/logs/{n}.log", "sha256:host")


def loaded(root: Path) -> tuple[dict[str, Sandbox], dict[str, Container], Any]:
    out = Store(root).load()
    return ({s.id: s for s in out.sandboxes}, {c.id: c for c in out.containers}, out)


def test_changes_survive_a_new_store(tmp_path: Path) -> None:
    st = Store(tmp_path)
    st.load()
    a, b = sandbox(1), sandbox(2)
    st.save_sandbox(a)
    st.save_sandbox(b)
    ca, cb = container(1, a), container(2, b)
    st.save_container(ca, SPEC)
    st.save_container(cb, SPEC)
    st.save_sandbox(Sandbox(a.id, a.config, a.created_at, SandboxState.NOTREADY, ""))
    st.delete_container(cb.id)
    st.delete_sandbox(b.id)
    st.close()

    sandboxes, containers, out = loaded(tmp_path)
    assert list(sandboxes) == [a.id] and sandboxes[a.id].state is SandboxState.NOTREADY
    assert sandboxes[a.id].config == a.config and sandboxes[a.id].created_at == a.created_at
    assert list(containers) == [ca.id]
    got = containers[ca.id]
    assert (got.sandbox_id, got.config, got.created_at, got.log_path, got.image_ref) == \
        (a.id, ca.config, ca.created_at, ca.log_path, ca.image_ref)
    assert got.started is None and got.exited is None
    assert out.specs == {ca.id: SPEC} and out.problems == []


def test_a_change_is_one_appended_line_and_no_new_file(tmp_path: Path) -> None:
    st = Store(tmp_path)
    st.load()
    before = sorted(os.listdir(tmp_path)), os.listdir(tmp_path / "containers")
    size = (tmp_path / JOURNAL).stat().st_size
    sb = sandbox(1)
    st.save_sandbox(sb)
    st.save_container(container(1, sb), SPEC)
    lines = (tmp_path / JOURNAL).read_bytes()[size:].splitlines()
    assert [json.loads(line)["op"] for line in lines] == ["sandbox", "container"]
    assert (sorted(os.listdir(tmp_path)), os.listdir(tmp_path / "containers")) == before


def one_container(root: Path) -> tuple[Store, Container]:
    """A loaded store holding one sandbox and one container."""
    st = Store(root)
    st.load()
    sb = sandbox(1)
    st.save_sandbox(sb)
    c = container(1, sb)
    st.save_container(c, SPEC)
    return st, c


def test_monitor_files_are_read_at_load_and_removed_with_the_container(tmp_path: Path) -> None:
    st, c = one_container(tmp_path)
    prefix = st.state_prefix(c.id)
    Path(f"{prefix}.started.json").write_text(json.dumps(
        {"monitor_pid": 10, "monitor_ticks": 11, "pid": 12, "pid_ticks": 13, "started_at": 14}))
    st.save_exit(c.id, ExitInfo(3, 15, "Error", "m"))
    _, containers, _ = loaded(tmp_path)
    got = containers[c.id]
    assert got.started is not None and (got.started.pid, got.started.monitor_pid) == (12, 10)
    assert got.exited == ExitInfo(3, 15, "Error", "m")
    st.delete_container(c.id)
    assert os.listdir(tmp_path / "containers") == []


def test_orphan_monitor_files_are_removed_at_load(tmp_path: Path) -> None:
    """A runtime killed between a removal's journal line and the unlinks."""
    st, keep = one_container(tmp_path)
    Path(f"{st.state_prefix(keep.id)}.started.json").write_text("{}")  # unreadable: not started
    Path(f"{st.state_prefix('gone')}.exit.json").write_text("{}")
    Path(f"{st.state_prefix('gone')}.exit.json.tmp.77").write_text("{")
    loaded(tmp_path)
    assert os.listdir(tmp_path / "containers") == [f"{keep.id}.started.json"]


def test_a_torn_tail_ends_the_replay_and_the_load_rewrites_the_journal(tmp_path: Path) -> None:
    st = Store(tmp_path)
    st.load()
    a = sandbox(1)
    st.save_sandbox(a)
    st.close()
    with open(tmp_path / JOURNAL, "ab") as f:
        f.write(b'{"op":"sandbox","id":"s2","con')  # a power loss mid-write
    sandboxes, _, out = loaded(tmp_path)
    assert list(sandboxes) == [a.id]
    assert len(out.problems) == 1 and "line 2" in out.problems[0]
    text = (tmp_path / JOURNAL).read_text()
    assert text.endswith("\n") and text.count("\n") == 1  # rewritten without the torn line
    assert list(loaded(tmp_path)[0]) == [a.id]


def test_compaction_bounds_the_journal(tmp_path: Path) -> None:
    st = Store(tmp_path, compact_slack=4096)
    st.load()
    keep = sandbox(0)
    st.save_sandbox(keep)
    for n in range(1, 200):
        sb = sandbox(n)
        st.save_sandbox(sb)
        c = container(n, sb)
        st.save_container(c, SPEC)
        st.delete_container(c.id)
        st.delete_sandbox(sb.id)
    assert st.compactions > 1
    assert (tmp_path / JOURNAL).stat().st_size < 3 * 4096
    assert not list(tmp_path.glob("*.tmp"))
    sandboxes, containers, _ = loaded(tmp_path)
    assert list(sandboxes) == [keep.id] and containers == {}


def test_a_failed_write_is_an_error_and_changes_nothing(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    st = Store(tmp_path)
    st.load()
    a = sandbox(1)
    st.save_sandbox(a)

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(store_mod.os, "write", full)
    with pytest.raises(StoreError, match="No space left"):
        st.save_sandbox(sandbox(2))
    with pytest.raises(StoreError):  # the retry compacts: it fails too
        st.save_sandbox(sandbox(4))
    monkeypatch.undo()
    st.save_sandbox(sandbox(3))  # compacts first: the journal holds exactly what is live
    assert sorted(loaded(tmp_path)[0]) == [a.id, sandbox(3).id]


def _legacy_layout(root: Path) -> tuple[Sandbox, Container]:
    """What the previous store wrote: a directory per sandbox and per container."""
    sb, c = sandbox(1), container(1, sandbox(1))
    d = root / "sandboxes" / sb.id
    d.mkdir(parents=True)
    (d / "config.pb").write_bytes(sb.config.SerializeToString())
    (d / "meta.json").write_text(json.dumps(
        {"created_at": sb.created_at, "state": "ready", "runtime_handler": ""}))
    d = root / "containers" / c.id
    d.mkdir(parents=True)
    (d / "config.pb").write_bytes(c.config.SerializeToString())
    (d / "spec.json").write_bytes(SPEC)
    (d / "meta.json").write_text(json.dumps({
        "sandbox_id": sb.id, "created_at": c.created_at, "log_path": c.log_path,
        "image_ref": c.image_ref}))
    (d / "started.json").write_text(json.dumps(
        {"monitor_pid": 20, "monitor_ticks": 21, "pid": 22, "pid_ticks": 23, "started_at": 24}))
    half = root / "containers" / ("x" * 64)  # a create that never finished: no meta.json
    half.mkdir()
    (half / "config.pb").write_bytes(b"")
    return sb, c


def test_the_previous_layout_is_imported(tmp_path: Path) -> None:
    """An agent upgraded while pods run: their records move into the journal; the running
    containers' (older) monitors still write into the old directory, which is read and kept
    until the container is removed."""
    sb, c = _legacy_layout(tmp_path)
    sandboxes, containers, out = loaded(tmp_path)
    assert list(sandboxes) == [sb.id] and sandboxes[sb.id].config == sb.config
    assert list(containers) == [c.id] and out.specs == {c.id: SPEC}
    got = containers[c.id]
    assert got.started is not None and got.started.pid == 22
    assert out.notes and not (tmp_path / "sandboxes").exists()
    assert sorted(os.listdir(tmp_path / "containers")) == [c.id]
    assert os.listdir(tmp_path / "containers" / c.id) == ["started.json"]

    st = Store(tmp_path)  # a second start: the journal has it, the old directory stays read
    again = {x.id: x for x in st.load().containers}
    assert again[c.id].started == got.started
    (tmp_path / "containers" / c.id / "exit.json").write_text(json.dumps(
        {"exit_code": 0, "finished_at": 30, "reason": "Completed", "message": ""}))
    assert st.read_exit(c.id) == ExitInfo(0, 30, "Completed", "")
    st.delete_container(c.id)
    assert os.listdir(tmp_path / "containers") == []


def test_a_change_before_load_is_refused(tmp_path: Path) -> None:
    """Appending before the replay would let a compaction replace the journal."""
    st = Store(tmp_path)
    st.load()
    st.save_sandbox(sandbox(1))
    st.close()
    again = Store(tmp_path)
    with pytest.raises(RuntimeError, match="load"):
        again.save_sandbox(sandbox(2))
    assert list(loaded(tmp_path)[0]) == [sandbox(1).id]
