"""The fault protocol (ipc/faults.py, issue 28): a request refused with the reason; specs and
the faults in force round-trip through run/faults/faults.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from podvisor.ipc.faults import (
    ActiveFault,
    FaultSpec,
    FaultSpecError,
    read_faults,
    spec_from_args,
    write_faults,
)


@pytest.mark.parametrize("args, says", [
    ({"kind": "flood", "target": "pleg"},
     "'kind' must be one of bus, cri, api, disk, resource, kill, stop"),
    ({"kind": "bus"}, "'target' (what the fault hits) is required"),
    ({"kind": "bus", "target": "pleg", "action": "scramble"}, "'action' must be one of drop"),
    ({"kind": "bus", "target": "pleg", "action": "delay"}, "a delay fault needs 'delay'"),
    ({"kind": "bus", "target": "pleg", "direction": "up"}, "'direction' must be one of"),
    ({"kind": "bus", "target": "pleg", "rate": 0}, "'rate' must be a share"),
    ({"kind": "bus", "target": "pleg", "for": -1}, "'for' must be seconds between 0"),
    ({"kind": "bus", "target": "pleg", "methods": ["Version"]}, "a bus fault takes no 'methods'"),
    ({"kind": "cri", "target": "runtime", "action": "error", "code": "OOPS"},
     "'code' must be a gRPC status name"),
    ({"kind": "cri", "target": "runtime"}, "a latency fault needs 'delay'"),
    ({"kind": "cri", "target": "runtime", "action": "hang", "methods": "a,,b,3"}, ""),
    ({"kind": "kill", "target": "pleg", "for": 3}, "a kill fault takes no 'for'"),
    ({"kind": "stop", "target": "pleg", "signal": "KILL"}, "a stop fault takes no 'signal'"),
    ({"kind": "disk", "target": "pleg"}, "a disk fault's target is pod/NAME/VOLUME (an "
     "emptyDir) or rootDir"),
    ({"kind": "disk", "target": "pod/web"}, "a disk fault's target is pod/NAME/VOLUME"),
    ({"kind": "disk", "target": "rootDir", "action": "wet"}, "'action' must be one of full"),
])
def test_a_request_is_refused_with_the_reason(args: dict[str, Any], says: str) -> None:
    if not says:
        assert spec_from_args(args).methods == ("a", "b", "3")
        return
    with pytest.raises(FaultSpecError) as err:
        spec_from_args(args)
    assert says in str(err.value)


def test_a_disk_fault_on_rootdir_is_aimed_at_every_process() -> None:
    spec = spec_from_args({"kind": "disk", "target": "rootDir", "action": "full", "amount": 4})
    assert (spec.action, spec.amount) == ("full", 4)
    assert spec.aimed_at("status") and spec.aimed_at("prober")  # each reopens its files
    volume = spec_from_args({"kind": "disk", "target": "pod/web/data"})
    assert not volume.aimed_at("status")


def test_specs_and_faults_in_force_round_trip_through_the_file(tmp_path: Path) -> None:
    specs = [spec_from_args({"kind": "bus", "target": "pleg", "action": "delay", "delay": 0.5,
                             "direction": "recv", "topics": ["clone.pleg."], "rate": 0.5,
                             "for": 30}),
             spec_from_args({"kind": "cri", "target": "runtime", "action": "error",
                             "code": "INTERNAL", "methods": ["ListContainers"]}),
             spec_from_args({"kind": "stop", "target": "prober", "for": 2})]
    assert specs[1] == FaultSpec("cri", "runtime", action="error", methods=("ListContainers",),
                                 code="INTERNAL")
    faults = [ActiveFault(f"f{i}", s, 100.0 + i, None if i == 1 else 200.0)
              for i, s in enumerate(specs)]
    path = tmp_path / "faults.json"
    write_faults(path, faults)
    assert read_faults(path) == tuple(faults)
    assert [f.spec.describe() for f in faults] == [
        "bus pleg: delay recv 0.5s topics clone.pleg. (50%)",
        "cri runtime: error INTERNAL on ListContainers", "stop prober: SIGSTOP"]
    path.write_text("{not json")
    assert read_faults(path) == ()
    assert read_faults(tmp_path / "missing.json") == ()
