"""podvisor.testing's AgentProcess (the core of the suite's agents, ``podvisor_node`` and
chaos): an agent started without a ``cgroupRoot`` gets one of its own, kept across a new
config, and removed once it stopped. Two agents on one root remove each other's empty pod
folders (the leftover scan of cgroups it does not know): a container then fails to start with
"join cgroup ... No such file or directory" and counts a restart (seen in a loaded run of
tests/services/syncloop/test_e2e_lifecycle_kill9.py beside another run's agents)."""

from __future__ import annotations

from pathlib import Path

import pytest

from podvisor.testing.agent import AgentProcess, remove_cgroup_tree


def test_each_agent_gets_a_cgroup_root_of_its_own_kept_across_configs(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    one = AgentProcess(tmp_path / "a", {}, start=False)
    two = AgentProcess(tmp_path / "b", {}, start=False)
    roots = {one.config["cgroupRoot"], two.config["cgroupRoot"]}
    assert len(roots) == 2 and all(r.startswith("/podvisor-run-") for r in roots)
    assert one.own_cgroup_root == one.config["cgroupRoot"]
    one.write_config({"nodeName": "x"})  # a reload's new config keeps the agent's root
    assert one.config["cgroupRoot"] == one.own_cgroup_root
    assert f"cgroupRoot: {one.own_cgroup_root}" in one.config_path.read_text()
    named = AgentProcess(tmp_path / "c", {"cgroupRoot": ""}, start=False)
    assert named.config["cgroupRoot"] == "" and named.own_cgroup_root == ""


def test_remove_cgroup_tree_takes_every_hierarchy_deepest_first(tmp_path: Path) -> None:
    for hierarchy in ("memory", "cpu,cpuacct", "pids"):
        (tmp_path / hierarchy / "podvisor-run-1" / "besteffort" / "podu1" / "c1").mkdir(
            parents=True)
    (tmp_path / "podvisor-run-1" / "podu2").mkdir(parents=True)  # v2: the mount itself
    (tmp_path / "memory" / "podvisor-run-2").mkdir()  # another agent's: untouched
    remove_cgroup_tree("/podvisor-run-1", tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "cpu,cpuacct", "memory", "memory/podvisor-run-2", "pids"]
    for bad in ("", "/", "/a/../b"):
        with pytest.raises(ValueError):
            remove_cgroup_tree(bad, tmp_path)
