"""`podvisor`: the agent's command line.

    podvisor run --config FILE [--node-name N] [--root-dir DIR] ...   run in the foreground
    podvisor run --config FILE --runonce                              RunOnce: run the pods, report
    podvisor config --config FILE [flags]                             print the effective config
    podvisor chaos --pods P --duration S [--seed N] [--json] [--root-dir DIR]
                   [--faults KIND,...] [--rounds N] [--burst N] [--burst-after N]
                   [--burst-target runtime|syncloop]
                                                                      fault injection, invariants
    podvisor fleet --config FLEET.yaml                                one page over many nodes

Exit codes: 0 after a clean shutdown, 2 for a bad config (the message names the key), 1 when
another agent already runs on the same rootDir. RunOnce: 0 when every pod started, 1 otherwise
(the failed pods are named on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from podvisor.cli.flags import add_config_flags, overrides_from_args
from podvisor.common.config import Config, ConfigError, config_to_mapping, load_config
from podvisor.supervisor.registry import resolve_specs

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="podvisor", description="kubelet-style node agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, text in (("run", "run the agent in the foreground (SIGHUP reloads)"),
                       ("config", "validate and print the effective config as JSON")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--config", type=Path, default=None, metavar="FILE",
                       help="YAML config file (KubeletConfiguration key names)")
        add_config_flags(p)
    chaos = sub.add_parser("chaos", help="fault injection against a private agent (or a "
                                         "running one: --root-dir)",
                           description="fault injection against a private agent: exits 1 when "
                                       "an invariant is broken (see podvisor.cli.chaos)")
    chaos.add_argument("--pods", type=int, default=20, help="pods to run (default 20)")
    chaos.add_argument("--duration", type=float, default=60.0,
                       help="seconds of faults (default 60)")
    chaos.add_argument("--seed", type=int, default=None, help="random seed (printed)")
    chaos.add_argument("--json", action="store_true", help="print the report as JSON")
    chaos.add_argument("--keep", action="store_true", help="keep the temp dir (agent log)")
    chaos.add_argument("--root-dir", default=None, metavar="DIR",
                       help="attach to the agent running on this rootDir instead of starting "
                            "a private one (its pods go to that agent's staticPodPath and are "
                            "removed after; the agent is neither killed nor stopped)")
    chaos.add_argument("--faults", default="", metavar="KIND,...",
                       help="draw only from these kinds (kill, stop, container, supervisor, "
                            "burst-kill, bus, cri, resource, api, disk; default all)")
    chaos.add_argument("--kubeconfig", default=None, metavar="FILE",
                       help="the private agent joins this API server (its user "
                            "system:node:chaos): the api faults need one")
    chaos.add_argument("--rounds", type=int, default=0,
                       help="stop after this many faults (default: when --duration is over)")
    chaos.add_argument("--burst", type=int, default=10,
                       help="burst-kill: pods written at once (default 10)")
    chaos.add_argument("--burst-after", type=int, default=0, metavar="N",
                       help="burst-kill: kill once N of them run (default 1 to half, seeded)")
    chaos.add_argument("--burst-target", choices=("runtime", "syncloop"), default=None,
                       help="burst-kill: the subsystem killed (default either, seeded)")
    fleet = sub.add_parser("fleet", help="one page, feed and XML-RPC over many nodes' ops "
                                         "ports", description="serve the fleet page "
                                         "(podvisor.services.fleet) until SIGTERM/SIGINT")
    fleet.add_argument("--config", type=Path, required=True, metavar="FLEET.yaml",
                       help="the nodes (ops URL, credentials file) and/or a kubeconfig")
    return parser


def _load(args: argparse.Namespace) -> tuple[Config, dict[str, object]]:
    overrides = overrides_from_args(args)
    config = load_config(args.config, overrides)
    resolve_specs(config)  # custom processes must name a module, etc.
    return config, overrides


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "chaos":
        from podvisor.cli.chaos import main_chaos  # (psutil, zmq: not for `run`)

        return main_chaos(args)
    if args.cmd == "fleet":
        from podvisor.services.fleet import main_fleet  # (aiohttp: not for `run`)

        return main_fleet(args.config)
    try:
        config, overrides = _load(args)
    except ConfigError as exc:
        print(f"podvisor: {exc}", file=sys.stderr)
        return 2
    if args.cmd == "config":
        print(json.dumps(config_to_mapping(config), indent=2, sort_keys=True))
        return 0
    from podvisor.supervisor.app import AgentLockedError, run_agent

    try:
        return run_agent(args.config, overrides, config)
    except AgentLockedError as exc:
        print(f"podvisor: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"podvisor: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
