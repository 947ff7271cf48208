"""The supervisor finds out which built-ins can be imported in another interpreter (issue 16,
idle memory): resolving the specs leaves gRPC, protobuf, aiohttp and requests out of the
supervisor's own process, and a check's answers are those of `module_problem`."""

from __future__ import annotations

import json
import subprocess
import sys

from podvisor.supervisor.registry import module_problem, module_problem_isolated

PROBE = """
import json, sys
from podvisor.common.config import load_config
from podvisor.supervisor.registry import resolve_specs
specs = resolve_specs(load_config(None, {"staticPodPath": "/tmp", "opsPort": 0}))
heavy = [m for m in ("grpc", "google.protobuf", "aiohttp", "requests", "prometheus_client")
         if m in sys.modules]
print(json.dumps({"specs": [s.name for s in specs], "heavy": heavy}))
"""


def test_resolving_the_specs_imports_no_subsystem_package() -> None:
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120, check=True)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert {"runtime", "syncloop", "source-file", "server"} <= set(out["specs"])
    assert out["heavy"] == []


def test_isolated_answers_are_module_problems() -> None:
    for module in ("podvisor.services.status.main", "podvisor.services.later.main",
                   "no_such_top_level_pkg.main"):
        assert module_problem_isolated(module) == module_problem(module)
