"""The charts' store, rates and marks (pure parts, a fake clock, fake readers and CRI)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from podvisor.ipc.clock import FakeClock
from podvisor.ipc.control import ProcessRow, ProcessState
from podvisor.ipc.maps import PodRef, PodStatusValue
from podvisor.ipc.messages import ProcessStateChanged
from podvisor.ipc.podstatus import PodStatus
from podvisor.services.ops.pressure import NodeReadings, conditions
from podvisor.services.ops.sampler import Sampler
from podvisor.services.ops.usage import Mark, Sample, UsageStore, cpu_millis, sum_pods

OK = NodeReadings(8 << 30, 16 << 30, 50 << 30, 100 << 30, 900, 1000, 300, 4_000_000)


def test_cpu_millis() -> None:
    assert cpu_millis(None, (1.0, 5)) is None
    assert cpu_millis((1.0, 0), (1.0, 5)) is None
    assert cpu_millis((1.0, 0), (3.0, 1_000_000_000)) == 500
    assert cpu_millis((1.0, 10), (2.0, 5)) == 0  # a new process under the key


def test_sum_pods() -> None:
    got = sum_pods({"agent:pleg": (5, 100), "ns.a:x": (10, 1), "ns.a:y": (20, 2),
                    "ns.b:z": (1, 1)})
    assert got == {"ns.a": (30, 3), "ns.b": (1, 1)}


def test_store_fine_coarse_and_marks() -> None:
    store = UsageStore(5.0, fine_window=20.0, coarse_step=10.0, window=40.0)
    for i in range(12):  # t = 100, 105, ... 155
        store.add(Sample(100.0 + 5 * i, {"k": (i, 10 * i)} if i != 3 else {}))
    store.mark(Mark(150.0, "k", "restart", "restart 1"))
    store.mark(Mark(100.0, "k", "fault"))  # older than the window once trimmed below
    h = store.history()
    assert h["fine"]["t"] == [135.0, 140.0, 145.0, 150.0, 155.0]
    assert h["fine"]["series"]["k"][0] == [7, 8, 9, 10, 11]
    # steps [100,110) [110,120) ... : means, placed mid-step; the step in progress last
    coarse = h["coarse"]
    assert coarse["t"][:2] == [115.0, 125.0] and coarse["series"]["k"][0][:2] == [2, 4]
    assert coarse["t"][-1] == 155.0 and coarse["series"]["k"][0][-1] == 10  # (10 + 11) / 2
    assert [m["kind"] for m in h["marks"]] == ["restart"]


def test_store_columns_fill_missing_with_null() -> None:
    store = UsageStore(5.0)
    store.add(Sample(1.0, {"a": (1, 1)}))
    store.add(Sample(6.0, {"b": (2, 2)}))
    series = store.history()["fine"]["series"]
    assert series["a"] == [[1, None], [1, None]] and series["b"] == [[None, 2], [None, 2]]


def test_pressure_is_the_eviction_managers_with_the_readings_beside() -> None:
    assert [c["status"] for c in conditions(OK, ())] == ["False", "False", "False"]
    # low readings alone are no pressure: the eviction manager's thresholds decide (configured)
    low = NodeReadings(50 << 20, 16 << 30, 5 << 30, 100 << 30, 10, 1000, 3_900_000, 4_000_000)
    assert [c["status"] for c in conditions(low, ())] == ["False", "False", "False"]
    got = {c["type"]: (c["status"], c["reason"], c["message"])
           for c in conditions(low, ("MemoryPressure", "DiskPressure", "PIDPressure"))}
    assert got == {
        "MemoryPressure": ("True", "KubeletHasInsufficientMemory",
                           "memory.available 50Mi of 16384Mi"),
        "DiskPressure": ("True", "KubeletHasDiskPressure",
                         "nodefs.available 5%, nodefs.inodesFree 1%"),
        "PIDPressure": ("True", "KubeletHasInsufficientPID", "3900000 of 4000000 PIDs in use")}
    only_disk = {c["type"]: c["status"] for c in conditions(OK, ("DiskPressure",))}
    assert only_disk == {"MemoryPressure": "False", "DiskPressure": "True", "PIDPressure": "False"}


class FakeCri:
    def __init__(self) -> None:
        self.stats: list[Any] = []

    def list_container_stats(self) -> list[Any]:
        return self.stats


def _stat(cid: str, ts: float, cpu_ns: int, mem: int) -> Any:
    attrs = SimpleNamespace(id=cid, labels={"io.kubernetes.pod.name": "web",
                                            "io.kubernetes.pod.namespace": "ns"},
                            metadata=SimpleNamespace(name="app"))
    return SimpleNamespace(
        attributes=attrs, HasField=lambda f: True,
        cpu=SimpleNamespace(timestamp=int(ts * 1e9),
                            usage_core_nano_seconds=SimpleNamespace(value=cpu_ns)),
        memory=SimpleNamespace(working_set_bytes=SimpleNamespace(value=mem)))


def _sampler(clock: FakeClock, cri: FakeCri, statuses: dict[str, Any],
             procs: dict[int, tuple[int, int]]) -> Sampler:
    rows = [ProcessRow("pleg", ProcessState.RUNNING, pid=42)]
    return Sampler(UsageStore(5.0), lambda: cri, lambda: dict(statuses),  # type: ignore[arg-type]
                   lambda: rows, clock, Path("/"), read_proc=procs.get,
                   read_node=lambda _p: OK)


def test_sampler_rates_and_marks() -> None:
    clock = FakeClock(now=100.0, wall=1000.0)
    cri, statuses, procs = FakeCri(), dict[str, Any](), {42: (1_000_000_000, 4 << 20)}
    s = _sampler(clock, cri, statuses, procs)
    cri.stats = [_stat("c1", 1000.0, 0, 2 << 20)]
    first = s.sample()
    assert first.values["agent:pleg"] == (0, 4096)  # no rate yet
    assert first.values["ns.web:app"] == (0, 2048) and first.values["ns.web"] == (0, 2048)
    clock.advance(5.0)
    procs[42] = (1_500_000_000, 4 << 20)
    cri.stats = [_stat("c1", 1005.0, 2_500_000_000, 3 << 20)]
    second = s.sample()
    assert second.values["agent:pleg"] == (100, 4096)
    assert second.values["ns.web:app"] == (500, 3072)
    # pleg killed and restarted under a new pid: a fault, then a restart mark, at their times
    s.on_state(ProcessStateChanged(name="pleg", from_state="RUNNING", to_state="BACKOFF",
                                   pid=42, restarts=0, exit_signal=9, reason="killed",
                                   ts=1006.0))
    s.on_state(ProcessStateChanged(name="pleg", from_state="STARTING", to_state="RUNNING",
                                   pid=43, restarts=1, ts=1007.0))
    # the container restarted: its status says when
    statuses["u1"] = PodStatusValue(status=PodStatus.from_dict({"containerStatuses": [{
        "name": "app", "restartCount": 0, "state": {"running": {}}}]}),
        pod=PodRef("web", "ns", "u1"))
    clock.advance(5.0)
    s.sample()
    statuses["u1"] = PodStatusValue(status=PodStatus.from_dict({"containerStatuses": [{
        "name": "app", "restartCount": 1,
        "lastState": {"terminated": {"exitCode": 137, "reason": "Error",
                                     "finishedAt": "1970-01-01T00:16:50Z"}},
        "state": {"running": {"startedAt": "1970-01-01T00:16:51Z"}}}]}),
        pod=PodRef("web", "ns", "u1"))
    clock.advance(5.0)
    frame = s.take_frame(s.sample())
    marks = [(m["name"], m["kind"], m["t"], m["text"]) for m in frame["marks"]]
    assert marks == [("agent:pleg", "fault", 1006.0, "SIGKILL (killed)"),
                     ("agent:pleg", "restart", 1007.0, "restart 1"),
                     ("ns.web:app", "fault", 1010.0, "exit 137 (Error)"),
                     ("ns.web:app", "restart", 1011.0, "restart 1")]
    assert frame["pressure"][0]["type"] == "MemoryPressure"
    assert s.take_frame(s.sample())["marks"] == []  # each mark goes out once
    assert len(s.history()["marks"]) == 4
