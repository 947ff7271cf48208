"""Every field of the v1 Pod API is handled or listed: the table in docs/ARCHITECTURE.md
("Every field of the v1 Pod API") against the Pod OpenAPI schema of the ``kubernetes`` client's
models and against services/pod/policy.py (fieldtable.py). A field a new client brings, or a
policy change the table does not follow, fails here."""

from __future__ import annotations

from tests.services.pod.fieldtable import (
    COVERS_SUBTREE,
    DECISIONS,
    expand,
    lookup,
    policy_decision,
    schema_paths,
    table_rows,
)


def _covered(path: str, rows: dict[str, tuple[str, str]]) -> bool:
    path = lookup(path)
    if path in rows:
        return True
    parts = path.split(".")
    return any(rows.get(".".join(parts[:i]), ("", ""))[0] in COVERS_SUBTREE
               for i in range(1, len(parts)))


def test_every_field_is_handled_or_listed() -> None:
    rows = table_rows()
    missing = [p for p in schema_paths() if not _covered(p, rows)]
    assert not missing, f"fields neither handled nor listed: {missing}"


def test_every_row_names_a_field_of_the_schema() -> None:
    known = {lookup(p) for p in schema_paths()}
    stale = [p for p in table_rows() if p not in known]
    assert not stale, f"rows naming no field of the Pod schema: {stale}"


def test_decisions_agree_with_the_policy() -> None:
    wrong = {}
    for path, (decision, _what) in table_rows().items():
        assert decision in DECISIONS, f"{path}: unknown decision {decision!r}"
        if decision in ("pending", "status"):
            continue
        enforced = policy_decision(path)
        if enforced is not None and enforced != decision:
            wrong[path] = (decision, enforced)
    assert not wrong, f"table vs policy.py (table, policy): {wrong}"


def test_the_table_reader() -> None:
    assert expand("a.{b, c}.{d,e}") == ["a.b.d", "a.b.e", "a.c.d", "a.c.e"]
    text = ("#### Every field of the v1 Pod API\n| field | decision | podvisor |\n|---|---|---|\n"
            "| `spec.{hostname, subdomain}` | pending | soon |\n\n### Next\n| `x` | no | y |\n")
    assert table_rows(text) == {"spec.hostname": ("pending", "soon"),
                                "spec.subdomain": ("pending", "soon")}
