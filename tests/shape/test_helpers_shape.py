"""The code's shape (issue 23, step 5): one definition of each small helper and protocol type.

``duplicates(root)`` reads the tree's Python source (never imports it) and lists every second
definition of what has one home:

- the RFC 3339 helpers of ``common/timefmt.py``: a function elsewhere with one of their names
  (leading underscores aside), or one that formats a time the way they do;
- the CRI label keys of ``common/labels.py``: their string values spelled anywhere else;
- the control protocol of ``ipc/control.py``: an enum or table of the process states or of the
  fault codes, a control request built by hand (a map of ``command`` and ``args``: a client),
  a status row or last exit built by hand (its wire keys);

and ``dynamic_imports(root)`` every import of a module by name (``importlib``) outside the
supervisor's spawning of registered subsystems. The tests assert none; ``python
tests/shape/test_helpers_shape.py`` prints the counts.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("cli", "testing", "supervisor", "services", "common", "ipc")  # podvisor's own
SCANNED = (*PACKAGES, "bench")  # where a second definition would be a copy (tests pin values)

TIMEFMT = Path("common/timefmt.py")
LABELS = Path("common/labels.py")
CONTROL = Path("ipc/control.py")
# how the RFC 3339 helpers format a time: another function doing so is a second definition
TIME_FORMATS = frozenset({"%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%fZ"})
PROCESS_STATES = frozenset({"STOPPED", "STARTING", "RUNNING", "BACKOFF", "STOPPING", "EXITED",
                            "FATAL", "UNKNOWN"})
FAULTS = frozenset({"UNKNOWN_METHOD", "INCORRECT_PARAMETERS", "BAD_ARGUMENTS", "SHUTDOWN_STATE",
                    "BAD_NAME", "BAD_SIGNAL", "NO_FILE", "FAILED", "ABNORMAL_TERMINATION",
                    "SPAWN_ERROR", "ALREADY_STARTED", "NOT_RUNNING", "CANT_REREAD"})
TABLE = 7  # this many of a set's names in one enum or literal make it a copy of the set
# the keys of the protocol's maps: a literal map with (at least) these keys is one built by hand
REQUEST = frozenset({"command", "args"})  # exactly these: a control request (a client)
WIRE_SHAPES = {
    "status row": frozenset({"uptime", "heartbeatAge", "since", "lastExit"}),
    "last exit": frozenset({"signame", "ranFor"}),
}
# the supervisor spawns the registry's subsystems by module name: the one place allowed to
REGISTRY = frozenset({Path("supervisor/registry.py"), Path("supervisor/child.py"),
                      Path("supervisor/forkserver.py")})
DYNAMIC = frozenset({"import_module", "__import__", "find_spec", "spec_from_file_location"})


@functools.cache
def _parse(path: Path) -> tuple[ast.Module, tuple[ast.AST, ...]]:
    """The module and all its nodes (parsed once per run: both tests read the same tree)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return tree, tuple(ast.walk(tree))


def _sources(root: Path, folders: tuple[str, ...], triggers: frozenset[str],
             ) -> Iterator[tuple[Path, ast.Module, tuple[ast.AST, ...]]]:
    """The modules whose text holds one of ``triggers`` (a file without any cannot hold what
    is looked for: parsing only the others keeps the count cheap)."""
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if any(t in text for t in triggers):
                yield (path.relative_to(root), *_parse(path))


def _any_of(names: frozenset[str]) -> frozenset[str]:
    """Enough of a set's names that a table holding ``TABLE`` of them holds one of these."""
    return frozenset(sorted(names)[:len(names) - TABLE + 1])


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _public_functions(tree: ast.Module) -> set[str]:
    return {n.name for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name[:1] != "_"}


def _label_values(root: Path) -> set[str]:
    tree = ast.parse((root / LABELS).read_text(encoding="utf-8"))
    return {n.value.value for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            and isinstance(n.value.value, str)}


def _names_in(node: ast.AST) -> set[str]:
    """The member names of an enum class, or the strings of a literal table."""
    if isinstance(node, ast.ClassDef):
        return {t.id for stmt in node.body if isinstance(stmt, ast.Assign)
                for t in stmt.targets if isinstance(t, ast.Name)}
    return _strings(node)


def _tables(tree: ast.Module) -> Iterator[ast.AST]:
    """Enum classes and module-level literal tables (what a copied enum looks like)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            yield node
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            yield node.value


def duplicates(root: Path = REPO) -> dict[str, list[str]]:
    """Per helper or protocol type, where it is defined a second time (``path:line``)."""
    helpers = _public_functions(ast.parse((root / TIMEFMT).read_text(encoding="utf-8")))
    labels = _label_values(root)
    triggers = frozenset({*helpers, *TIME_FORMATS, *labels, *_any_of(PROCESS_STATES),
                          *_any_of(FAULTS), *(f'"{k}"' for k in REQUEST),
                          *(f'"{k}"' for shape in WIRE_SHAPES.values() for k in shape)})
    found: dict[str, list[str]] = {"rfc3339 helpers": [], "CRI label keys": [],
                                   "process states": [], "faults": [], "control clients": [],
                                   **{what: [] for what in WIRE_SHAPES}}
    for path, tree, nodes in _sources(root, SCANNED, triggers):
        where = f"{path}:"
        strings = [n for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        if path != TIMEFMT:
            formats = any(n.value in TIME_FORMATS for n in strings)
            for node in nodes:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
                        (node in tree.body and node.name.lstrip("_") in helpers)
                        or (formats and _strings(node) & TIME_FORMATS)):
                    found["rfc3339 helpers"].append(f"{where}{node.lineno} {node.name}")
        if path != LABELS:
            found["CRI label keys"] += [f"{where}{n.lineno} {n.value}" for n in strings
                                        if n.value in labels]
        if path == CONTROL:
            continue
        for table in _tables(tree):
            names = _names_in(table)
            for what, members in (("process states", PROCESS_STATES), ("faults", FAULTS)):
                if len(names & members) >= TABLE:
                    found[what].append(f"{where}{table.lineno}")
        for node in nodes:
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if keys == REQUEST:
                    found["control clients"].append(f"{where}{node.lineno}")
                for what, shape in WIRE_SHAPES.items():
                    if shape <= keys:
                        found[what].append(f"{where}{node.lineno}")
    return found


def dynamic_imports(root: Path = REPO) -> list[str]:
    """Imports by name (``importlib``) of anything but a named third-party module, outside the
    supervisor's spawning of its registered subsystems."""
    out = []
    for path, _tree, nodes in _sources(root, PACKAGES, DYNAMIC):
        if path in REGISTRY:
            continue
        for node in nodes:
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in DYNAMIC:
                continue
            first = node.args[0] if node.args else None
            if (isinstance(first, ast.Constant) and isinstance(first.value, str)
                    and not first.value.startswith(("podvisor", "."))):
                continue  # a named module of another distribution (grpc._common)
            out.append(f"{path}:{node.lineno} {name}")
    return out


def test_each_small_helper_and_protocol_type_is_defined_once() -> None:
    found = duplicates()
    assert {what: where for what, where in found.items() if where} == {}


def test_no_module_of_podvisors_is_imported_by_name_outside_the_registry() -> None:
    assert dynamic_imports() == []


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A tree with the one definitions and one copy of each (the counter is not vacuous)."""
    for rel in (TIMEFMT, LABELS, CONTROL):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel).read_text(encoding="utf-8"), encoding="utf-8")
    for folder in SCANNED:
        (tmp_path / folder).mkdir(exist_ok=True)
    (tmp_path / "services" / "copies.py").write_text('''
import enum, importlib, time
UID = "io.kubernetes.pod.uid"
NAMES = {0: "STOPPED", 10: "STARTING", 20: "RUNNING", 30: "BACKOFF", 40: "STOPPING",
         100: "EXITED", 200: "FATAL"}
STEPS = {("RUNNING", "BACKOFF"): "EXITED", ("STOPPING", "STARTING"): "FATAL"}  # not a copy
class F(enum.IntEnum):
    UNKNOWN_METHOD = 1
    BAD_ARGUMENTS = 3
    BAD_NAME = 10
    BAD_SIGNAL = 11
    FAILED = 30
    ALREADY_STARTED = 60
    NOT_RUNNING = 70
def _rfc3339(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
def micro(t):
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
def call(sock, name):
    sock.send({"command": name, "args": {}})
    importlib.import_module("podvisor.services.runtime.main")
    importlib.import_module("grpc._common")
def row(p):
    spec = {"command": ["sh"], "args": [], "image": "x"}  # not a request
    return {"name": p, "uptime": 1, "heartbeatAge": 0, "since": 0,
            "lastExit": {"signame": None, "ranFor": 0}}
''', encoding="utf-8")
    return tmp_path


def test_the_counter_finds_each_kind_of_copy(planted: Path) -> None:
    found = {what: len(where) for what, where in duplicates(planted).items()}
    assert found == {"rfc3339 helpers": 2, "CRI label keys": 1, "process states": 1,
                     "faults": 1, "control clients": 1, "status row": 1, "last exit": 1}
    assert dynamic_imports(planted) == ["services/copies.py:21 import_module"]


if __name__ == "__main__":
    counts = {what: len(where) for what, where in duplicates().items()}
    counts["imports by name outside the registry"] = len(dynamic_imports())
    for what, count in counts.items():
        print(f"duplicate definitions of {what}: {count}" if "imports" not in what
              else f"{what}: {count}")
    sys.exit(1 if any(counts.values()) else 0)
