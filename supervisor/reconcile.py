"""Applying a reloaded config (SIGHUP or `reload`) to a running `Supervisor`.

New processes start (when enabled), removed ones stop and are forgotten, newly disabled ones stop,
newly enabled ones start, a changed module restarts the process, and any other changed restart
spec field applies from the next decision on. Returns one line per change, for the log and the
`reload` reply.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields

from podvisor.supervisor.core import Supervisor
from podvisor.supervisor.process import Intent, SupervisedProcess
from podvisor.supervisor.registry import ProcessSpec

__all__ = ["apply_specs"]


def _diff(old: ProcessSpec, new: ProcessSpec) -> list[str]:
    return [
        f"{f.name} {getattr(old, f.name)!r} -> {getattr(new, f.name)!r}"
        for f in fields(ProcessSpec)
        if getattr(old, f.name) != getattr(new, f.name)
    ]


def apply_specs(sup: Supervisor, specs: Iterable[ProcessSpec]) -> list[str]:
    new_specs = {s.name: s for s in specs}
    changes: list[str] = []
    for name in [n for n in sup.procs if n not in new_specs]:
        proc = sup.procs[name]
        changes.append(f"{name}: removed")
        if proc.alive:
            sup.stop_process(proc, Intent.REMOVE, "removed from config")
        else:
            del sup.procs[name]
    ordered: dict[str, SupervisedProcess] = {}
    to_start: list[str] = []
    for name, spec in new_specs.items():
        found = sup.procs.get(name)
        if found is None:
            ordered[name] = SupervisedProcess(spec, state_since=sup.d.clock())
            changes.append(f"{name}: added")
            if spec.enabled:
                to_start.append(name)
            continue
        proc = ordered[name] = found
        diff = _diff(proc.spec, spec)
        if not diff:
            continue
        changes.append(f"{name}: " + ", ".join(diff))
        old, proc.spec = proc.spec, spec
        if old.enabled and not spec.enabled:
            sup.stop(name)
        elif spec.enabled and not old.enabled and not proc.alive:
            to_start.append(name)
        elif old.module != spec.module and proc.alive:
            sup.restart(name)
    # processes being removed stay known until they exit
    for name, proc in sup.procs.items():
        ordered.setdefault(name, proc)
    sup.procs = ordered
    if not sup.shutting_down:
        for name in to_start:
            sup.start(name)
    return changes
