"""Validation findings: one exception type carrying every error of one manifest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldIssue:
    """One finding about one field: ``field`` is a path such as ``spec.containers[0].image``
    (empty for the whole document) and ``reason`` a short human sentence."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}" if self.field else self.reason

    def to_dict(self, where: str, key: str = "file") -> dict[str, str]:
        """The wire form used in ``PodSetValue.errors``: ``{file|url, reason, field}``."""
        return {key: where, "reason": self.reason, "field": self.field}


class PodValidationError(ValueError):
    """A manifest was rejected. ``where`` names the file or URL; ``errors`` lists every
    problem found (never empty). ``str()`` gives one line per error, each prefixed with
    ``where`` (e.g. ``pods/web.yaml: spec.containers[0].image: required``)."""

    def __init__(self, where: str, errors: Sequence[FieldIssue]) -> None:
        if not errors:
            raise ValueError("PodValidationError needs at least one error")
        self.where = where
        self.errors: list[FieldIssue] = list(errors)
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        """``<where>: <field>: <reason>`` for every error."""
        return [f"{self.where}: {issue}" if self.where else str(issue) for issue in self.errors]

    def summary(self) -> str:
        """All errors on one line, for log fields and status messages."""
        return "; ".join(str(issue) for issue in self.errors)
