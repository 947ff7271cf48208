"""The invariants a node under faults must keep, as counts that must all be 0, and the report
that says which broke and why (issue 28). ``Node.check()`` fills one; ``podvisor chaos`` keeps
its own, per fault kind, with the same names where they mean the same."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["INVARIANTS", "InvariantError", "InvariantReport"]

INVARIANTS = {
    "pods_lost": "applied pods missing from /pods, or not running at the end",
    "duplicate_containers": "extra live processes of one container (it ran twice)",
    "restarts_without_cause": "container restarts beyond the kills of that container",
    "orphans": "processes of removed pods (or of containers no pod has) still alive",
}


@dataclass
class InvariantReport:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INVARIANTS, 0))
    details: list[str] = field(default_factory=list)
    context: list[str] = field(default_factory=list)  # the node's faults, processes, pods

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def add(self, name: str, detail: str, count: int = 1) -> None:
        self.counts[name] += count
        self.details.append(f"{name}: {detail}")

    def text(self) -> str:
        lines = [f"podvisor node invariants: {'OK' if self.ok else 'BROKEN'}"]
        lines += [f"  {name:24} {n}   ({INVARIANTS[name]})" for name, n in self.counts.items()]
        lines += [f"  ! {d}" for d in self.details]
        lines += [f"  {c}" for c in self.context]
        return "\n".join(lines)


class InvariantError(AssertionError):
    """An invariant broke: ``report`` says which and why (its text is the message)."""

    def __init__(self, report: InvariantReport) -> None:
        super().__init__(report.text())
        self.report = report
