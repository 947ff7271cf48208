"""``Node``: a private podvisor agent for a test, and what a test does with it (issue 28).

    node = Node(NodeOptions())            # or the `podvisor_node` fixture (plugin.py)
    node.apply(MANIFEST)                  # a Pod manifest (YAML text, a dict or a file)
    node.wait_pod("web", "Ready")
    with node.fault("bus", "pleg", action="drop"):   # a partition of PLEG from the others
        node.kill_container("web")
        node.wait_pod("web", "Running", restarts=1)
    node.check()                          # nothing lost, nothing duplicated, no orphans
    node.close()                          # shutdown --pods; nothing of the run is left

The agent is ``podvisor run`` on a temp rootDir with a static pod directory (the manifests
``apply`` writes), the embedded runtime (or ``NodeOptions.runtime``, e.g. containerd's socket),
a read-only port on 127.0.0.1 for ``/pods``, a 3 s heartbeat timeout (a hung subsystem is
replaced within seconds) and a 10 s pod resync (``syncFrequency``; the kubelet's 1 m would make
a test of a partitioned PLEG wait a minute for the sync loop to notice a death by itself).
Every container ``apply`` writes carries ``PODVISOR_TESTING=<run>/<pod>/<container>`` in its
environment, so the node finds its processes in the kernel's process
table (not through the agent it is testing): that is how it counts duplicates and orphans and
kills a container. A command exec'd in a container (an exec probe, a hook, ``kubectl exec``)
runs with the container's environment, so it carries the marker too while it runs, beside the
container's own process: a container counts as running twice only when no look within
``DUPLICATE_SETTLE`` seconds finds it with one process (a probe's command is gone after its
timeout; a second copy of the container stays). Faults go through the agent's control
endpoint, as ``podvisorctl fault`` sends them, and are recorded as its events.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import tempfile
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from podvisor.ipc.control import ControlFault
from podvisor.ipc.faults import API_PROCESSES, API_TARGET, ActiveFault, FaultSpecError
from podvisor.ipc.maps import MapValueError, PodStatus
from podvisor.testing.agent import AgentProcess, processes_of_root, wait_until
from podvisor.testing.invariants import InvariantError, InvariantReport

__all__ = ["MARKER", "Node", "NodeOptions"]

MARKER = "PODVISOR_TESTING"
DUPLICATE_SETTLE = 15.0  # seconds: an exec'd command (a probe's: 1 s timeout) has ended by then
STATES = ("Running", "Ready", "Pending", "Succeeded", "Failed", "Gone")
_runs = itertools.count(1)


@dataclass(frozen=True)
class NodeOptions:
    """How the node's agent runs. ``runtime``: ``embedded`` or a CRI endpoint
    (``unix:///run/containerd/containerd.sock``), reached through the agent's CRI proxy
    (``criProxy``, so that ``cri`` faults apply to it) unless ``cri_proxy`` is False;
    ``kubeconfig``: an API server to join (pods then also come from it); ``config``: more
    config keys (KubeletConfiguration names), merged over the node's own."""

    runtime: str = "embedded"
    cri_proxy: bool = True
    kubeconfig: str | None = None
    node_name: str = "testnode"
    config: Mapping[str, Any] = field(default_factory=dict)
    start_timeout: float = 60.0
    keep: bool = False  # keep the temp dir (logs, state) after close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(pod: Mapping[str, Any]) -> PodStatus:
    try:
        return PodStatus.from_dict(pod.get("status") or {})
    except MapValueError:
        return PodStatus()


def _describe(pid: int) -> str:
    """A process for a report: its command line and its parent's."""
    try:
        proc = psutil.Process(pid)
        parent = proc.parent()
        return (f"{pid}: {' '.join(proc.cmdline())[:120]} <- "
                f"{parent.pid if parent else '?'} "
                f"{' '.join(parent.cmdline())[:80] if parent else ''}")
    except psutil.Error:
        return f"{pid}: gone"


def _in_state(pod: Mapping[str, Any] | None, state: str) -> bool:
    if state == "Gone":
        return pod is None
    if pod is None:
        return False
    status = _status(pod)
    if state == "Running":
        cs = status.container_statuses
        return bool(cs) and all(c.state.running is not None for c in cs)
    if state == "Ready":
        ready = status.condition("Ready")
        return ready is not None and ready.true
    return status.phase == state


class Node:
    """A private agent and its pods. One thread (the test's)."""

    def __init__(self, options: NodeOptions | None = None) -> None:
        self.options = opts = options or NodeOptions()
        self.workdir = Path(tempfile.mkdtemp(prefix="pvnode", dir="/tmp"))  # short socket paths
        self.manifests = self.workdir / "manifests"
        self.manifests.mkdir()
        self.port = _free_port()
        self.token = f"{os.getpid()}-{next(_runs)}"
        self.applied: dict[str, Path] = {}  # pod name -> its manifest
        self.expected: set[str] = set()  # the pods that must run: applied, or marked for an API
        self.removed: set[str] = set()
        self.kills: Counter[str] = Counter()  # pod name -> container kills through the node
        self.left_behind: list[str] = []  # what close() found alive and killed
        config: dict[str, Any] = {
            "nodeName": opts.node_name, "staticPodPath": str(self.manifests),
            "fileCheckFrequency": "1s", "readOnlyPort": self.port, "address": "127.0.0.1",
            "port": 0, "opsPort": 0, "runtimeEndpoint": opts.runtime, "syncFrequency": "10s",
            "supervision": {"heartbeatInterval": "500ms",
                            "defaults": {"heartbeatTimeout": "3s", "intensity": 1000}},
        }
        if opts.kubeconfig:
            config["kubeconfig"] = opts.kubeconfig
        if opts.runtime != "embedded" and opts.cri_proxy:
            config["criProxy"] = True
        config.update(opts.config)
        self.agent = AgentProcess(self.workdir, config, env=dict(os.environ))
        self.paths = self.agent.paths
        try:
            self.wait_up(opts.start_timeout)
        except BaseException:
            self.close()
            raise

    # --- pods --------------------------------------------------------------------------

    def apply(self, manifest: str | Mapping[str, Any] | Path) -> str:
        """Run a Pod (YAML text, a dict or a file); returns its name. Applying a name again
        replaces that pod's manifest (the agent then runs the new spec)."""
        doc = self.marked(manifest)
        name = str(doc["metadata"]["name"])
        path = self.manifests / f"{name}.yaml"
        tmp = self.manifests / f".{name}.yaml.tmp"  # the file source skips dot names
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        tmp.replace(path)
        self.applied[name] = path
        return name

    def marked(self, manifest: str | Mapping[str, Any] | Path) -> dict[str, Any]:
        """The Pod manifest with the node's marker in each container's environment: what
        ``apply`` writes, and what a test creates in its API server (``kubeconfig``) so that
        the node counts that pod's processes too (``container_pids``, ``check``)."""
        if isinstance(manifest, Path):
            manifest = manifest.read_text(encoding="utf-8")
        doc = yaml.safe_load(manifest) if isinstance(manifest, str) else dict(manifest)
        if not isinstance(doc, dict) or doc.get("kind", "Pod") != "Pod":
            raise ValueError("takes one Pod manifest")
        meta = doc.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name:
            raise ValueError("the pod needs metadata.name")
        spec = doc.get("spec") or {}
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            env = [e for e in c.get("env") or [] if e.get("name") != MARKER]
            c["env"] = [*env, {"name": MARKER, "value": f"{self.token}/{name}/{c.get('name')}"}]
        self.expected.add(name)
        self.removed.discard(name)
        return doc

    def remove(self, name: str, wait: bool = True, timeout: float = 60.0) -> None:
        """Remove the pod (a pod from an API server: the test deleted it there); with
        ``wait``, until it left /pods and no process of it runs."""
        path = self.applied.pop(name, None)
        if path is not None:
            path.unlink(missing_ok=True)
        self.expected.discard(name)
        self.removed.add(name)
        if wait:
            self.wait_pod(name, "Gone", timeout)
            wait_until(lambda: not self.container_pids(name), timeout, 0.1,
                       f"the processes of pod {name} to end")

    def pods(self) -> dict[str, dict[str, Any]]:
        """``GET /pods`` by pod name (without the node's suffix); {} while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/pods", timeout=5) as r:
                doc = json.loads(r.read().decode())
        except (urllib.error.URLError, OSError, ValueError):
            return {}
        suffix = f"-{self.options.node_name}"
        return {p["metadata"]["name"].removesuffix(suffix): p for p in doc.get("items", [])}

    def pod(self, name: str) -> dict[str, Any] | None:
        return self.pods().get(name)

    def restarts(self, name: str) -> int:
        pod = self.pod(name)
        return 0 if pod is None else sum(c.restart_count
                                         for c in _status(pod).container_statuses)

    def wait_pod(self, name: str, state: str = "Running", timeout: float = 60.0,
                 restarts: int | None = None) -> dict[str, Any] | None:
        """Wait until pod ``name`` is in ``state`` (Running: every container running; Ready;
        a phase: Pending, Succeeded, Failed; Gone: not in /pods), and with ``restarts``
        container restarts in all when given. Returns the pod (None for Gone)."""
        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}")

        def check() -> bool:
            self._agent_alive()
            pod = self.pod(name)
            return _in_state(pod, state) and (restarts is None or pod is None or sum(
                c.restart_count for c in _status(pod).container_statuses) >= restarts)
        wait_until(check, timeout, 0.1, f"pod {name} {state}"
                   + (f" with {restarts} restarts" if restarts is not None else ""))
        return self.pod(name)

    # --- containers, through the process table ----------------------------------------------

    def _marked(self) -> dict[str, list[int]]:
        """``pod/container`` -> the top processes of each marked container (children of a
        container's process carry its marker too: only those whose parent does not count)."""
        prefix = f"{self.token}/"
        env_of: dict[int, str] = {}
        for proc in psutil.process_iter(["ppid"]):
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                value = proc.environ().get(MARKER, "")
            except psutil.Error:
                continue
            if value.startswith(prefix):
                env_of[proc.pid] = value
        out: dict[str, list[int]] = {}
        for pid, value in env_of.items():
            with contextlib.suppress(psutil.Error):
                if env_of.get(psutil.Process(pid).ppid()) != value:
                    out.setdefault(value[len(prefix):], []).append(pid)
        return out

    def duplicates(self) -> dict[str, list[int]]:
        """``pod/container`` -> its processes, for the applied pods' containers with more than
        one."""
        return {key: pids for key, pids in self._marked().items()
                if key.split("/")[0] in self.expected and len(pids) > 1}

    def container_pids(self, name: str, container: str | None = None) -> list[int]:
        """The live processes of pod ``name``'s containers (one per container that runs)."""
        return sorted(pid for key, pids in self._marked().items() for pid in pids
                      if key.split("/")[0] == name
                      and (container is None or key.split("/")[1] == container))

    def kill_container(self, name: str, container: str | None = None,
                       sig: signal.Signals = signal.SIGKILL) -> int:
        """Kill a container's process (the first container without ``container``), as the
        kernel's OOM killer or a crash would; returns its pid. The restart that follows is
        expected by ``check()``."""
        pids = self.container_pids(name, container)
        if not pids:
            raise LookupError(f"no running container of pod {name}"
                              + (f" named {container}" if container else ""))
        self.kills[name] += 1
        os.kill(pids[0], sig)
        return pids[0]

    # --- the agent's processes ------------------------------------------------------------

    def processes(self) -> dict[str, dict[str, Any]]:
        """Every supervised process's status row (``podvisorctl status --json``), by name."""
        return self.agent.rows()

    def wait_up(self, timeout: float = 60.0) -> None:
        """Until every enabled subsystem is RUNNING and /pods answers."""
        def up() -> bool:
            self._agent_alive()
            rows = self.agent.rows()
            return bool(rows) and all(r["state"] == "RUNNING" for r in rows.values()
                                      if r["enabled"]) and self._pods_answer()
        wait_until(up, timeout, 0.1, "every subsystem RUNNING and /pods answering")

    def _pods_answer(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/pods", timeout=5):
                return True
        except (urllib.error.URLError, OSError):
            return False

    def _agent_alive(self) -> None:
        proc = self.agent.proc
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the agent exited {proc.returncode}:\n{self.agent.stderr()}")

    def kill(self, subsystem: str, sig: str = "KILL") -> ActiveFault:
        """Signal a subsystem (default kill -9): the supervisor restarts it."""
        return self.inject("kill", subsystem, signal=sig)

    def stop(self, subsystem: str, duration: float | None = None) -> ActiveFault:
        """SIGSTOP a subsystem (``cont`` or ``duration`` seconds later: SIGCONT). Held past
        its heartbeat timeout (3 s), the supervisor kills and replaces it."""
        return self.inject("stop", subsystem, duration=duration)

    def cont(self, subsystem: str) -> None:
        """SIGCONT a subsystem stopped by ``stop``."""
        for fault in self.faults():
            if fault.spec.kind == "stop" and fault.spec.target == subsystem:
                self.clear(fault)

    # --- faults -----------------------------------------------------------------------------

    def inject(self, kind: str, target: str, duration: float | None = None,
               wait: bool = True, **fields: Any) -> ActiveFault:
        """Inject a fault (``podvisorctl fault inject``: see the README's fault table);
        ``duration`` seconds ends it by itself, else it lasts until ``clear``. The agent
        answers once it has recorded the fault; a process applies it on its own loop's next
        turn. With ``wait`` (the default) a ``bus``, ``cri`` or ``api`` fault returns only
        once every process it is aimed at has applied it, so what the test does next meets
        it."""
        args = {"kind": kind, "target": target, **fields}
        if duration:
            args["for"] = float(duration)
        active = ActiveFault.from_wire(self.agent.call("fault-inject", **args))
        if wait:
            self._wait_applied(active, present=True)
        return active

    def clear(self, fault: ActiveFault | str | None = None,
              wait: bool = True) -> list[ActiveFault]:
        """End one fault (or its id), or every fault; with ``wait``, return once every
        process that had applied it has dropped it (or was restarted without it)."""
        fid = fault.id if isinstance(fault, ActiveFault) else fault
        rows = self.agent.rows()
        result = (self.agent.call("fault-clear", id=fid) if fid else
                  self.agent.call("fault-clear"))
        cleared = [ActiveFault.from_wire(f) for f in result["cleared"]]
        if wait:
            for active in cleared:
                self._wait_applied(active, present=False, pids={
                    name: row.get("pid") for name, row in rows.items()})
        return cleared

    def applied_faults(self, process: str) -> list[str] | None:
        """The fault ids ``process`` last said it applied (its ``faults.in_force`` log line,
        written once every part of it has them); None before its first such line."""
        said = self._faults_said(process)
        return said[-1] if said else None

    def _faults_said(self, process: str) -> list[list[str]]:
        """Every ``faults.in_force`` line of ``process``'s log, oldest first."""
        path = self.paths.logs_dir / f"{process}.log"
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        said = []
        for line in text.splitlines():
            if '"faults.in_force"' not in line:
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("event") == "faults.in_force":
                said.append([str(f) for f in doc.get("faults") or []])
        return said

    def _wait_applied(self, fault: ActiveFault, present: bool,
                      pids: Mapping[str, Any] | None = None, timeout: float = 30.0) -> None:
        """Wait until each process ``fault`` is aimed at has applied it (``present``) or
        dropped it. Only the kinds a process applies in its own loop (bus, cri, api); an api
        fault aimed at the API server is applied by every process with an API connection."""
        spec = fault.spec
        if spec.kind not in ("bus", "cri", "api"):
            return
        rows = self.agent.rows()
        names = ([n for n in API_PROCESSES if n in rows and rows[n].get("enabled")]
                 if spec.target == API_TARGET else [spec.target])
        for name in names:
            if not present and fault.id not in (self.applied_faults(name) or []):
                continue  # it never applied it: nothing to drop

            def done(name: str = name) -> bool:
                if present:  # applied at some point (a short fault may be over already)
                    return any(fault.id in ids for ids in self._faults_said(name))
                ids = self.applied_faults(name)
                row = self.agent.rows().get(name) or {}
                restarted = pids is not None and row.get("pid") not in (None, pids.get(name))
                return restarted or fault.id not in (ids or [])
            wait_until(done, timeout, 0.05,
                       f"{name} {'applying' if present else 'dropping'} fault {fault.id}")

    def faults(self) -> list[ActiveFault]:
        return [ActiveFault.from_wire(f) for f in self.agent.call("fault-list")["faults"]]

    @contextlib.contextmanager
    def fault(self, kind: str, target: str, **fields: Any) -> Iterator[ActiveFault]:
        """``with node.fault("cri", "runtime", action="latency", delay=0.5): ...``: in force
        inside the block, cleared when it ends (an expired one is left alone)."""
        active = self.inject(kind, target, **fields)
        try:
            yield active
        finally:
            with contextlib.suppress(ControlFault):
                if any(f.id == active.id for f in self.faults()):
                    self.clear(active)

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        """The agent's events (``podvisorctl events --json``'s items), oldest first."""
        items: list[dict[str, Any]] = self.agent.call("events")["items"]
        return [e for e in items if reason is None or e["reason"] == reason]

    # --- the invariants -----------------------------------------------------------------------

    def check(self, converge: float = 60.0, restarts_allowed: tuple[str, ...] = (),
              settle: float = DUPLICATE_SETTLE) -> None:
        """Wait (at most ``converge`` s) for the applied pods to run, then check: no pod lost,
        no container running twice, no restart beyond the containers the node killed (except
        the pods in ``restarts_allowed``, whose containers exit by themselves), no process of a
        removed pod left (a container with two processes at every look for ``settle`` s counts
        as running twice). Raises ``InvariantError`` with a readable report."""
        report = self.invariants(converge, restarts_allowed, settle)
        if not report.ok:
            raise InvariantError(report)

    def invariants(self, converge: float = 60.0, restarts_allowed: tuple[str, ...] = (),
                   settle: float = DUPLICATE_SETTLE) -> InvariantReport:
        def settled() -> bool:
            pods = self.pods()
            return all(_in_state(pods.get(n), "Running") for n in self.expected)
        with contextlib.suppress(AssertionError):
            wait_until(settled, converge, 0.2, "the applied pods running")
        with contextlib.suppress(AssertionError):  # an exec'd command beside a container ends
            wait_until(lambda: not self.duplicates(), settle, 0.1,
                       "one process per container")
        report = InvariantReport()
        pods = self.pods()
        for name in sorted(self.expected):
            pod = pods.get(name)
            if not _in_state(pod, "Running"):
                report.add("pods_lost", f"{name} {'missing' if pod is None else 'not running'}")
                continue
            restarts = sum(c.restart_count for c in _status(pod or {}).container_statuses)
            if restarts > self.kills[name] and name not in restarts_allowed:
                report.add("restarts_without_cause", f"{name}: {restarts} restarts, "
                           f"{self.kills[name]} kills", restarts - self.kills[name])
        for key, pids in sorted(self._marked().items()):
            if key.split("/")[0] not in self.expected:
                report.add("orphans", f"{key}: processes {pids} of a removed pod", len(pids))
        for key, pids in sorted(self.duplicates().items()):
            report.add("duplicate_containers", f"{key}: {len(pids)} processes {pids} "
                       f"({'; '.join(_describe(pid) for pid in pids)})", len(pids) - 1)
        if not report.ok:
            report.context = self.describe()
        return report

    def describe(self) -> list[str]:
        """What the node looks like now: for a failure's report."""
        lines = ["processes: " + ", ".join(f"{n} {r['state']} (restarts {r['restarts']})"
                                           for n, r in self.processes().items())]
        with contextlib.suppress(ControlFault, OSError, FaultSpecError):
            lines.append("faults in force: " + (", ".join(
                f"{f.id} {f.spec.describe()}" for f in self.faults()) or "none"))
        lines.append(f"agent log: {self.agent.stderr_path}; rootDir {self.paths.root}")
        return lines

    # --- the end --------------------------------------------------------------------------

    def close(self) -> None:
        """``podvisorctl shutdown --pods``; then whatever of the run is still alive (agent,
        monitors, containers) is killed by PID and listed in ``left_behind``."""
        with contextlib.suppress(OSError, ValueError):
            self.agent.shutdown_pods()
        self.agent.kill()
        self.agent.stop()
        for proc in processes_of_root(self.paths.root, (MARKER, f"{self.token}/")):
            with contextlib.suppress(psutil.Error):
                self.left_behind.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
                proc.kill()
        self.agent.remove_cgroup_root()
        if not self.options.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
