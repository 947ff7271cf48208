"""The ops password file: written once at random (0600), never rewritten; config keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from podvisor.common.config import ConfigError, config_from_mapping, ops_password_path
from podvisor.common.opspass import ensure_ops_password, read_ops_password


def test_written_once_0600(tmp_path: Path) -> None:
    path = tmp_path / "root" / "ops-password"
    assert ensure_ops_password(path) is True
    first = read_ops_password(path)
    assert len(first) >= 20 and path.stat().st_mode & 0o777 == 0o600
    assert ensure_ops_password(path) is False
    assert read_ops_password(path) == first
    path.write_text("\n")
    with pytest.raises(ValueError):
        read_ops_password(path)


def test_config_keys() -> None:
    cfg = config_from_mapping({"rootDir": "/r"})
    assert (cfg.ops_address, cfg.ops_port, cfg.ops_username) == ("127.0.0.1", 9001, "admin")
    assert ops_password_path(cfg) == Path("/r/ops-password")
    assert ops_password_path(config_from_mapping(
        {"rootDir": "/r", "opsPasswordFile": "/etc/pw"})) == Path("/etc/pw")
    with pytest.raises(ConfigError, match="opsTLSPrivateKeyFile"):
        config_from_mapping({"rootDir": "/r", "opsTLSCertFile": "/c.pem"})
    with pytest.raises(ConfigError, match="opsPort"):
        config_from_mapping({"rootDir": "/r", "opsPort": 70000})


def test_eventlistener_specs() -> None:
    from podvisor.supervisor.registry import EVENTLISTENER_MODULE, resolve_specs

    def specs(proc: dict[str, object]) -> dict[str, object]:
        cfg = config_from_mapping({"rootDir": "/r", "supervision": {
            "builtins": False, "processes": {"mail": proc}}})
        (spec,) = resolve_specs(cfg)
        return {"module": spec.module, "kind": spec.kind, "events": spec.events,
                "command": spec.command}

    got = specs({"kind": "eventlistener", "command": "crashmail -a"})
    assert got == {"module": EVENTLISTENER_MODULE, "kind": "eventlistener", "events": "EVENT",
                   "command": "crashmail -a"}
    assert specs({"kind": "eventlistener", "command": "x", "events": "TICK_5, PROCESS_STATE"}
                 )["events"] == "TICK_5,PROCESS_STATE"
    with pytest.raises(ConfigError, match="command"):
        specs({"kind": "eventlistener"})
    with pytest.raises(ConfigError, match="unknown event type 'TOCK'"):
        specs({"kind": "eventlistener", "command": "x", "events": "TOCK"})
    with pytest.raises(ConfigError, match="kind"):
        specs({"kind": "daemon", "module": "m"})
