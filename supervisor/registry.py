"""Which processes the supervisor runs, and with which restart spec.

`BUILTINS` is the one list of built-in subsystems, in start order (stopped in reverse), each with
when it runs: a built-in the config leaves nothing to do (no port for the server or ops, no
`kubeconfig`, ...) is not spawned at all, so no phantom process shows in `status`, and a reload
that changes that starts or stops it. To add a
subsystem, add one `Builtin(...)` line; it runs only once its module `podvisor.services.<pkg>.main`
is importable (so the list can name subsystems that land later): at start the agent logs one
info line naming the built-ins not built yet, and an error for a built-in whose package does not
import. A custom module (or a built-in's replacement module) that cannot be found is a config
error (`podvisor run` exits 2 naming the key). Custom processes come from
`supervision.processes.<name>.module` in the config.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from podvisor.common.config import Config, ConfigError, node_shutdown_groups
from podvisor.common.endpoint import is_embedded
from podvisor.common.logs import Log

__all__ = ["BUILTINS", "Builtin", "ProcessSpec", "module_exists", "module_problem",
           "module_problem_isolated", "report_builtins", "resolve_specs"]


@dataclass(frozen=True)
class ProcessSpec:
    """The full restart spec of one supervised process (durations in seconds).

    Back-off: the first crash after a stable run restarts at once; the n-th crash in a row
    waits min(backoff_cap, backoff_base * 2**(n-2)). `intensity` crash restarts within
    `intensity_period` seconds make the process FATAL.
    """

    name: str
    module: str
    enabled: bool = True
    period: float = 1.0
    jitter: float = 0.0
    backoff_base: float = 0.1
    backoff_cap: float = 5.0
    backoff_reset_after: float = 10.0
    intensity: int = 10
    intensity_period: float = 60.0
    heartbeat_timeout: float = 10.0
    stop_timeout: float = 5.0
    kind: str = "process"  # or "eventlistener" (issue 14): `command` fed `events`
    command: str = ""
    events: str = ""
    stdout_events_enabled: bool = False  # PROCESS_LOG_STDOUT for listeners (issue 14)
    stderr_events_enabled: bool = False


def _always(config: Config) -> bool:
    return True


def _embedded_runtime(config: Config) -> bool:
    """The embedded runtime, or the proxy of a remote one (``criProxy``)."""
    return is_embedded(config.runtime_endpoint) or config.cri_proxy


def _has_static_pod_path(config: Config) -> bool:
    return bool(config.static_pod_path)


def _has_static_pod_url(config: Config) -> bool:
    return bool(config.static_pod_url)


def _has_kubeconfig(config: Config) -> bool:
    return bool(config.kubeconfig)


def _registers_node(config: Config) -> bool:
    return bool(config.kubeconfig) and config.register_node


def _serves_http(config: Config) -> bool:
    """The server process has a port to serve (``readOnlyPort`` or the main ``port``)."""
    return config.read_only_port != 0 or config.port != 0


def _has_ops_port(config: Config) -> bool:
    return config.ops_port != 0


def _certificates(config: Config) -> bool:  # [issue 26] TLS bootstrap and rotation
    return bool(config.kubeconfig) and (bool(config.bootstrap_kubeconfig)
                                        or config.rotate_certificates
                                        or config.server_tls_bootstrap)


def _node_shutdown(config: Config) -> bool:  # [issue 27] graceful node shutdown
    return bool(node_shutdown_groups(config)) and not config.run_once


def _run_once(config: Config) -> bool:
    return config.run_once


@dataclass(frozen=True)
class Builtin:
    """A built-in subsystem: its process name, its module, when it runs, and spec overrides.
    With `runOnce` only the built-ins marked `runonce` run (the runtime, the sources and the
    RunOnce driver); the sync loop, PLEG, status, prober, GC and the HTTP server do not."""

    name: str
    module: str
    when: Callable[[Config], bool] = _always
    overrides: Mapping[str, Any] = field(default_factory=dict)
    runonce: bool = False


BUILTINS: tuple[Builtin, ...] = (
    Builtin("runtime", "podvisor.services.runtime.main", _embedded_runtime, runonce=True),
    Builtin("status", "podvisor.services.status.main"),
    Builtin("pleg", "podvisor.services.pleg.main"),
    Builtin("syncloop", "podvisor.services.syncloop.main"),
    Builtin("source-file", "podvisor.services.sources.file_main", _has_static_pod_path,
            runonce=True),
    Builtin("source-http", "podvisor.services.sources.http_main", _has_static_pod_url,
            runonce=True),
    Builtin("certificates", "podvisor.services.certificates.main", _certificates),
    Builtin("source-api", "podvisor.services.sources.api_main", _has_kubeconfig),
    Builtin("node", "podvisor.services.node.main", _registers_node),
    # [issue 24] always: static pods' nfs/iscsi/fc/flexVolume volumes are mounted by it too
    Builtin("volumes", "podvisor.services.volumes.main"),
    Builtin("nodeshutdown", "podvisor.services.nodeshutdown.main", _node_shutdown),
    Builtin("status-api", "podvisor.services.status.api_main", _has_kubeconfig),
    Builtin("events-api", "podvisor.services.events.api_main", _has_kubeconfig),
    Builtin("runonce", "podvisor.services.syncloop.runonce_main", _run_once, runonce=True),
    Builtin("prober", "podvisor.services.prober.main"),
    Builtin("imagegc", "podvisor.services.imagegc.main"),
    Builtin("eviction", "podvisor.services.eviction.main"),  # [issue 27] node-pressure eviction
    Builtin("server", "podvisor.services.server.main", _serves_http),
    Builtin("ops", "podvisor.services.ops.main", _has_ops_port),
)


MISSING = "missing"


def module_problem(module: str) -> str | None:
    """None when `module` can be found (its parent packages are imported to find out);
    ``MISSING`` when it or a package above it does not exist; else why a package above it does
    not import (e.g. ``SyntaxError: ...``)."""
    try:
        return None if importlib.util.find_spec(module) is not None else MISSING
    except ModuleNotFoundError as exc:
        name = exc.name or ""
        if name and (module == name or module.startswith(name + ".")):
            return MISSING  # the module or its package is not there
        return f"{type(exc).__name__}: {exc}"  # a package above it imports something missing
    except Exception as exc:  # a package above it raised while importing
        return f"{type(exc).__name__}: {exc}"


# The harness that runs an eventlistener's command and feeds it supervisord's events.
EVENTLISTENER_MODULE = "podvisor.services.ops.listener"


def module_exists(module: str) -> bool:
    """True when `module` can be imported (its parent packages are imported to find out, in
    another interpreter: see `module_problem_isolated`)."""
    return module_problem_isolated(module) is None


_FOUND: set[str] = set()  # modules a check found importable (kept: a module does not vanish)
_CHECK = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
          "from podvisor.supervisor.registry import module_problem; "
          "print(json.dumps({m: module_problem(m) for m in sys.argv[2:]}))")


def _problems_elsewhere(modules: list[str]) -> dict[str, str | None] | None:
    """`module_problem` of each module, asked of a fresh interpreter with this sys.path; None
    when that could not be done."""
    try:
        out = subprocess.run([sys.executable, "-c", _CHECK, json.dumps(sys.path), *modules],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=120, check=False)
        found = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    if out.returncode != 0 or not isinstance(found, dict) or set(found) != set(modules):
        return None
    return {str(k): None if v is None else str(v) for k, v in found.items()}


def module_problem_isolated(module: str) -> str | None:
    """`module_problem`, found out in another interpreter (one for all the built-ins at once),
    so that this process never imports the subsystems' packages to look: the supervisor would
    otherwise hold every subsystem's imports (gRPC, protobuf, aiohttp, requests: ~35 MB of its
    own memory) for its whole life. In-process when no interpreter can be run."""
    if module in _FOUND:
        return None
    wanted = [module, *sorted({b.module for b in BUILTINS} - _FOUND - {module})]
    found = _problems_elsewhere(wanted)
    if found is None:
        return module_problem(module)
    _FOUND.update(m for m, why in found.items() if why is None)
    return found[module]


def report_builtins(config: Config, log: Log, builtins: tuple[Builtin, ...] = BUILTINS,
                    problem: Callable[[str], str | None] = module_problem_isolated) -> None:
    """Say at start which built-ins will not run for want of their module: one info line for
    those not built yet (no module: e.g. ``imagegc`` before it lands), an error per built-in
    whose package fails to import (a bug: it is skipped, as it cannot be spawned)."""
    if not config.supervision.builtins:
        return
    absent: dict[str, str] = {}
    for b in builtins:
        mine = config.supervision.processes.get(b.name, {})
        if mine.get("module") or not b.when(config):
            continue  # a replaced module is checked by resolve_specs; not wanted: not looked at
        why = problem(b.module)
        if why == MISSING:
            absent[b.name] = b.module
        elif why is not None:
            log.error("supervisor.builtin.import_failed", process=b.name, module=b.module,
                      error=why)
    if absent:
        log.info("supervisor.builtins.not_built", processes=sorted(absent), modules=absent)


def _spec(name: str, module: str, *layers: Mapping[str, Any]) -> ProcessSpec:
    values: dict[str, Any] = {}
    for layer in layers:
        values.update(layer)
    values.pop("module", None)
    spec = replace(ProcessSpec(name=name, module=module), **values)
    if spec.backoff_cap < spec.backoff_base:
        raise ConfigError(f"supervision.processes.{name}.backoffCap", "must be >= backoffBase")
    return spec


def resolve_specs(
    config: Config,
    builtins: tuple[Builtin, ...] = BUILTINS,
    exists: Callable[[str], bool] = module_exists,
) -> tuple[ProcessSpec, ...]:
    """Every process to supervise, in start order: enabled-or-not built-ins whose module exists
    (when `supervision.builtins` is true), then custom processes in config order.

    Precedence: ProcessSpec defaults < built-in overrides < supervision.defaults <
    supervision.processes.<name>. A configured process that is not a built-in needs `module`;
    a built-in's entry may set `module` to replace its implementation (it still runs only when
    the built-in would). With built-ins off, built-in names are free for custom processes.
    """
    sup = config.supervision
    specs: list[ProcessSpec] = []
    # With built-ins off, their names are free for custom processes (tests use that).
    builtin_names = {b.name for b in builtins} if sup.builtins else set()
    if sup.builtins:
        for b in builtins:
            if config.run_once and not b.runonce:
                continue
            mine = sup.processes.get(b.name, {})
            module = str(mine.get("module") or b.module)
            if not b.when(config):
                continue
            if exists(module):
                specs.append(_spec(b.name, module, b.overrides, sup.defaults, mine))
            elif mine.get("module"):  # a configured module that is not there: a typo
                raise ConfigError(f"supervision.processes.{b.name}.module",
                                  f"no module {module!r} can be imported")
    for name, partial in sup.processes.items():
        if name in builtin_names:
            continue
        custom = partial.get("module")
        if partial.get("kind") == "eventlistener":
            if not partial.get("command"):
                raise ConfigError(f"supervision.processes.{name}.command",
                                  "required for an eventlistener")
            custom = custom or EVENTLISTENER_MODULE
            partial = {"events": "EVENT", **partial}
        if not custom:
            raise ConfigError(f"supervision.processes.{name}.module",
                              "required for a custom process")
        if not exists(str(custom)):
            raise ConfigError(f"supervision.processes.{name}.module",
                              f"no module {str(custom)!r} can be imported")
        specs.append(_spec(name, str(custom), sup.defaults, partial))
    if config.run_once and not any(s.name == "runonce" for s in specs):
        raise ConfigError("runOnce", "needs the built-in runonce process "
                                     "(supervision.builtins: true)")
    return tuple(specs)
