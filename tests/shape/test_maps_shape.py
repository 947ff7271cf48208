"""Issue 23's shape counts for the replicated maps, by AST over the packages (``supervisor``,
``ipc``, ``common``, ``services``): both must be 0.

- ``get_chains``: ``.get(...)`` called on the result of another ``.get(...)``, directly or
  through ``or`` (``d.get("a", {}).get("b")``, ``(d.get("a") or {}).get("b")``): walking an
  untyped dict instead of reading a typed value.
- ``raw_map_sites``: a map owner or replica (``MapOwner(...)``, ``MapReplica(...)``,
  ``loop.owner(...)``, ``loop.replica(...)``) whose map is not one of the ``MapSpec``s declared
  in ``ipc/maps.py`` (a bare name, a string, a value the counter cannot trace to a spec), or
  that brings its own codec (``encode=``/``decode=``: typing as an opt-in of the call site).
  The map argument is traced through module aliases (``MAP_NAME = STATUSES``), parameters
  annotated ``MapSpec[...]``, local assignments and loops over tuples of specs.

Run as a script to print the counts and the sites: ``python tests/shape/test_maps_shape.py
[ROOT]`` (ROOT: a checkout, by default this one).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("supervisor", "ipc", "common", "services")
MAPS_MODULE = ("ipc", "maps.py")
# the constructors and ServiceLoop methods that make an owner or a replica, and where their
# map argument is (positional index; or the keyword ``spec``)
MAP_CALLS = {"MapOwner": 3, "MapReplica": 2, "owner": 1, "replica": 0}
CODEC_KEYWORDS = ("encode", "decode")


@dataclass(frozen=True)
class Site:
    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def _modules(root: Path) -> Iterator[tuple[str, ast.Module, str]]:
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            yield str(path.relative_to(root)), ast.parse(source), source


def _is_get(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get")


def _chained(node: ast.AST) -> bool:
    """``node`` is a ``.get`` call whose receiver is a ``.get`` call (or ``<get> or ...``)."""
    if not _is_get(node):
        return False
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    receiver = node.func.value
    if isinstance(receiver, ast.BoolOp) and isinstance(receiver.op, ast.Or):
        receiver = receiver.values[0]
    return _is_get(receiver)


def chains_in(tree: ast.AST, source: str, path: str = "<source>") -> list[Site]:
    return [Site(path, n.lineno, (ast.get_source_segment(source, n) or "").split("\n")[0])
            for n in ast.walk(tree) if _chained(n)]


def get_chains(root: Path = ROOT) -> list[Site]:
    return [site for path, tree, source in _modules(root) for site in chains_in(tree, source, path)]


def declared_specs(root: Path = ROOT) -> tuple[set[str], set[str]]:
    """(names, functions) of ``ipc/maps.py``: module-level names bound to a ``MapSpec`` (by a
    ``MapSpec(...)`` call or a ``MapSpec[...]`` annotation) and functions returning one."""
    path = root.joinpath(*MAPS_MODULE)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    functions: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                ast.unparse(node.annotation).startswith("MapSpec["):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                ast.unparse(node.value.func) == "MapSpec":
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.FunctionDef) and node.returns is not None and \
                ast.unparse(node.returns).startswith("MapSpec"):
            functions.add(node.name)
    return names, functions


class _Scope:
    """What a name in one module (and one function of it) may be bound to."""

    def __init__(self, tree: ast.Module, specs: set[str], spec_functions: set[str]) -> None:
        self.specs, self.spec_functions = set(), set()
        self.module: dict[str, list[ast.expr]] = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == "podvisor.ipc.maps":
                for alias in node.names:
                    local = alias.asname or alias.name
                    if alias.name in specs:
                        self.specs.add(local)
                    if alias.name in spec_functions:
                        self.spec_functions.add(local)
        _bindings(tree.body, self.module, top=True)

    def resolves(self, expr: ast.expr, local: dict[str, list[ast.expr]],
                 params: set[str], depth: int = 0) -> bool:
        if depth > 8:
            return False
        if isinstance(expr, ast.Call):
            return isinstance(expr.func, ast.Name) and expr.func.id in self.spec_functions
        if isinstance(expr, ast.Tuple | ast.List):
            return bool(expr.elts) and all(self.resolves(e, local, params, depth + 1)
                                           for e in expr.elts)
        if isinstance(expr, ast.Starred):
            return self.resolves(expr.value, local, params, depth + 1)
        if not isinstance(expr, ast.Name):
            return False
        name = expr.id
        if name in params or name in self.specs:
            return True
        bound = local.get(name) or self.module.get(name)
        return bool(bound) and all(self.resolves(b, local, params, depth + 1) for b in bound)



def _bindings(body: list[ast.stmt] | list[ast.AST], out: dict[str, list[ast.expr]],
              top: bool = False) -> None:
    """Names bound in ``body`` to the expressions they come from; a loop or comprehension
    target is bound to the items of what it iterates (recorded as the iterable)."""
    nodes: list[ast.AST] = list(body) if top else [n for b in body for n in ast.walk(b)]
    for node in nodes:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                node.value is not None:
            out.setdefault(node.target.id, []).append(node.value)
        elif isinstance(node, ast.For | ast.comprehension) and isinstance(node.target, ast.Name):
            out.setdefault(node.target.id, []).append(node.iter)


def _map_calls(tree: ast.AST) -> Iterator[tuple[ast.Call, ast.expr | None, bool]]:
    """Every owner/replica call: (call, its map argument, whether it brings a codec)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else (
            func.attr if isinstance(func, ast.Attribute) else "")
        if name not in MAP_CALLS or (name in ("owner", "replica")
                                     and not isinstance(func, ast.Attribute)):
            continue
        index = MAP_CALLS[name]
        arg = node.args[index] if len(node.args) > index else next(
            (k.value for k in node.keywords if k.arg in ("spec", "map_name")), None)
        codec = any(k.arg in CODEC_KEYWORDS for k in node.keywords)
        yield node, arg, codec


def raw_sites_in(tree: ast.Module, source: str, specs: set[str], spec_functions: set[str],
                 path: str = "<source>") -> list[Site]:
    scope = _Scope(tree, specs, spec_functions)
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    out = []
    for call, arg, codec in _map_calls(tree):
        local: dict[str, list[ast.expr]] = {}
        params: set[str] = set()
        node: ast.AST = call
        while node in parents:  # every enclosing function: its bindings and typed parameters
            node = parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                _bindings([node], local)
                for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                    if a.annotation is not None and \
                            ast.unparse(a.annotation).startswith("MapSpec["):
                        params.add(a.arg)
        if codec or arg is None or not scope.resolves(arg, local, params):
            text = (ast.get_source_segment(source, call) or "").split("\n")[0]
            out.append(Site(path, call.lineno, text))
    return out


def raw_map_sites(root: Path = ROOT) -> list[Site]:
    specs, functions = declared_specs(root)
    return [site for path, tree, source in _modules(root)
            for site in raw_sites_in(tree, source, specs, functions, path)]


# --- the counter counts real occurrences ---------------------------------------------------
def test_the_counters_see_what_they_count() -> None:
    """Known shapes, counted or not: the zero below is not a counter that sees nothing."""
    def chains(text: str) -> int:
        return len(chains_in(ast.parse(text), text))

    assert chains('a.get("x", {}).get("y")') == 1
    assert chains('(a.get("x") or {}).get("y", 0)') == 1
    assert chains('((a or {}).get("x") or {}).get("y")') == 1
    assert chains('a.get("x").get("y").get("z")') == 2
    assert chains('a.get("x") or b.get("y")') == 0
    assert chains('d = a.get("x")\nd.get("y")') == 0  # one at a time: not counted by AST

    specs, functions = {"DESIRED", "PLEG"}, {"pods_map"}

    def raw(text: str) -> int:
        return len(raw_sites_in(ast.parse(text), text, specs, functions))

    imports = "from podvisor.ipc.maps import DESIRED, PLEG, pods_map\n"
    assert raw('loop.replica("desired")') == 1
    assert raw("MapReplica(z, p, DESIRED)") == 1  # not imported from ipc.maps
    assert raw(imports + "MapReplica(z, p, DESIRED, decode=f)") == 1  # its own codec
    assert raw(imports + "MapOwner(z, p, pub, name)") == 1
    assert raw(imports + "loop.replica(DESIRED)\nloop.owner(pub, PLEG)") == 0
    assert raw(imports + "MAP = PLEG\ndef f(loop):\n    return loop.owner(pub, MAP)") == 0
    assert raw(imports + "[loop.replica(pods_map(s)) for s in sources]") == 0
    assert raw(imports + "for n in (DESIRED, 'pleg'):\n    loop.replica(n)") == 1
    assert raw(imports + "specs = (DESIRED, PLEG)\nfor n in specs:\n    loop.replica(n)") == 0
    assert raw("def f(z, p, spec: MapSpec[T]):\n    MapReplica(z, p, spec)") == 0
    assert raw("def f(z, p, name: str):\n    MapReplica(z, p, name)") == 1


def test_the_maps_module_declares_every_spec() -> None:
    specs, functions = declared_specs()
    assert {"DESIRED", "PLEG", "PROBES", "STATUSES", "API_MIRRORS"} <= specs
    assert {"pods_map", "declared"} <= functions


# --- the counts -----------------------------------------------------------------------------
def test_no_get_chains_in_the_packages() -> None:
    sites = get_chains()
    print(f"\n.get(...).get( chains: {len(sites)}")
    assert not sites, "\n".join(map(str, sites))


def test_no_map_is_read_or_written_without_its_spec() -> None:
    sites = raw_map_sites()
    print(f"\nmap owners/replicas without their MapSpec: {len(sites)}")
    assert not sites, "\n".join(map(str, sites))


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for title, found in ((".get(...).get( chains", get_chains(root)),
                         ("map owners/replicas without their MapSpec", raw_map_sites(root))):
        print(f"{title}: {len(found)}")
        for site in found:
            print(f"  {site}")
