"""StatusEngine and StatusStore: restart persistence (a new engine loaded from the store keeps
lastTransitionTime and the version), PLEG cache freshness, retirement, corrupt files, and the
upgrade from the format the agent before wrote."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from podvisor.common.logs import MemoryLogger
from podvisor.common.timefmt import rfc3339
from podvisor.ipc.maps import DesiredPod, PlegValue, PodRef, PodStatusValue
from podvisor.ipc.podstatus import PodStatus
from podvisor.services.pod import pod_from_dict
from podvisor.services.status.engine import StatusEngine
from podvisor.services.status.store import Retired, Saved, StatusStore
from tests.support import plegs

T0 = 1_700_000_000.0
NS = 1_000_000_000
MONO = 5_000.0  # CLOCK_MONOTONIC "now" of the tests


def desired_entry(uid: str) -> DesiredPod:
    pod = pod_from_dict({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": f"web-{uid}", "namespace": "default", "uid": uid},
                         "spec": {"containers": [{"name": "app", "image": "host"}],
                                  "restartPolicy": "Always"}}).pod
    return DesiredPod(pod=pod.to_dict(), source="file", worker="syncing")


def value(phase: str, version: int = 1, uid: str = "") -> PodStatusValue:
    return PodStatusValue(PodStatus(phase=phase), version, PodRef(uid=uid))


def record(running: bool = True, ts: float = 10.0) -> dict[str, Any]:
    containers = [{"id": "c1", "name": "app", "sandbox_id": "sb1", "attempt": 0,
                   "state": "CONTAINER_RUNNING", "created_at": NS, "started_at": 2 * NS,
                   "finished_at": 0, "exit_code": 0, "reason": "", "message": "",
                   "image": "host", "image_ref": "sha256:x", "hash": "h", "restart_count": 0,
                   "log_path": ""}] if running else []
    return {"ts": ts, "sandboxes": [{"id": "sb1", "state": "SANDBOX_READY", "created_at": NS,
                                     "attempt": 0, "ip": "10.0.0.5"}],
            "containers": containers}


def pleg_map(ts: float, **pods: dict[str, Any]) -> dict[str, PlegValue]:
    return plegs.pleg_map({"_health": {"ts": ts, "last_relist_ok": T0}, **pods})


def conds(value: PodStatusValue) -> dict[str, tuple[str, str | None]]:
    return {c.type: (c.status, c.last_transition_time) for c in value.status.conditions}


def store(tmp_path: Path, journal_max: int = 0) -> StatusStore:
    """Without a journal by default: every save writes the files (the compaction path)."""
    return StatusStore(tmp_path / "state" / "statuses", MemoryLogger(), journal_max)


def started_engine() -> StatusEngine:
    """u1 created at T0 (not running yet), running (Ready) at T0+5."""
    engine = StatusEngine(Saved())
    assert engine.reconcile({"u1": desired_entry("u1")}, pleg_map(10.0, u1=record(False)), T0,
                            MONO)
    changes = engine.reconcile({"u1": desired_entry("u1")}, pleg_map(11.0, u1=record()), T0 + 5,
                               MONO)
    assert changes and conds(changes.set["u1"])["Ready"] == ("True", rfc3339(T0 + 5))
    return engine


def test_store_round_trip(tmp_path: Path) -> None:
    saved = Saved({"u1": value("Running", 3, "u1"), "odd/uid": value("Pending", 0)},
                  {"u2": Retired(value("Failed"), T0 + 0.5)}, 42.5)
    store(tmp_path).save(saved)
    assert store(tmp_path).load() == saved


def test_store_writes_only_what_changed(tmp_path: Path) -> None:
    st = store(tmp_path)
    a, b = value("Running"), value("Pending")
    st.save(Saved({"u1": a, "u2": b}, {}, 1.0))
    assert st.files == 3  # meta + 2 pods
    b2 = value("Running", 2)
    st.save(Saved({"u1": a, "u2": b2}, {}, 1.0))
    assert st.files == 4
    st.save(Saved({"u1": a}, {}, 2.0))  # u2 gone: its file removed; meta rewritten
    assert st.files == 5
    assert store(tmp_path).load() == Saved({"u1": a}, {}, 2.0)
    assert sorted(p.name for p in st.path.iterdir()) == ["meta.json", "pod-u1.json"]


def test_journal_saves_append_one_line_and_load_replays_them(tmp_path: Path) -> None:
    st = store(tmp_path, journal_max=1 << 20)
    a, b = value("Running"), value("Pending")
    st.save(Saved({"u1": a, "u2": b}, {}, 1.0))
    b2 = value("Running", 2)
    st.save(Saved({"u1": a, "u2": b2}, {}, 1.5))
    st.save(Saved({"u1": a}, {"u2": Retired(b2, T0)}, 2.0))
    st.save(Saved({"u1": a}, {}, 2.0))  # u2 expired
    st.save(Saved({"u1": a}, {}, 2.0))  # nothing changed: nothing written
    assert st.appends == 4 and st.files == 0 and st.writes == 4
    assert sorted(p.name for p in st.path.iterdir()) == ["journal.jsonl"]
    lines = (st.path / "journal.jsonl").read_text().splitlines()
    assert json.loads(lines[1]) == {"pleg_ts": 1.5, "records": {"u2": {"value": b2.to_wire()}},
                                    "del": []}
    assert json.loads(lines[2])["records"] == {"u2": {"value": b2.to_wire(), "retiredAt": T0}}
    assert store(tmp_path).load() == Saved({"u1": a}, {}, 2.0)
    st.close()


def test_journal_is_compacted_into_the_files_when_full(tmp_path: Path) -> None:
    st = store(tmp_path, journal_max=1000)
    statuses = {f"u{i}": value("Pending") for i in range(3)}
    st.save(Saved(dict(statuses), {}, 1.0))  # fits
    assert st.files == 0
    for version in range(2, 6):
        statuses["u0"] = value("Running", version)
        st.save(Saved(dict(statuses), {}, float(version)))
    assert st.files > 0  # compacted at least once: meta + the pods the files lacked
    assert (st.path / "journal.jsonl").stat().st_size <= 1000
    assert store(tmp_path).load() == Saved(statuses, {}, 5.0)
    assert store(tmp_path, journal_max=0).load() == Saved(statuses, {}, 5.0)
    st.close()


def test_a_torn_journal_line_ends_the_replay_and_the_next_save_compacts(
        tmp_path: Path) -> None:
    st = store(tmp_path, journal_max=1 << 20)
    a = value("Running")
    st.save(Saved({"u1": a}, {}, 1.0))
    st.close()
    with (st.path / "journal.jsonl").open("ab") as journal:  # a power loss mid-write
        journal.write(b'{"pleg_ts":2.0,"records":{"u1":{"val')
    log = MemoryLogger()
    again = StatusStore(st.path, log)
    saved = again.load()
    assert saved == Saved({"u1": a}, {}, 1.0)
    assert log.named("status.store_unreadable")
    a2 = value("Running", 2)
    again.save(Saved({"u1": a2}, {}, 2.0))  # compacts: nothing appended after the torn line
    assert again.appends == 0 and (st.path / "journal.jsonl").stat().st_size == 0
    assert store(tmp_path).load() == Saved({"u1": a2}, {}, 2.0)
    again.save(Saved({"u1": a}, {}, 3.0))  # journaled again from then on
    assert again.appends == 1
    assert store(tmp_path).load() == Saved({"u1": a}, {}, 3.0)
    again.close()


def test_missing_store_is_empty(tmp_path: Path) -> None:
    assert store(tmp_path).load() == Saved()


def test_corrupt_pod_file_is_set_aside(tmp_path: Path) -> None:
    st = store(tmp_path)
    st.save(Saved({"u1": value("Running"), "u2": value("Running")}, {}, 3.0))
    (st.path / "pod-u2.json").write_text("{not json", encoding="utf-8")
    assert store(tmp_path).load() == Saved({"u1": value("Running")}, {}, 3.0)
    assert not (st.path / "pod-u2.json").exists()
    assert (st.path / "pod-u2.json.corrupt").read_text(encoding="utf-8") == "{not json"


def test_wrong_meta_version_keeps_statuses_drops_pleg_ts(tmp_path: Path) -> None:
    st = store(tmp_path)
    st.save(Saved({"u1": value("Running")}, {}, 3.0))
    (st.path / "meta.json").write_text(json.dumps({"version": 99, "pleg_ts": 3.0}))
    assert store(tmp_path).load() == Saved({"u1": value("Running")}, {}, 0.0)
    assert (st.path / "meta.json.corrupt").exists()


def test_legacy_single_file_is_read_then_replaced(tmp_path: Path) -> None:
    st = store(tmp_path)
    st.legacy.parent.mkdir(parents=True)
    st.legacy.write_text(json.dumps({"version": 1, "statuses": {"a": 1, "b": {"phase": "x"}},
                                     "retired": [], "pleg_ts": "soon"}), encoding="utf-8")
    saved = st.load()
    assert saved == Saved({"b": value("x", 0)}, {}, 0.0)
    st.save(saved)
    assert not st.legacy.exists()
    assert store(tmp_path).load() == saved


def test_corrupt_legacy_file_is_set_aside(tmp_path: Path) -> None:
    st = store(tmp_path)
    st.legacy.parent.mkdir(parents=True)
    st.legacy.write_text("{not json", encoding="utf-8")
    assert st.load() == Saved()
    assert st.legacy.with_name("statuses.json.corrupt").read_text(encoding="utf-8") == "{not json"


def test_restart_from_store_keeps_transition_times_and_versions(tmp_path: Path) -> None:
    first = started_engine()
    before = first.statuses["u1"]
    store(tmp_path).save(first.saved())

    again = StatusEngine(store(tmp_path).load())
    assert again.statuses["u1"] == before
    # Recomputed much later from the same runtime state (a newer relist): nothing changes.
    changes = again.reconcile({"u1": desired_entry("u1")}, pleg_map(90.0, u1=record(ts=11.0)),
                              T0 + 3600, MONO)
    assert changes is not None and not changes
    assert again.statuses["u1"] == before
    assert conds(again.statuses["u1"])["Ready"] == ("True", rfc3339(T0 + 5))
    assert again.statuses["u1"].version == before.version


def test_restart_then_a_real_change_bumps_the_persisted_version(tmp_path: Path) -> None:
    first = started_engine()
    version = first.statuses["u1"].version
    store(tmp_path).save(first.saved())
    again = StatusEngine(store(tmp_path).load())
    changes = again.reconcile({"u1": desired_entry("u1")}, pleg_map(90.0, u1=record(False)),
                              T0 + 60, MONO)
    assert changes and changes.set["u1"].version == version + 1
    assert conds(changes.set["u1"])["Ready"] == ("False", rfc3339(T0 + 60))
    assert [(t.type, t.old, t.new) for t in changes.transitions] == [
        ("ContainersReady", "True", "False"), ("Ready", "True", "False")]


def test_no_compute_before_pleg_relisted() -> None:
    engine = StatusEngine(Saved())
    assert engine.reconcile({"u1": desired_entry("u1")}, {}, T0, MONO) is None
    assert engine.statuses == {}


def test_no_compute_from_a_cache_older_than_the_persisted_statuses(tmp_path: Path) -> None:
    first = started_engine()
    assert first.pleg_ts == 11.0
    store(tmp_path).save(first.saved())
    again = StatusEngine(store(tmp_path).load())
    stale = pleg_map(10.5, u1=record(False))  # a view of the runtime older than the statuses
    assert again.reconcile({"u1": desired_entry("u1")}, stale, T0 + 60, MONO) is None
    assert conds(again.statuses["u1"])["Ready"][0] == "True"
    assert again.reconcile({"u1": desired_entry("u1")}, pleg_map(11.0, u1=record()), T0 + 60,
                           MONO) is not None


def test_persisted_cache_time_from_before_a_reboot_is_dropped() -> None:
    engine = StatusEngine(Saved(pleg_ts=MONO + 1000))  # monotonic clock restarted since
    changes = engine.reconcile({"u1": desired_entry("u1")}, pleg_map(3.0, u1=record()), T0, MONO)
    assert changes and engine.pleg_ts == 3.0


def test_retired_pod_resumes_after_reload(tmp_path: Path) -> None:
    first = started_engine()
    before = first.statuses["u1"]
    changes = first.reconcile({}, pleg_map(12.0, u1=record()), T0 + 10, MONO)
    assert changes and changes.deleted == ["u1"] and "u1" not in first.statuses
    store(tmp_path).save(first.saved())
    again = StatusEngine(store(tmp_path).load())
    changes = again.reconcile({"u1": desired_entry("u1")}, pleg_map(13.0, u1=record()), T0 + 20,
                              MONO)
    assert changes and changes.set["u1"] == before  # same times, same version
    assert not changes.transitions


def test_retired_statuses_expire() -> None:
    engine = started_engine()
    assert engine.reconcile({}, pleg_map(12.0), T0 + 10, MONO)
    assert "u1" in engine.retired
    assert engine.reconcile({}, pleg_map(13.0), T0 + 10 + 601, MONO) is not None
    assert engine.retired == {}


def test_only_the_named_pods_are_recomputed() -> None:
    engine = StatusEngine(Saved())
    desired = {"u1": desired_entry("u1"), "u2": desired_entry("u2")}
    assert engine.reconcile(desired, pleg_map(10.0, u1=record(False), u2=record(False)), T0,
                            MONO)
    both_running = pleg_map(11.0, u1=record(), u2=record())
    changes = engine.reconcile(desired, both_running, T0 + 5, MONO, only={"u2", "gone"})
    assert changes and set(changes.set) == {"u2"}
    assert engine.statuses["u1"].status.phase == "Pending"
    full = engine.reconcile(desired, both_running, T0 + 6, MONO)  # the sweep catches u1
    assert full and set(full.set) == {"u1"} and engine.statuses["u1"].status.phase == "Running"
    left = engine.reconcile({"u2": desired["u2"]}, both_running, T0 + 7, MONO, only=set())
    assert left and left.deleted == ["u1"]  # retirement does not depend on ``only``


def test_the_directory_is_made_once_and_again_after_a_failed_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = store(tmp_path, journal_max=0)  # every save writes files
    a = value("Running")
    st.save(Saved({"u1": a}, {}, 1.0))
    made: list[Path] = []
    real = Path.mkdir
    monkeypatch.setattr(Path, "mkdir",
                        lambda self, *args, **kw: made.append(self) or real(self, *args, **kw))
    st.save(Saved({"u1": value("Running", 2)}, {}, 2.0))
    assert made == []  # not a syscall per save
    shutil.rmtree(st.path)  # vanished under us: that save fails, the next one recovers
    with pytest.raises(OSError):
        st.save(Saved({"u1": value("Running", 3)}, {}, 3.0))
    st.save(Saved({"u1": value("Running", 3)}, {}, 3.0))
    assert made == [st.path]
    assert store(tmp_path).load() == Saved({"u1": value("Running", 3)}, {}, 3.0)
    st.close()


def _v2(value: PodStatusValue, retired_at: float | None = None) -> dict[str, Any]:
    """A status as the agent before wrote it (format 2): the API's PodStatus with the internal
    keys ``_pod``, ``_version`` (and ``_retiredAt``) inside."""
    ref = value.pod
    out = {**value.status.to_dict(), "_pod": {"name": ref.name, "namespace": ref.namespace,
                                               "uid": ref.uid}, "_version": value.version}
    if retired_at is not None:
        out["_retiredAt"] = rfc3339(retired_at)
    return out


def _write_v2(directory: Path, pleg_ts: float, files: dict[str, dict[str, Any]],
              journal: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "meta.json").write_text(json.dumps({"version": 2, "pleg_ts": pleg_ts}))
    for uid, status in files.items():
        (directory / f"pod-{uid}.json").write_text(json.dumps({"uid": uid, "status": status}))
    (directory / "journal.jsonl").write_text("".join(json.dumps(j) + "\n" for j in journal))


def test_an_upgraded_agent_loads_the_statuses_its_predecessor_wrote(tmp_path: Path) -> None:
    """Format 2 (the internal keys inside each PodStatus dict) is read once: the statuses, their
    versions and transition times and the retired ones come back typed, an engine goes on
    from them without a change, and the first save rewrites everything in format 3."""
    engine = StatusEngine(Saved())
    desired = {u: desired_entry(u) for u in ("u1", "u2", "u3")}
    assert engine.reconcile(desired, pleg_map(10.0, u1=record(), u2=record(), u3=record(False)),
                            T0, MONO)
    assert engine.reconcile({"u1": desired["u1"], "u3": desired["u3"]},
                            pleg_map(11.0, u1=record(), u3=record(False)), T0 + 5, MONO)
    u1, u3, u2 = engine.statuses["u1"], engine.statuses["u3"], engine.retired["u2"].value
    path = tmp_path / "state" / "statuses"
    _write_v2(path, 11.0, {"u1": _v2(u1), "u2": _v2(u2, retired_at=T0 + 5)},
              [{"pleg_ts": 11.0, "set": {"u3": _v2(u3)}, "del": []}])

    st = store(tmp_path, journal_max=1 << 20)
    saved = st.load()
    assert saved == Saved({"u1": u1, "u3": u3}, {"u2": Retired(u2, T0 + 5)}, 11.0)
    assert st.upgraded == 3
    again = StatusEngine(saved)
    changes = again.reconcile({"u1": desired["u1"], "u3": desired["u3"]},
                              pleg_map(90.0, u1=record(ts=11.0), u3=record(False)), T0 + 60,
                              MONO)
    assert changes is not None and not changes  # same versions, same transition times
    assert again.statuses == {"u1": u1, "u3": u3}
    assert conds(again.statuses["u1"])["Ready"] == ("True", rfc3339(T0))

    st.save(again.saved())  # nothing changed, yet the old format is rewritten at once
    assert json.loads((path / "meta.json").read_text()) == {"version": 3, "pleg_ts": 11.0}
    files = {p.name: json.loads(p.read_text()) for p in path.glob("pod-*.json")}
    assert sorted(files) == ["pod-u1.json", "pod-u2.json", "pod-u3.json"]
    assert all(set(f) == {"uid", "record"} for f in files.values())
    assert (path / "journal.jsonl").stat().st_size == 0
    assert not any("_version" in json.dumps(f) for f in files.values())
    assert store(tmp_path).load() == saved
    st.close()

    # a compaction killed halfway through an upgrade: old and new files side by side
    (path / "pod-u1.json").write_text(json.dumps({"uid": "u1", "status": _v2(u1)}))
    with (path / "journal.jsonl").open("a") as journal:
        journal.write(json.dumps({"pleg_ts": 12.0, "set": {}, "del": ["u3"]}) + "\n")
    assert store(tmp_path).load() == Saved({"u1": u1}, {"u2": Retired(u2, T0 + 5)}, 12.0)
