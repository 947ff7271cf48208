"""A process's watch on the faults in force (common/faultwatch.py, issue 28): it sees only the
faults aimed at its process."""

from __future__ import annotations

from pathlib import Path

from podvisor.common.faultwatch import FaultWatch
from podvisor.ipc.faults import ActiveFault, FaultSpec, write_faults
from podvisor.ipc.paths import RunPaths


def test_a_watch_sees_only_the_faults_aimed_at_its_process(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    paths.ensure()
    watch = FaultWatch(paths, "pleg")
    assert watch.current == () and watch.fd is not None
    mine = ActiveFault("f1", FaultSpec("bus", "pleg", action="drop"), 1.0)
    other = ActiveFault("f2", FaultSpec("stop", "prober"), 1.0)
    write_faults(paths.faults_file, [mine, other])
    assert watch.changed() and watch.current == (mine,)
    write_faults(paths.faults_file, [other])
    assert watch.changed() and watch.current == ()
    assert not watch.changed()
    watch.close()
