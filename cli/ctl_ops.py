"""`podvisorctl ops-password`: print the ops port's password (HTTP Basic, user `opsUsername`).

Where it comes from: the agent's effective config (`run/config.json`: `opsPasswordFile`, else
`<rootDir>/ops-password`, which the agent writes once, at random, mode 0600); without that
file, the default path under the rootDir. Works while the agent is down. Exit 0 printed; 1 no
password file yet (start the agent once) or unreadable.
"""

from __future__ import annotations

import sys
from pathlib import Path

from podvisor.common.config import Config, ConfigError, ops_password_path, read_config_json
from podvisor.common.opspass import read_ops_password
from podvisor.ipc.paths import RunPaths

__all__ = ["main_ops_password"]


def main_ops_password(root_dir: str) -> int:
    try:
        config = read_config_json(RunPaths(Path(root_dir)).config_json)
    except (OSError, ConfigError, ValueError):
        config = Config(root_dir=root_dir)
    path = ops_password_path(config)
    try:
        print(read_ops_password(path))
    except FileNotFoundError:
        print(f"podvisorctl: no ops password yet ({path}); the agent writes it at start",
              file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"podvisorctl: cannot read the ops password: {exc}", file=sys.stderr)
        return 1
    return 0
