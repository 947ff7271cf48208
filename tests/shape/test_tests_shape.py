"""The suite's shape (issue 23, step 4): tests laid out like the code, one fake clock, one fake
``ChildContext``.

The rule (tests/conftest.py, "Layout"; docs/ARCHITECTURE.md, "Tests"): a test of the code in
folder ``F`` of the repository lives in ``tests/F/`` (``tests/services/pleg/`` for
``services/pleg/``, ``tests/cli/`` for ``cli/``, ``tests/deploy/containerd/`` for
``deploy/containerd/``), end-to-end tests included: they go to the folder of the code that owns
the behaviour they assert, named ``test_e2e_*.py``. Besides the mirror, only ``tests/support/``
(helpers shared by several folders' tests, and the tests of those helpers and of
``tests/conftest.py``) and ``tests/shape/`` (checks over the whole repository). Reading the tree
only (nothing is imported):

- ``misplaced(root)``: every test file (``test_*.py``, ``*_test.py``) whose folder mirrors no
  folder of code (a folder of the repository holding a file other than ``__init__.py``: so
  ``tests/services/`` itself holds none), and every helper module outside a mirrored folder
  (or below one), ``tests/support/`` and ``tests/shape/`` (``tests/conftest.py`` aside);
- ``hand_rolled_clocks(root)``: every class in ``tests/`` that is a clock of its own: named
  ``*Clock*``, having a clock's methods (``monotonic``, ``wall``, ``wall_ns``), or a
  ``__call__`` that returns a time it holds (``return self.now``). Use
  ``podvisor.common.FakeClock``; give it what it lacks;
- ``hand_built_contexts(root)``: every ``ChildContext(...)`` built in ``tests/``. Use
  ``podvisor.common.FakeChildContext``.

The tests assert none; ``python tests/shape/test_tests_shape.py`` prints them.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNMIRRORED = frozenset({"support", "shape"})  # the two folders of tests/ that mirror no code
CLOCK_METHODS = frozenset({"monotonic", "wall", "wall_ns"})
TIME_ATTRIBUTES = frozenset({"now", "t", "time", "ts", "when", "current"})
CLOCK_TRIGGER = re.compile(r"class \w*[Cc][Ll][Oo][Cc][Kk]|def (monotonic|wall|wall_ns|__call__)\(")
HINT = ("put it in tests/<the folder of the code whose behaviour it asserts>/, or a helper "
        "shared by several folders' tests in tests/support/ (tests/conftest.py, 'Layout')")


def _is_test_file(path: Path) -> bool:
    return path.name.startswith("test_") or path.name.endswith("_test.py")


def _python_files(root: Path) -> Iterator[Path]:
    for path in sorted((root / "tests").rglob("*.py")):
        if "__pycache__" not in path.parts:
            yield path


def _holds_code(folder: Path) -> bool:
    """A folder of code: it holds a file of its own (a package's ``__init__.py`` alone, like
    ``services/``, does not make one)."""
    return folder.is_dir() and any(
        p.is_file() and p.name != "__init__.py" for p in folder.iterdir())


def _in_repo(root: Path, rel: Path) -> bool:
    """``rel`` (a folder below ``tests/``) names a folder of the repository."""
    return bool(rel.parts) and not rel.parts[0].startswith(".") and rel.parts[0] != "tests" \
        and (root / rel).is_dir()


def misplaced(root: Path = REPO) -> list[str]:
    """Python files under ``tests/`` outside the layout, each with the reason."""
    tests = root / "tests"
    found = []
    for path in _python_files(root):
        rel = path.parent.relative_to(tests)
        where = path.relative_to(root)
        if rel.parts and rel.parts[0] in UNMIRRORED:
            continue
        if not rel.parts:
            if path.name != "conftest.py":
                found.append(f"{where}: tests/ itself holds conftest.py only; {HINT}")
        elif _is_test_file(path):
            if not (_in_repo(root, rel) and _holds_code(root / rel)):
                found.append(f"{where}: tests/{rel}/ mirrors no folder of code; {HINT}")
        elif not any(_in_repo(root, Path(*rel.parts[:n])) for n in range(1, len(rel.parts) + 1)):
            found.append(f"{where}: a helper outside the mirrored folders; {HINT}")
    return found


def _classes(root: Path) -> Iterator[tuple[Path, ast.ClassDef]]:
    """The classes of the test modules that could hold a clock (parsing only those keeps the
    check cheap)."""
    for path in _python_files(root):
        text = path.read_text(encoding="utf-8")
        if not CLOCK_TRIGGER.search(text):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                yield path.relative_to(root), node


def _returns_held_time(method: ast.FunctionDef) -> bool:
    """``def __call__(self) -> float: return self.now`` (a time it holds, moved by hand)."""
    body = [s for s in method.body if not isinstance(s, ast.Expr)]  # a docstring aside
    return len(method.args.args) == 1 and len(body) == 1 and isinstance(body[0], ast.Return) \
        and isinstance(value := body[0].value, ast.Attribute) \
        and isinstance(value.value, ast.Name) and value.value.id == "self" \
        and value.attr in TIME_ATTRIBUTES


def _why_a_clock(cls: ast.ClassDef) -> str:
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    if "clock" in cls.name.lower():
        return "named a clock"
    if CLOCK_METHODS & methods.keys():
        return f"has {', '.join(sorted(CLOCK_METHODS & methods.keys()))}"
    if "__call__" in methods and _returns_held_time(methods["__call__"]):
        return "returns a time it holds from __call__"
    return ""


def hand_rolled_clocks(root: Path = REPO) -> list[str]:
    return [f"{where}:{cls.lineno} class {cls.name} ({why}): use FakeClock"
            for where, cls in _classes(root) if (why := _why_a_clock(cls))]


def hand_built_contexts(root: Path = REPO) -> list[str]:
    found = []
    for path in _python_files(root):
        text = path.read_text(encoding="utf-8")
        if "ChildContext(" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else \
                    func.attr if isinstance(func, ast.Attribute) else ""
                if name == "ChildContext":
                    found.append(f"{path.relative_to(root)}:{node.lineno} ChildContext(...): "
                                 f"use FakeChildContext")
    return found


def test_every_test_file_sits_in_the_mirror_of_its_code() -> None:
    assert misplaced() == []


def test_no_test_rolls_its_own_clock() -> None:
    assert hand_rolled_clocks() == []


def test_no_test_builds_a_child_context_by_hand() -> None:
    assert hand_built_contexts() == []


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A small repository with one of each thing the checks look for, and their look-alikes."""
    for folder in ("services/pleg", "cli", "deploy/containerd"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "code.py").write_text("")
    (tmp_path / "services/__init__.py").write_text("")
    files = {
        "conftest.py": "",
        "test_at_the_root.py": "",
        "helper_at_the_root.py": "",
        "services/conftest.py": "",
        "services/test_services_itself.py": "",
        "services/pleg/test_relist.py": "",
        "services/pleg/procs/child.py": "",
        "cli/test_ctl.py": "",
        "deploy/containerd/test_setup.py": "",
        "pods/test_e2e_pods.py": "",
        "pods/lifecycle.py": "",
        "support/kubeapi/test_standin.py": "",
        "support/lifecycle.py": "",
        "shape/test_layout.py": "",
        "cli/test_clocks.py": '''
class ManualClock:
    def __init__(self): self.now = 0.0
class Ticker:
    def monotonic(self): return 0.0
class Held:
    def __call__(self):
        """the time"""
        return self.t
class Counter:  # a look-alike: counts calls
    def __call__(self):
        self.count += 1
class Value:  # a look-alike: returns a value, not a time
    def __call__(self):
        return self.value
ctx = ChildContext("t", config, paths, log, zctx)
ctx = common.ChildContext("t", config, paths, log, zctx)
ctx = FakeChildContext(paths)
''',
    }
    for name, text in files.items():
        path = tmp_path / "tests" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checks_find_what_they_look_for(planted: Path) -> None:
    assert [line.split(":")[0] for line in misplaced(planted)] == [
        "tests/helper_at_the_root.py", "tests/pods/lifecycle.py", "tests/pods/test_e2e_pods.py",
        "tests/services/test_services_itself.py", "tests/test_at_the_root.py"]
    assert [line.split(" (")[0].split(" ", 1)[1] for line in hand_rolled_clocks(planted)] == [
        "class ManualClock", "class Ticker", "class Held"]
    assert len(hand_built_contexts(planted)) == 2


if __name__ == "__main__":
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else REPO
    results = {"test files and helpers outside the layout": misplaced(root),
               "hand-rolled clocks": hand_rolled_clocks(root),
               "ChildContexts built by hand": hand_built_contexts(root)}
    for what, found in results.items():
        print(f"{what}: {len(found)}")
        for line in found:
            print(f"  {line}")
    sys.exit(1 if any(results.values()) else 0)
