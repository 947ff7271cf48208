"""Hand-written loops: 0 (issue 23, "ServiceLoop runs every process's work").

A hand-written loop is a ``while`` statement in the code a service process runs (``ipc/``,
``common/``, ``services/``) whose condition or body sleeps or polls: it calls something named
``sleep``, ``wait``, ``wait_for``, ``join``, ``poll`` or ``select``, or passes ``timeout=``
(a call inside a nested function or class does not count for the loop around its definition;
a call counts for its innermost loop). Such work belongs to the service loop
(``common/service.py``: ``ServiceLoop`` for the main thread, ``loop.worker(step, stall=...)``
for a helper thread), which heartbeats, watches ``stop``, raises a helper's failure or stall and
runs on the injected clock. The places that legitimately block are listed in ``LEGITIMATE``,
each with its reason; every other such loop is counted, and the count must be 0.

    python tests/shape/test_loops_shape.py [ROOT]    # prints each loop found and the count

(``ROOT``: a checkout's ``ipc``, ``common`` and ``services``, default this one. On main at
8da6413, before issue 23's step 3, it printed 9: the runtime's heartbeat loop, server's and ops'
sleep when disabled, the node, events-api and status-api helper threads, the HTTP source's and
RunOnce's heartbeat-while-a-thread-runs loops, the standalone runtime's wait.)
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("ipc", "common", "services")
THE_LOOP = "common/service.py"  # the service loop and its workers: where loops live
BLOCKING = frozenset({"sleep", "wait", "wait_for", "join", "poll", "select"})

# "path::qualified function name" -> why that function's loop is not a hand-written service loop
LEGITIMATE: dict[str, str] = {
    # primitives that block by contract; the loops call them without waiting
    "ipc/bus.py::Subscriber.recv":
        "the bus's receive with a timeout (a primitive: every service loop calls it with 0)",
    "ipc/clone.py::MapReplica.sync":
        "the one-shot blocking wait for a map's snapshot, outside any loop (podvisorctl)",
    "common/child.py::ChildContext.sleep":
        "the waiting primitive of a plain custom process (supervision.processes modules that "
        "do not use ServiceLoop); no built-in calls it",
    "services/sources/watcher.py::_InotifyWatcher.wait":
        "coalesces a burst of inotify events (reads of the inotify fd, bounded by the burst "
        "limit) inside the file source's read step",
    # threads whose job is one blocking read of a long-lived stream; the wait is the reconnect
    # back-off, cut short by their stop; results reach the service loop through a wake pipe
    "services/apiserver/reflector.py::Reflector._run":
        "list+watch of the API server: blocks on the watch stream up to apiWatchTimeout",
    "services/pleg/stream.py::EventWatcher._run":
        "reads the runtime's GetContainerEvents stream, reconnecting with back-off",
    "services/runtime/watcher.py::ExitWatcher._loop":
        "blocks in epoll on the containers' pidfds (no timeout: event-driven)",
    # requests that follow something on the web or streaming server's event loop
    "services/server/containerlogs.py::serve_logs":
        "kubectl logs --follow: a log file has no readiness to wait on (asyncio.sleep between "
        "reads, on the server's event loop, until the client goes)",
    "services/ops/logtail.py::_stream":
        "supervisord's tail -f over HTTP: the same follow of a log file",
    "services/ops/dashboard.py::Dashboard.events":
        "the dashboard's server-sent events: a coroutine per open page on the web thread, "
        "writing what its queue receives (a beat comment when asked and quiet)",
    # the fleet (`podvisor fleet`): a program of its own on one asyncio loop, not a supervised
    # subsystem (no heartbeat, no ServiceLoop); its tasks are the asyncio equivalent
    "services/fleet/link.py::NodeLink.run":
        "the fleet's task per node: follow the node's feed, reconnect a second after it ends",
    "services/fleet/link.py::NodeLink._follow":
        "reads one node's server-sent events line by line (the socket read is the wait)",
    "services/fleet/main.py::_relist":
        "the fleet's task listing the cluster's Nodes every `relist` seconds (kubeconfig only)",
    "services/fleet/server.py::Fleet.broadcast":
        "the fleet page's feed: one task while pages are open, woken by a node's change",
    "services/runtime/stream_attach.py::follow":
        "attach: the same follow of the container's log file, on the streaming server",
    "services/ops/rpc_control.py::ControlMethods._start_container":
        "XML-RPC startProcess(wait=True) waits (bounded) on the condition the ops loop "
        "notifies, on a request thread",
    # other processes than the subsystems: not run by a service loop
    "services/runtime/zygote.py::serve":
        "the runtime's zygote (its own process): blocks on its socket for fork requests",
    "services/runtime/monitor.py::_pump":
        "a container's monitor (its own process): polls the container's pipes and pidfd",
    "services/runtime/engine.py::Engine.reopen_log":
        "ReopenContainerLog waits (at most 2 s) for the container's monitor, another process, "
        "to recreate the log file: no fd to wait on",
    "services/runtime/engine.py::Engine._settle":
        "a restarted runtime waits (at most SETTLE_TIMEOUT) for each start in flight to be "
        "recorded, or its monitor gone, before it serves: another process's file, no fd to wait "
        "on",
}


@dataclass(frozen=True)
class Loop:
    path: str
    line: int
    function: str

    @property
    def key(self) -> str:
        return f"{self.path}::{self.function}"

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.function}"


def _blocks(call: ast.Call) -> bool:
    func = call.func
    name = (func.attr if isinstance(func, ast.Attribute)
            else func.id if isinstance(func, ast.Name) else "")
    return name in BLOCKING or any(k.arg == "timeout" for k in call.keywords)


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.scope: list[str] = []
        self.whiles: list[ast.While] = []
        self.found: dict[int, Loop] = {}

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
                  name: str | None) -> None:
        outer, self.whiles = self.whiles, []
        if name is not None:
            self.scope.append(name)
        self.generic_visit(node)
        if name is not None:
            self.scope.pop()
        self.whiles = outer

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node, node.name)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node, node.name)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._function(node, None)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        outer, self.whiles = self.whiles, []
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()
        self.whiles = outer

    def visit_While(self, node: ast.While) -> None:
        self.whiles.append(node)
        self.generic_visit(node)
        self.whiles.pop()

    def visit_Call(self, node: ast.Call) -> None:
        if self.whiles and _blocks(node):
            loop = self.whiles[-1]
            self.found[loop.lineno] = Loop(self.path, loop.lineno,
                                           ".".join(self.scope) or "<module>")
        self.generic_visit(node)


def sleeping_loops(root: Path = ROOT) -> Iterator[Loop]:
    """Every ``while`` loop that sleeps or polls, outside the service loop itself."""
    for top in SCANNED:
        for file in sorted((root / top).rglob("*.py")):
            path = file.relative_to(root).as_posix()
            if path == THE_LOOP:
                continue
            finder = _Finder(path)
            finder.visit(ast.parse(file.read_text(encoding="utf-8"), filename=path))
            yield from sorted(finder.found.values(), key=lambda loop: loop.line)


def hand_written_loops(root: Path = ROOT) -> list[Loop]:
    """The loops that sleep or poll and are not in ``LEGITIMATE``."""
    return [loop for loop in sleeping_loops(root) if loop.key not in LEGITIMATE]


def test_no_hand_written_loops() -> None:
    assert [str(loop) for loop in hand_written_loops()] == []


def test_every_legitimate_entry_names_a_loop_that_is_there() -> None:
    """An entry outlives its loop only by mistake: remove it with the loop."""
    present = {loop.key for loop in sleeping_loops()}
    assert sorted(set(LEGITIMATE) - present) == []


def test_the_counter_sees_the_shapes_it_counts(tmp_path: Path) -> None:
    """The counter itself: a helper thread's loop (the node process had one), a disabled
    process sleeping (server and ops had one) and a heartbeat loop (the runtime had one) count;
    a drain loop, a loop in a function defined inside another loop, and the service loop do
    not."""
    (tmp_path / "services" / "x").mkdir(parents=True)
    (tmp_path / "services" / "x" / "main.py").write_text(
        "def helper(stop, agent):\n"
        "    while not stop.is_set():\n"
        "        agent.renew()\n"
        "        stop.wait(10)\n"
        "def disabled(ctx):\n"
        "    while not ctx.sleep(3600):\n"
        "        pass\n"
        "def heartbeat(ctx):\n"
        "    while not ctx.stop.is_set():\n"
        "        ctx.heartbeat()\n"
        "        ctx.stop.wait(1.0)\n"
        "def drain(sub):\n"
        "    while (env := sub.recv(0)) is not None:\n"
        "        handle(env)\n"
        "    while True:\n"
        "        def later():\n"
        "            time.sleep(1)\n"
        "        break\n"
        "class W:\n"
        "    def run(self):\n"
        "        while self.q.get(timeout=1.0):\n"
        "            pass\n", encoding="utf-8")
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "service.py").write_text(
        "def run(loop):\n    while True:\n        loop.poll(1)\n", encoding="utf-8")
    found = [str(loop) for loop in hand_written_loops(tmp_path)]
    assert found == ["services/x/main.py:2 helper", "services/x/main.py:6 disabled",
                     "services/x/main.py:9 heartbeat", "services/x/main.py:21 W.run"]


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve() if argv else ROOT
    loops = hand_written_loops(root)
    for loop in loops:
        print(loop)
    print(f"hand-written loops: {len(loops)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
