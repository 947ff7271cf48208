"""Statuses on disk under ``<rootDir>/state/statuses/``, read back at start so a restarted status
process keeps versions and ``lastTransitionTime`` (readiness does not flip across a restart).

Layout (format 3): ``meta.json`` = ``{"version": 3, "pleg_ts": float}`` (the ``_health.ts`` of
the PLEG cache the newest statuses were computed from; CLOCK_MONOTONIC: a restarted status
process waits for a cache at least that new), ``pod-<uid>.json`` = ``{"uid": uid, "record":
record}`` per pod, and ``journal.jsonl``: one line per save since the files were last written,
``{"pleg_ts": float, "records": {uid: record}, "del": [uid]}``. A record is the typed value as
it goes on the bus, ``{"value": PodStatusValue.to_wire()}`` (its PodStatus, version and pod),
plus ``"retiredAt"`` (wall seconds) for a retired status, i.e. of a pod that recently left
``desired``. Load = the files, then the journal's lines in order.

A save appends one line holding what changed (the caller's status objects are compared by
identity: the engine replaces a status only when it changes) with ONE ``write`` (~50 us for a
few pods); creating and renaming a file per changed pod cost ~0.45 ms each on ext4, which made
file writes half of status' CPU while 200 pods started. When the journal would pass
``journal_max`` bytes, the save compacts instead: it writes the changed pods' files (each whole to
``.<name>.tmp`` and renamed over the old one; ``meta.json`` first, so a kill between them leaves
a ``pleg_ts`` at least as new as the statuses: the safe side), removes the files of pods gone,
then empties the journal (a kill before that replays lines the files already hold: same result).
``journal_max=0`` compacts at every save (no journal).

No fsync: the failure model is kill -9 of processes, and a completed ``write`` or rename survives
it (the page cache outlives the process). After a power loss the containers are gone too,
statuses are recomputed; a torn journal line ends the replay (logged) and the next save compacts
(so nothing is appended after it), and a torn file is set aside (below). A failed append also
makes the next save compact.

A corrupt file is logged, moved aside to ``<name>.corrupt`` and ignored: never fatal.

Upgrades: what the agent before wrote is read once and rewritten in format 3 by the first save
(a compaction). Format 2 (``meta.json`` version 2; ``{"uid", "status"}`` files and ``{"set"}``
journal lines holding the PodStatus dict with the internal keys ``_version``, ``_pod`` and
``_retiredAt`` inside) is told apart per file and per line, so a compaction killed halfway
through an upgrade loads as well; format 1 (the single file ``state/statuses.json``) is read when
the directory does not exist yet and removed after the first save.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podvisor.common.logs import EventLog
from podvisor.common.timefmt import parse_rfc3339
from podvisor.ipc.maps import MapValueError, PodRef, PodStatusValue
from podvisor.ipc.podstatus import PodStatus

FORMAT_VERSION = 3
READABLE_VERSIONS = (2, 3)  # meta.json versions whose pleg_ts means the same
LEGACY_VERSION = 1
META = "meta.json"
JOURNAL = "journal.jsonl"
JOURNAL_MAX = 4 * 1024 * 1024  # bytes of journal before a save compacts it into the files
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,150}")


@dataclass(frozen=True)
class Retired:
    """A status kept after its pod left ``desired`` (``at``: when, wall seconds), so a pod that
    comes back resumes its versions and transition times."""

    value: PodStatusValue
    at: float


Entry = PodStatusValue | Retired  # what the store keeps per pod UID


@dataclass
class Saved:
    statuses: dict[str, PodStatusValue] = field(default_factory=dict)
    retired: dict[str, Retired] = field(default_factory=dict)
    pleg_ts: float = 0.0

    def put(self, uid: str, entry: Entry) -> None:
        self.statuses.pop(uid, None)
        self.retired.pop(uid, None)
        if isinstance(entry, Retired):
            self.retired[uid] = entry
        else:
            self.statuses[uid] = entry


def record(entry: Entry) -> dict[str, Any]:
    """An entry's record on disk (format 3)."""
    if isinstance(entry, Retired):
        return {"value": entry.value.to_wire(), "retiredAt": entry.at}
    return {"value": entry.to_wire()}


def from_record(raw: Any) -> Entry:
    """A format 3 record back (``MapValueError`` if it is not one)."""
    if not isinstance(raw, Mapping):
        raise MapValueError("fields", "status record: not a map")
    value = PodStatusValue.from_wire(raw.get("value"))
    at = raw.get("retiredAt")
    if at is None:
        return value
    if isinstance(at, bool) or not isinstance(at, int | float):
        raise MapValueError("fields", "status record: retiredAt not a number")
    return Retired(value, float(at))


def from_v2(status: Any) -> Entry:
    """A format 2 (and 1) status: the PodStatus dict with ``_version``, ``_pod`` and
    ``_retiredAt`` (RFC 3339) inside (``MapValueError`` if it is not one)."""
    if not isinstance(status, Mapping):
        raise MapValueError("fields", "status: not a map")
    version, meta = status.get("_version", 0), status.get("_pod")
    if isinstance(version, bool) or not isinstance(version, int):
        raise MapValueError("fields", "status: _version not an int")
    ref = PodRef()
    if isinstance(meta, Mapping):
        ref = PodRef(str(meta.get("name", "")), str(meta.get("namespace", "")),
                     str(meta.get("uid", "")))
    value = PodStatusValue(
        PodStatus.from_dict({k: v for k, v in status.items() if not k.startswith("_")}),
        version, ref)
    if "_retiredAt" not in status:
        return value
    try:
        at = parse_rfc3339(str(status["_retiredAt"]))
    except ValueError:
        at = 0.0  # unreadable: expires at the next sweep, as before
    return Retired(value, at)


def pod_file(uid: str) -> str:
    """The file name for ``uid`` (hashed when the UID is not a plain file name)."""
    if _SAFE.fullmatch(uid):
        return f"pod-{uid}.json"
    return f"pod-x{hashlib.sha256(uid.encode()).hexdigest()[:40]}.json"


_STALE = object()  # an upgraded file: never ``is`` an entry, so the next compaction rewrites it


class StatusStore:
    def __init__(self, path: Path, log: EventLog, journal_max: int = JOURNAL_MAX) -> None:
        self.path = path  # the directory
        self.legacy = path.with_name(path.name + ".json")
        self.journal_max = journal_max
        self._log = log
        self._written: Mapping[str, Entry] = {}  # uid -> the entry last saved
        self._pleg_ts: float | None = None  # last saved
        self._in_files: dict[str, object] = {}  # uid -> the entry in its pod file
        self._file_ts: float | None = None  # in meta.json (None: rewrite it)
        self._fd: int | None = None  # the journal, O_APPEND
        self._journal_size = 0
        self._compact_next = False  # the journal may end in a torn line: never append to it
        self._legacy_pending = False
        self._dir_ok = False  # the directory exists (checked again after a failed save)
        self.writes = 0  # saves that wrote something
        self.files = 0  # files written
        self.appends = 0  # journal lines written
        self.upgraded = 0  # entries read in an older format (rewritten by the next save)
        self._upgrade_pending = False

    def load(self) -> Saved:
        self._written, self._pleg_ts, self._in_files, self._file_ts = {}, None, {}, None
        self.upgraded = 0
        if not self.path.is_dir():
            saved = self._load_legacy()
            self._legacy_pending = self.legacy.exists()
            self._upgrade_pending = False
            return saved
        saved = Saved(pleg_ts=self._load_meta())
        for entry in sorted(self.path.glob("pod-*.json")):
            item = self._read(entry)
            if item is None:
                continue
            uid = item.get("uid")
            try:
                if not isinstance(uid, str):
                    raise MapValueError("fields", "no uid")
                value, old = self._entry(item, "record", "status")
            except MapValueError as err:
                self._bad(entry, f"not a pod status file ({err})")
                continue
            saved.put(uid, value)
            self._in_files[uid] = _STALE if old else value
        self._replay(saved)
        self._written = {**saved.retired, **saved.statuses}
        self._pleg_ts = saved.pleg_ts
        self._upgrade_pending = self.upgraded > 0  # the next save rewrites it all in format 3
        return saved

    def _entry(self, item: Mapping[str, Any], new: str, old: str) -> tuple[Entry, bool]:
        """The entry of a file or journal item: format 3 under ``new``, else format 2 under
        ``old`` (then counted in ``upgraded``). Returns (entry, whether it was format 2)."""
        if new in item:
            return from_record(item[new]), False
        entry = from_v2(item.get(old))
        self.upgraded += 1
        return entry, True

    def _replay(self, saved: Saved) -> None:
        """Apply the journal's lines in order; a bad line (torn by a power loss) ends it."""
        path = self.path / JOURNAL
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        except OSError as err:
            self._log.error("status.store_unreadable", path=str(path), error=str(err))
            data = b""
            self._compact_next = True
        self._journal_size = len(data)
        if data and not data.endswith(b"\n"):
            self._compact_next = True
        for number, raw in enumerate(data.split(b"\n"), 1):
            if not raw:
                continue
            try:
                entry = json.loads(raw)
                ts, gone = entry["pleg_ts"], entry["del"]
                changed = entry["records"] if "records" in entry else entry["set"]
                if not (isinstance(ts, (int, float)) and isinstance(changed, dict)
                        and isinstance(gone, list)):
                    raise ValueError("bad format")
            except (ValueError, KeyError, TypeError) as err:
                self._log.error("status.store_unreadable", path=str(path),
                                error=f"line {number}: {err}; the lines after it are ignored")
                self._compact_next = True
                return
            for uid in gone:
                saved.statuses.pop(uid, None)
                saved.retired.pop(uid, None)
            current = "records" in entry  # else a format 2 line
            for uid, item in changed.items():
                try:
                    value = from_record(item) if current else from_v2(item)
                except MapValueError:
                    continue  # as before: an entry that is not a status is skipped
                saved.put(uid, value)
                self.upgraded += 0 if current else 1
            saved.pleg_ts = float(ts)

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            self._bad(path, str(err))
            return None
        return raw if isinstance(raw, dict) else {}

    def _load_meta(self) -> float:
        raw = self._read(self.path / META)
        if raw is None:
            return 0.0
        ts = raw.get("pleg_ts")
        if raw.get("version") not in READABLE_VERSIONS or not isinstance(ts, (int, float)):
            self._bad(self.path / META, "bad format")
            return 0.0
        if raw.get("version") == FORMAT_VERSION:
            self._file_ts = float(ts)
        return float(ts)

    def _bad(self, path: Path, error: str) -> None:
        self._log.error("status.store_unreadable", path=str(path), error=error)
        with contextlib.suppress(OSError):
            os.replace(path, path.with_name(path.name + ".corrupt"))

    def _load_legacy(self) -> Saved:
        """``state/statuses.json`` as written before per-pod files (format version 1)."""
        raw = self._read(self.legacy)
        if raw is None:
            return Saved()
        if raw.get("version") != LEGACY_VERSION:
            self._bad(self.legacy, "bad format")
            return Saved()
        statuses, retired, ts = raw.get("statuses"), raw.get("retired"), raw.get("pleg_ts")
        saved = Saved(pleg_ts=float(ts) if isinstance(ts, (int, float)) else 0.0)
        for part in (statuses, retired):
            for uid, status in (part.items() if isinstance(part, dict) else ()):
                with contextlib.suppress(MapValueError):
                    saved.put(uid, from_v2(status))
                    self.upgraded += 1
        return saved

    def _write(self, name: str, data: dict[str, Any]) -> None:
        tmp = self.path / f".{name}.tmp"
        body = json.dumps(data, separators=(",", ":")).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
        os.replace(tmp, self.path / name)
        self.files += 1

    def save(self, saved: Saved) -> None:
        """Persist what changed since the last save: one journal line, or a compaction into
        the files (see the module docstring). Raises OSError (the caller logs it and saves
        again later: what did not make it is still unsaved)."""
        if not self._dir_ok:  # once (a syscall per save was ~10 % of status' CPU in a burst)
            self.path.mkdir(parents=True, exist_ok=True)
            self._dir_ok = True
        current: dict[str, Entry] = {**saved.retired, **saved.statuses}
        changed = {uid: st for uid, st in current.items() if self._written.get(uid) is not st}
        gone = [uid for uid in self._written if uid not in current]
        rewrite = self._legacy_pending or self._upgrade_pending
        if not changed and not gone and saved.pleg_ts == self._pleg_ts and not rewrite:
            return
        line = None
        if self.journal_max > 0 and not self._compact_next and not rewrite:
            line = (json.dumps({"pleg_ts": saved.pleg_ts,
                                "records": {uid: record(e) for uid, e in changed.items()},
                                "del": gone}, separators=(",", ":")) + "\n").encode()
            if self._journal_size + len(line) > self.journal_max:
                line = None
        try:
            if line is None:
                self._compact(current, saved.pleg_ts)
            else:
                self._append(line)
        except OSError:
            self._dir_ok = False
            raise
        self._written, self._pleg_ts = current, saved.pleg_ts
        self._upgrade_pending = False
        if self._legacy_pending:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.legacy)
            self._legacy_pending = False
        self.writes += 1

    def _journal(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path / JOURNAL,
                               os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            self._journal_size = os.fstat(self._fd).st_size
        return self._fd

    def _append(self, line: bytes) -> None:
        try:
            fd = self._journal()
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            self._compact_next = True  # a part of the line may be in: never append after it
            raise
        self._journal_size += len(line)
        self.appends += 1

    def _compact(self, current: Mapping[str, Entry], pleg_ts: float) -> None:
        """Write what the files lack (meta first), remove the files of pods gone, then empty
        the journal."""
        if pleg_ts != self._file_ts:
            self._write(META, {"version": FORMAT_VERSION, "pleg_ts": pleg_ts})
            self._file_ts = pleg_ts
        for uid, entry in current.items():
            if self._in_files.get(uid) is not entry:
                self._write(pod_file(uid), {"uid": uid, "record": record(entry)})
                self._in_files[uid] = entry
        for uid in [u for u in self._in_files if u not in current]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path / pod_file(uid))
            del self._in_files[uid]
        if self._journal_size or self._compact_next:
            os.ftruncate(self._journal(), 0)
            self._journal_size = 0
        self._compact_next = False

    def reopen(self) -> None:
        """Close the journal (the next save opens it again, by its path) and make the next
        save a compaction: the rootDir under it changed (a disk fault began or ended)."""
        self.close()
        self._compact_next = True
        self._dir_ok = False

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
