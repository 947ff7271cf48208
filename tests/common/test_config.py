"""Config parsing, flags and the effective config round trip."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest

from podvisor.cli.flags import add_config_flags, flag_name, overrides_from_args
from podvisor.common.config import (
    SUPERVISION_KEYS,
    TOP_KEYS,
    Config,
    ConfigError,
    SupervisionConfig,
    config_from_mapping,
    config_to_mapping,
    dataclass_attrs,
    load_config,
    read_config_json,
    write_config_json,
)
from podvisor.common.endpoint import cri_endpoint
from podvisor.common.logs import MemoryLogger
from podvisor.common.values import parse_duration, parse_quantity
from podvisor.supervisor.registry import (
    Builtin,
    ProcessSpec,
    module_exists,
    module_problem,
    report_builtins,
    resolve_specs,
)


def test_tables_match_dataclasses() -> None:
    sections = {f.name for f in fields(Config)
                if f.default_factory is not MISSING and is_dataclass(f.default_factory)}
    assert "supervision" in sections
    assert {k.attr for k in TOP_KEYS} == dataclass_attrs(Config) - sections - {
        "image_registries"}  # a YAML-only map, parsed by _parse_registries
    assert {k.attr for k in SUPERVISION_KEYS} == dataclass_attrs(SupervisionConfig) - {
        "defaults", "processes"}


def test_defaults_mirror_kubelet() -> None:
    c = config_from_mapping({})
    assert c.file_check_frequency == 20.0 and c.http_check_frequency == 20.0
    assert c.sync_frequency == 60.0 and c.runtime_endpoint == "embedded"
    assert c.address == "127.0.0.1" and c.read_only_port == 0 and not c.stop_pods_on_exit
    assert (c.image_gc_high_threshold_percent, c.image_gc_low_threshold_percent) == (85, 80)
    assert c.container_log_max_size == 10 * 1024 * 1024


@pytest.mark.parametrize(("text", "seconds"), [
    ("20s", 20.0), ("1m", 60.0), ("1m30s", 90.0), ("300ms", 0.3), ("1.5h", 5400.0),
    ("0", 0.0), ("2h45m", 9900.0), ("10us", 1e-5),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration("k", text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "10", "-1s", "1 s", "1d", "s", True, 1.5, None, [1]])
def test_bad_durations(bad: Any) -> None:
    with pytest.raises(ConfigError) as err:
        parse_duration("a.b", bad)
    assert err.value.key == "a.b"


def test_quantities() -> None:
    assert parse_quantity("k", "10Mi") == 10 * 1024**2
    assert parse_quantity("k", "500k") == 500_000
    assert parse_quantity("k", 7) == 7
    with pytest.raises(ConfigError):
        parse_quantity("k", "10MB")


@pytest.mark.parametrize(("raw", "key"), [
    ({"nodename": "x"}, "nodename"),
    ({"port": 70000}, "port"),
    ({"port": True}, "port"),
    ({"stopPodsOnExit": "maybe"}, "stopPodsOnExit"),
    ({"nodeName": 5}, "nodeName"),
    ({"runtimeEndpoint": "unix://relative"}, "runtimeEndpoint"),
    ({"staticPodURLHeader": {"X": 1}}, "staticPodURLHeader.X"),
    ({"imageGCLowThresholdPercent": 90}, "imageGCLowThresholdPercent"),
    ({"supervision": {"heartbeatInterval": "0"}}, "supervision.heartbeatInterval"),
    ({"supervision": {"processes": {"x": {"intensity": 0}}}}, "supervision.processes.x.intensity"),
    ({"supervision": {"processes": {"x": {"wat": 1}}}}, "supervision.processes.x.wat"),
    ({"supervision": {"defaults": {"module": "m"}}}, "supervision.defaults.module"),
    ({"supervision": {"processes": {"a b": {}}}}, "supervision.processes.a b"),
    ({"supervision": []}, "supervision"),
])
def test_bad_values_name_the_key(raw: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mapping(raw)
    assert err.value.key == key
    assert repr(key) in str(err.value)


def test_round_trip_through_json(tmp_path: Path) -> None:
    raw = {"nodeName": "n1", "syncFrequency": "90s", "staticPodURLHeader": {"A": ["b"]},
           "supervision": {"heartbeatInterval": "250ms", "defaults": {"backoffCap": "2s"},
                           "processes": {"x": {"module": "m", "period": "1.5s"}}}}
    c = config_from_mapping(raw)
    assert config_from_mapping(config_to_mapping(c)) == c
    write_config_json(c, tmp_path / "config.json")
    assert read_config_json(tmp_path / "config.json") == c
    assert (tmp_path / "config.json").stat().st_mode & 0o777 == 0o600


def test_load_yaml_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("nodeName: file\nport: 1234\nrootDir: rel\n")
    c = load_config(f, {"nodeName": "flag", "supervision": {"logLevel": "debug"}})
    assert (c.node_name, c.port, c.supervision.log_level) == ("flag", 1234, "debug")
    assert Path(c.root_dir).is_absolute()
    f.write_text("nodeName: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(f)
    f.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a map"):
        load_config(f)


def test_flags(tmp_path: Path) -> None:
    assert flag_name("staticPodURL") == "static-pod-url"
    assert flag_name("imageGCHighThresholdPercent") == "image-gc-high-threshold-percent"
    p = argparse.ArgumentParser()
    add_config_flags(p)
    ns = p.parse_args(["--node-name", "n", "--stop-pods-on-exit", "--read-only-port", "10255",
                       "--static-pod-url-header", "A:1", "--static-pod-url-header", "A:2",
                       "--supervision-heartbeat-interval", "2s",
                       "--process", "pleg.heartbeatTimeout=30s",
                       "--syncloop-crash-loop-back-off-max", "1m"])
    over = overrides_from_args(ns)
    c = config_from_mapping(over)
    assert c.node_name == "n" and c.stop_pods_on_exit and c.read_only_port == 10255
    assert c.static_pod_url_header == {"A": ["1", "2"]}
    assert c.supervision.heartbeat_interval == 2.0
    assert c.supervision.processes["pleg"] == {"heartbeat_timeout": 30.0}
    assert c.syncloop.crash_loop_backoff_max == 60.0
    with pytest.raises(ConfigError, match=r"NAME\.KEY=VALUE"):
        overrides_from_args(p.parse_args(["--process", "nodot=1"]))


def test_resolve_specs_layers_and_builtins() -> None:
    builtins = (Builtin("a", "mod.a", overrides={"period": 5.0}),
                Builtin("b", "mod.b", when=lambda c: c.runtime_endpoint == "embedded"),
                Builtin("missing", "mod.missing"))
    c = config_from_mapping({"supervision": {
        "defaults": {"stopTimeout": "1s"},
        "processes": {"a": {"heartbeatTimeout": "3s"}, "c": {"module": "mod.c"}}}})
    specs = resolve_specs(c, builtins, exists=lambda m: m != "mod.missing")
    assert [s.name for s in specs] == ["a", "b", "c"]
    a = specs[0]
    assert (a.period, a.heartbeat_timeout, a.stop_timeout) == (5.0, 3.0, 1.0)
    assert specs[2] == ProcessSpec(name="c", module="mod.c", stop_timeout=1.0)
    no_b = config_from_mapping({"runtimeEndpoint": "unix:///x.sock"})
    assert [s.name for s in resolve_specs(no_b, builtins, exists=lambda m: True)] == [
        "a", "missing"]
    off = config_from_mapping({"supervision": {"builtins": False}})
    assert resolve_specs(off, builtins, exists=lambda m: True) == ()
    replaced = config_from_mapping({"supervision": {"processes": {"a": {"module": "x"}}}})
    assert resolve_specs(replaced, builtins, exists=lambda m: True)[0].module == "x"
    with pytest.raises(ConfigError) as err:
        resolve_specs(config_from_mapping({"supervision": {"processes": {"z": {}}}}),
                      builtins, exists=lambda m: True)
    assert err.value.key == "supervision.processes.z.module"


def test_runonce_key_flags_and_processes() -> None:
    p = argparse.ArgumentParser()
    add_config_flags(p)
    for argv in (["--runonce"], ["--run-once"], ["--run-once", "true"]):
        assert config_from_mapping(overrides_from_args(p.parse_args(argv))).run_once
    c = config_from_mapping(overrides_from_args(p.parse_args(
        ["--runonce", "--run-once-max-retries", "3", "--run-once-retry-delay", "250ms"])))
    assert (c.run_once, c.run_once_max_retries, c.run_once_retry_delay) == (True, 3, 0.25)
    assert (Config().run_once_max_retries, Config().run_once_retry_delay) == (10, 1.0)
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"runOnceMaxRetries": 0})
    assert err.value.key == "runOnceMaxRetries"
    # RunOnce runs only the runtime, the sources and its driver: no sync loop, no server
    once = config_from_mapping({"runOnce": True, "staticPodPath": "/m"})
    assert [s.name for s in resolve_specs(once, exists=lambda m: True)] == [
        "runtime", "source-file", "runonce"]
    assert "runonce" not in [s.name for s in resolve_specs(
        config_from_mapping({"staticPodPath": "/m"}), exists=lambda m: True)]
    with pytest.raises(ConfigError) as err:
        resolve_specs(config_from_mapping({"runOnce": True, "supervision": {"builtins": False}}))
    assert err.value.key == "runOnce"


def test_a_builtin_with_nothing_to_do_is_not_spawned() -> None:
    """The registry decides from the config: no server without a port, no ops without the ops
    port, no node without registerNode (they slept or exited and were re-run before); so status,
    XML-RPC and the dashboard show no phantom for them, and a reload starts or stops them."""
    def names(**cfg: Any) -> list[str]:
        return [s.name for s in resolve_specs(config_from_mapping(cfg), exists=lambda m: True)]

    everything = names(readOnlyPort=10255, port=10250, opsPort=9001, kubeconfig="/k")
    assert {"server", "ops", "node", "status-api"} <= set(everything)
    assert "server" in names(readOnlyPort=0, port=10250)
    assert "server" in names(readOnlyPort=10255, port=0)
    assert "server" not in names(readOnlyPort=0, port=0)
    assert "ops" not in names(opsPort=0)
    api = names(kubeconfig="/k", registerNode=False)
    assert "node" not in api and {"source-api", "status-api", "events-api"} <= set(api)
    # the runtime process: the embedded runtime, or the CRI proxy of a remote one (criProxy)
    assert "runtime" in names()
    assert "runtime" not in names(runtimeEndpoint="unix:///run/containerd/containerd.sock")
    assert "runtime" in names(runtimeEndpoint="unix:///run/containerd/containerd.sock",
                              criProxy=True)


def test_the_nodes_cri_clients_dial_the_proxy_with_cri_proxy() -> None:
    remote = "unix:///run/containerd/containerd.sock"
    assert cri_endpoint("embedded", "/r/run/cri.sock") == "unix:///r/run/cri.sock"
    assert cri_endpoint(remote, "/r/run/cri.sock") == remote
    assert cri_endpoint(remote, "/r/run/cri.sock", proxied=True) == "unix:///r/run/cri.sock"


def test_a_custom_or_replacement_module_that_cannot_be_found_is_a_config_error() -> None:
    builtins = (Builtin("a", "mod.a"),)
    typo = config_from_mapping({"supervision": {"processes": {"web": {"module": "svc_idel"}}}})
    with pytest.raises(ConfigError, match="svc_idel") as err:
        resolve_specs(typo, builtins, exists=module_exists)
    assert err.value.key == "supervision.processes.web.module"
    replaced = config_from_mapping({"supervision": {"processes": {"a": {"module": "no.such"}}}})
    with pytest.raises(ConfigError) as err:
        resolve_specs(replaced, builtins, exists=lambda m: m != "no.such")
    assert err.value.key == "supervision.processes.a.module"


def test_builtins_that_do_not_import_are_reported_at_start(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "pvbroken"
    broken.mkdir()
    (broken / "__init__.py").write_text("import no_such_dependency_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    builtins = (Builtin("status", "podvisor.services.status.main"),
                Builtin("imagegc", "podvisor.services.imagegc.main"),
                Builtin("later", "podvisor.services.later.main"),
                Builtin("later2", "podvisor.services.later2.main"),
                Builtin("broken", "pvbroken.main"),
                Builtin("off", "podvisor.services.off.main", when=lambda c: False))
    assert module_problem("podvisor.services.status.main") is None
    assert module_problem("podvisor.services.imagegc.main") is None  # built (issue 12)
    assert module_problem("podvisor.services.later.main") == "missing"
    assert "no_such_dependency_anywhere" in str(module_problem("pvbroken.main"))
    log = MemoryLogger()
    report_builtins(config_from_mapping({}), log, builtins)
    infos = [e for e in log.events if e["level"] == "info"]
    assert [(e["event"], e["processes"]) for e in infos] == [
        ("supervisor.builtins.not_built", ["later", "later2"])]  # one line for all
    [error] = [e for e in log.events if e["level"] == "error"]
    assert error["event"] == "supervisor.builtin.import_failed" and error["process"] == "broken"
    # the broken one is skipped by resolve_specs, like one not built yet
    names = [s.name for s in resolve_specs(config_from_mapping({}), builtins)]
    assert names == ["status", "imagegc"]


def test_relative_paths_in_the_file_are_relative_to_the_file(tmp_path: Path) -> None:
    from podvisor.common.config import load_config

    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    conf = conf_dir / "podvisor.yaml"
    conf.write_text("rootDir: ../state\nstaticPodPath: manifests\n")
    config = load_config(conf)
    assert config.root_dir == str(tmp_path / "state")
    assert config.static_pod_path == str(conf_dir / "manifests")
    flagged = load_config(conf, {"staticPodPath": "from-flag"})
    assert flagged.static_pod_path == str(Path.cwd() / "from-flag")


@pytest.mark.parametrize(("raw", "expected"), [
    (None, "/podvisor"), ("", ""), ("/podvisor", "/podvisor"), ("/a/b/", "/a/b"),
    ("//a//b", "/a/b"), ("/", "/"),
])
def test_cgroup_root(raw: str | None, expected: str) -> None:
    c = config_from_mapping({} if raw is None else {"cgroupRoot": raw})
    assert c.cgroup_root == expected
    assert config_from_mapping(config_to_mapping(c)) == c
    p = argparse.ArgumentParser()
    add_config_flags(p)
    over = overrides_from_args(p.parse_args(["--cgroup-root", "/x"]))
    assert config_from_mapping(over).cgroup_root == "/x"


@pytest.mark.parametrize("bad", ["podvisor", "/a/../b", "/a/./b", "system.slice:pv:x", 5])
def test_bad_cgroup_root_names_the_key(bad: object) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"cgroupRoot": bad})
    assert err.value.key == "cgroupRoot"


def test_keys_without_a_subsystem_yet_are_reported_when_set() -> None:
    from podvisor.common.config import Config, keys_not_yet_used

    assert keys_not_yet_used(Config()) == []
    reported = dict(keys_not_yet_used(Config(kubeconfig="/etc/kubeconfig",
                                             container_log_max_files=9,
                                             image_gc_high_threshold_percent=90)))
    assert reported == {}  # the API server, image GC and log rotation are all built now


def test_image_registries_parse_and_round_trip() -> None:
    raw = {"imageRegistries": {"registry.local:5000": {"caFile": "/etc/ca.pem",
                                                       "mirrors": ["mirror.local"]},
                               "10.0.0.1:5000": {"plainHTTP": True}}}
    config = config_from_mapping(raw)
    assert config.image_registries["10.0.0.1:5000"] == {"plainHTTP": True}
    assert config_from_mapping(config_to_mapping(config)) == config
    with pytest.raises(ConfigError, match=r"imageRegistries.r.plainHTTP.*expected bool"):
        config_from_mapping({"imageRegistries": {"r": {"plainHTTP": "yes"}}})
    with pytest.raises(ConfigError, match=r"imageRegistries.r.ca.*unknown key"):
        config_from_mapping({"imageRegistries": {"r": {"ca": "x"}}})


def test_runtime_endpoint_of_a_root_dir(tmp_path: Path) -> None:
    """podvisorctl's one rootDir -> runtime lookup: the agent's `run/config.json`, else (never
    ran, unreadable) the embedded runtime."""
    from podvisor.common.config import run_config, runtime_endpoint_of, write_config_json

    path = tmp_path / "config.json"
    assert run_config(path) is None and runtime_endpoint_of(path) == "embedded"
    write_config_json(Config(runtime_endpoint="unix:///run/containerd/containerd.sock"), path)
    assert runtime_endpoint_of(path) == "unix:///run/containerd/containerd.sock"
    path.write_text("{not json")
    assert runtime_endpoint_of(path) == "embedded"
