"""`podvisor chaos`: fault injection against a private agent, with invariants (issue 16).

    podvisor chaos --pods P --duration S [--seed N] [--json] [--keep] [--root-dir DIR]
                   [--kubeconfig FILE]

Starts a private agent (`podvisor run`, temp rootDir, static pods from a temp staticPodPath,
embedded runtime, readOnlyPort on 127.0.0.1), writes P pods (`sleep`; every second one with an
exec readiness probe) and waits until all run (and the probed ones are Ready). Then, for S
seconds, one fault at a time at random (seeded) moments, each followed by waiting for recovery:

- ``kill``: kill -9 of a supervised subsystem (the runtime included);
- ``stop``: SIGSTOP of a subsystem for 0.2 s to heartbeatTimeout + 1 s, then SIGCONT (a hold past
  heartbeatTimeout makes the supervisor kill and restart it);
- ``container``: kill -9 of a container's process (each container at most once: the kubelet's
  crash back-off would otherwise delay the second restart by 10 s and more);
- ``supervisor``: SIGKILL of `podvisor run` itself (its children follow through PDEATHSIG;
  containers and their monitors live on), then `podvisor run` again on the same config;
- ``burst-kill``: ``--burst`` new pods written at once, and kill -9 of the runtime or the sync
  loop (``--burst-target``, else either, seeded) once the first of them run (``--burst-after``,
  else 1 to half the burst); then every burst pod must run exactly once with no restart
  counted, and once its manifests are removed no process of theirs may be left (issue 22);
- ``bus`` and ``cri`` (issue 28, ``chaos_faults.py``): injected through the agent's control
  endpoint as ``podvisorctl fault inject`` does, each ending by itself: a subsystem's bus
  traffic dropped (a partition), delayed or duplicated, with a container killed behind a
  partition of PLEG; the embedded runtime slowed, failing chosen methods, or hung (then it must
  be found hung and replaced); CPU pressure in a subsystem's cgroup (``resource``); with an API
  server (``--kubeconfig``: the private agent joins it as ``system:node:chaos``) an API outage,
  429/5xx answers, latency, cut watches or 410 Gone (``api``); a pod's emptyDir full or
  read-only inside its container (``disk``; the unprobed pods have one).

``--faults KIND,...`` draws only from those kinds; ``--rounds N`` stops after N faults (before
``--duration`` is over): ``--faults burst-kill --rounds 20 --burst 40 --burst-after 5
--burst-target runtime`` is issue 22's acceptance run.

With ``--root-dir DIR`` it attaches to the agent already running on that rootDir instead: the
control socket and bus come from DIR's run files, the static pod dir, node name, readOnlyPort and
the supervision limits from its ``run/config.json`` (the pods are read over readOnlyPort, or from
the map owners' snapshots when it is 0). Its pods (``chaos-<pid>-<i>``, unlikely to clash with
the user's) are written to the agent's staticPodPath and removed at the end. Against an agent it
did not start, chaos does NOT kill the supervisor: it could not restart it as its owner did (its
stdout, environment and parent are the owner's; a restart would make it chaos's child), so the
``supervisor`` fault is skipped and the report's notes say so. A subsystem is faulted at most
``intensity - 1`` times within its ``intensityPeriod``, so that the agent never gives it up
(FATAL). The agent is never stopped: ``processes_left`` counts chaos's containers still alive
after its manifests were removed and its pods left /pods.

Then it waits (bounded) for the pods to converge and checks the invariants, each a count that
must be 0 (exit status 1 otherwise):

- ``pods_lost``: pods not in /pods, or not running, at the end;
- ``restarts_without_cause``: container restarts (restartCount) beyond the kills of that
  container;
- ``restarts_missed``: container kills not followed by a restart;
- ``duplicate_containers``: the most extra live processes ever seen for one container (each
  container carries ``PODVISOR_CHAOS=<run>/<pod>/<container>`` in its environment, so the count
  comes from the kernel's process table, not from the agent);
- ``ready_lost_without_cause``: Ready pods seen NotReady in /pods with no kill of their
  container in the ``CAUSE_WINDOW`` before;
- ``processes_left``: processes of the run (containers, monitors, subsystems) still alive after
  `podvisorctl shutdown --pods` returned and the agent exited (they are then killed by PID);
- ``orphans_after_removal``: processes of burst pods still alive once their manifests were
  removed and the pods left /pods (then killed by PID). A burst pod's extra processes count in
  ``duplicate_containers``, its restarts in ``restarts_without_cause``;
- ``partition_death_missed``: a container killed while PLEG was partitioned and not started
  again within ``syncFrequency`` + 30 s (the sync loop must notice it without PLEG);
- ``cri_hang_not_replaced``: a hung runtime the supervisor did not replace;
- ``api_fault_restarts``: containers replaced during an api fault (an API outage must never
  restart a pod);
- ``disk_fault_damage``: a disk fault after which a file written into the emptyDir before it is
  gone, or the container was replaced.

Figures: recovery seconds per fault kind and subsystem (p50/max; ``kill``: from the kill to the
subsystem RUNNING again under a new PID; ``stop``: from SIGSTOP to RUNNING and not stopped;
``container``: from the kill to the replacement's process; ``supervisor``: from the kill to
every subsystem RUNNING and /pods answering; ``burst-kill``: from the kill to every burst pod
Running in /pods), and bus drops: gaps in the per-publisher sequence
numbers of every message a bus subscriber of the chaos run received (a lower bound: see
``BusCounter``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import zmq

from podvisor.cli.chaos_faults import fault_api, fault_bus, fault_cri, fault_disk, fault_resource
from podvisor.cli.ctl_pods import get_podlist
from podvisor.common.config import ConfigError, read_config_json
from podvisor.ipc.bus import Subscriber
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.control import AgentNotRunning, ControlClient
from podvisor.ipc.maps import MapValueError, PodStatus
from podvisor.ipc.paths import RunPaths
from podvisor.supervisor.registry import resolve_specs
from podvisor.testing.agent import AgentProcess, processes_of_root

__all__ = ["ChaosOptions", "main_chaos", "run_chaos"]

NODE = "chaos"
MARKER = "PODVISOR_CHAOS"
CAUSE_WINDOW = 20.0  # seconds after a container kill in which its pod may go NotReady
HEARTBEAT_TIMEOUT = 3.0  # the private agent's supervision.defaults.heartbeatTimeout
SYNC_FREQUENCY = 10.0  # the private agent's syncFrequency: a partitioned PLEG's death is found
RECOVERY_TIMEOUT = 60.0
CONVERGE_TIMEOUT = 90.0
INVARIANTS = ("pods_lost", "restarts_without_cause", "restarts_missed", "duplicate_containers",
              "ready_lost_without_cause", "processes_left", "orphans_after_removal",
              "partition_death_missed", "cri_hang_not_replaced", "api_fault_restarts",
              "disk_fault_damage")
FAULTS = (("kill", 4), ("stop", 2), ("container", 3), ("supervisor", 1), ("burst-kill", 2),
          ("bus", 2), ("cri", 2), ("resource", 1), ("api", 2), ("disk", 1))
BURST_TARGETS = ("runtime", "syncloop")
MANIFEST = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: host
    imagePullPolicy: IfNotPresent
    command: ["sleep", "1000000"]
    env:
    - name: {marker}
      value: "{token}/{name}/app"
{probe}{volume}"""
PROBE = """    readinessProbe:
      exec:
        command: ["true"]
      periodSeconds: 1
"""
SCRATCH = """    volumeMounts:
    - {name: scratch, mountPath: /pvchaos-scratch}
  volumes:
  - {name: scratch, emptyDir: {}}
"""

_monotonic = SYSTEM_CLOCK.monotonic  # the one clock (the tool's own timing: an edge)


@dataclass(frozen=True)
class ChaosOptions:
    pods: int = 20
    duration: float = 60.0
    seed: int | None = None
    keep: bool = False
    root_dir: Path | None = None  # attach to the agent running there instead of starting one
    faults: tuple[str, ...] = ()  # the kinds to draw from (empty: all of FAULTS)
    rounds: int = 0  # stop after this many faults (0: when the duration is over)
    burst: int = 10  # burst-kill: pods written at once
    burst_after: int = 0  # burst-kill: kill once this many run (0: 1 to burst / 2, seeded)
    burst_target: str = ""  # burst-kill: "runtime" or "syncloop" ("": either, seeded)
    kubeconfig: str = ""  # the private agent joins this API server (the api faults need one)


@dataclass
class Report:
    seed: int
    pods: int
    duration: float
    faults: Counter[str] = field(default_factory=Counter)
    invariants: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INVARIANTS, 0))
    recovery: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    bus_drops: int = 0
    bus_messages: int = 0
    details: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what this run did not do, and why
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and not any(self.invariants.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "seed": self.seed, "pods": self.pods, "duration": self.duration,
            "faults": dict(self.faults), "invariants": dict(self.invariants),
            "recovery": {k: {"n": len(v), "p50": round(statistics.median(v), 3),
                             "max": round(max(v), 3)}
                         for k, v in sorted(self.recovery.items()) if v},
            "busDrops": self.bus_drops, "busMessages": self.bus_messages,
            "details": self.details, "notes": self.notes, "error": self.error,
        }

    def text(self) -> str:
        doc = self.to_json()
        lines = [f"chaos: {self.pods} pods, {self.duration:g} s, seed {self.seed}: "
                 f"{'OK' if self.ok else 'FAILED'}",
                 "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))]
        lines += [f"  {k:26} {v}" for k, v in self.invariants.items()]
        lines.append("recovery (s):")
        lines += [f"  {k:26} p50 {v['p50']:.3f}  max {v['max']:.3f}  (n={v['n']})"
                  for k, v in doc["recovery"].items()]
        lines.append(f"bus: {self.bus_drops} dropped of {self.bus_messages} received")
        lines += [f"  ! {d}" for d in self.details]
        lines += [f"  note: {n}" for n in self.notes]
        if self.error:
            lines.append(f"error: {self.error}")
        return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class BusCounter:
    """Counts the messages a subscriber receives and the sequence numbers it never saw.

    Per source name, the sequence numbers seen since that source last restarted (a fault of
    ours); drops = the numbers missing between the lowest and the highest seen. A process may
    hold two publishers under one name (the sync loop's events go out on their own), whose
    sequences interleave: a number one of them skipped may be covered by the other, so this is
    a lower bound, never an overcount."""

    def __init__(self, paths: RunPaths) -> None:
        self.zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sub = Subscriber(self.zctx, paths, [""])
        self.seen: dict[str, set[int]] = defaultdict(set)
        self.lock = threading.Lock()
        self.closed_drops = 0  # from sources forgotten since
        self.messages = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="chaos-bus", daemon=True)
        self.thread.start()

    @staticmethod
    def _missing(seqs: set[int]) -> int:
        return max(seqs) - min(seqs) + 1 - len(seqs) if seqs else 0

    @property
    def drops(self) -> int:
        with self.lock:
            return self.closed_drops + sum(self._missing(s) for s in self.seen.values())

    def forget(self, source: str | None = None) -> None:
        """A publisher restarts (``None``: all of them): its next sequence starts anew."""
        with self.lock:
            for name in list(self.seen) if source is None else [source]:
                self.closed_drops += self._missing(self.seen.pop(name, set()))

    def _run(self) -> None:
        while not self.stop.is_set():
            env = self.sub.recv(timeout=0.2)
            if env is None:
                continue
            with self.lock:
                self.messages += 1
                self.seen[env.source].add(env.seq)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sub.close()
        self.zctx.destroy(linger=0)


class Deck:
    """Draws ``cards`` in a seeded shuffled order, reshuffling when it runs out; ``first``, if
    given, is the first deck instead (chaos's: each kind once, so a short run sees them all)."""

    def __init__(self, rng: random.Random, cards: list[str],
                 first: list[str] | None = None) -> None:
        self._rng = rng
        self._cards = list(cards)
        self._left: list[str] = list(first or [])
        rng.shuffle(self._left)

    def draw(self) -> str:
        if not self._left:
            self._left = list(self._cards)
            self._rng.shuffle(self._left)
        return self._left.pop()


@dataclass(frozen=True)
class Limits:
    """A subsystem's supervision limits that bound the faults chaos may inject into it."""

    heartbeat_timeout: float = HEARTBEAT_TIMEOUT
    intensity: int = 10000
    intensity_period: float = 60.0
    backoff_reset_after: float = 10.0


class Chaos:
    def __init__(self, opts: ChaosOptions, report: Report) -> None:
        self.opts = opts
        self.report = report
        self.rng = random.Random(report.seed)
        self.tmp = Path(tempfile.mkdtemp(prefix="pvchaos", dir="/tmp"))  # short socket paths
        self.token = f"{report.seed}-{os.getpid()}"
        self.config = self.tmp / "config.yaml"
        self.attached = opts.root_dir is not None
        self.limits: dict[str, Limits] = {}  # by subsystem; default Limits() when absent
        self.faulted: dict[str, list[float]] = defaultdict(list)  # subsystem -> fault times
        self.written: list[Path] = []  # manifests chaos wrote (removed at the end)
        self.attached_sync_frequency = SYNC_FREQUENCY
        self.api = bool(opts.kubeconfig)  # the agent talks to an API server: api faults
        if opts.root_dir is not None:
            try:
                self._attach(opts.root_dir)
            except RuntimeError:
                shutil.rmtree(self.tmp, ignore_errors=True)
                raise
        else:
            self.paths = RunPaths(self.tmp / "root")
            self.manifests = self.tmp / "manifests"
            self.manifests.mkdir()
            self.port = _free_port()
            self.address = "127.0.0.1"
            self.node = NODE
        # the agent: the plugin's core (podvisor.testing), started by run(); None attached
        self.agent: AgentProcess | None = None if self.attached else AgentProcess(
            self.tmp, {
                "rootDir": str(self.paths.root), "nodeName": NODE,
                "staticPodPath": str(self.manifests), "readOnlyPort": self.port,
                "stopPodsOnExit": False, "syncFrequency": f"{SYNC_FREQUENCY:g}s",
                # the ops port on a free port: the default (9001) may be another agent's, and
                # ops would crash-loop on it (then every fault's wait for the agent whole fails)
                "opsAddress": "127.0.0.1", "opsPort": _free_port(),
                "supervision": {"defaults": {"heartbeatTimeout": f"{HEARTBEAT_TIMEOUT:g}s",
                                             "intensity": 10000, "intensityPeriod": "60s"}},
                **({"kubeconfig": opts.kubeconfig} if opts.kubeconfig else {}),
            }, env=dict(os.environ), start=False, new_session=False)
        self.control = ControlClient(self.paths.control, timeout=5.0)
        prefix = f"chaos-{os.getpid()}-" if self.attached else "chaos"
        self.names = [f"{prefix}{i}" for i in range(opts.pods)]
        self.probed = {n for i, n in enumerate(self.names) if i % 2 == 0}
        self.scratch = set(self.names) - self.probed  # pods with an emptyDir (disk faults)
        self.prefix = prefix
        self.bursts = 0  # burst-kill rounds so far (their pods' names)
        self.kills: Counter[str] = Counter()  # pod name -> container kills
        self.last_kill: dict[str, float] = {}
        self.lock = threading.Lock()
        self.ready: dict[str, bool] = {}
        self.max_dupes = 0
        self.stop_sampling = threading.Event()
        self.sampler: threading.Thread | None = None
        self.bus: BusCounter | None = None
        self.bus_deck = Deck(self.rng, ["partition-pleg", "drop", "delay", "duplicate"])
        self.cri_deck = Deck(self.rng, ["hang", "latency", "error"])
        self.api_deck = Deck(self.rng, ["outage", "error", "latency", "disconnect", "gone"])
        self.disk_deck = Deck(self.rng, ["full", "readonly", "rootDir full", "rootDir readonly"])

    # --- the agent -------------------------------------------------------------------------

    def _attach(self, root: Path) -> None:
        """Endpoints, static pod dir and limits of the agent running on ``root``."""
        self.paths = RunPaths(root)
        try:
            config = read_config_json(self.paths.config_json)
        except (OSError, ValueError, ConfigError) as err:
            raise RuntimeError(f"no agent's run/config.json under {root} ({err}): is an agent "
                               "running with this rootDir?") from err
        if not config.static_pod_path or not Path(config.static_pod_path).is_dir():
            raise RuntimeError(f"the agent under {root} has no staticPodPath directory "
                               f"({config.static_pod_path or 'unset'}): chaos puts its pods "
                               "there")
        self.manifests = Path(config.static_pod_path)
        self.port = config.read_only_port
        self.address = "127.0.0.1" if config.address in ("", "0.0.0.0", "::") else config.address
        self.node = config.node_name
        self.attached_sync_frequency = config.sync_frequency
        self.api = bool(config.kubeconfig)
        self.limits = {spec.name: Limits(spec.heartbeat_timeout, spec.intensity,
                                         spec.intensity_period, spec.backoff_reset_after)
                       for spec in resolve_specs(config)}
        self.report.notes.append(
            f"attached to the agent under {root}: the supervisor SIGKILL + restart fault is "
            "skipped (chaos did not start this agent and would not restart it as its owner "
            "did); the agent is left running (processes_left: chaos's containers after its "
            "pods were removed)")

    def start_agent(self) -> None:
        assert self.agent is not None
        self.agent.start()

    def rows(self) -> dict[str, dict[str, Any]]:
        try:
            result = self.control.call("status", timeout=2.0)
        except (AgentNotRunning, OSError):
            return {}
        except Exception:  # a fault reply while the agent starts or stops
            return {}
        return {row["name"]: row for row in result.get("processes", [])}

    def pods(self) -> dict[str, dict[str, Any]] | None:
        """GET /pods: pod name (without the node suffix) -> pod; None without an answer.
        Attached to an agent without readOnlyPort: its map owners' snapshots."""
        if not self.port:
            doc = get_podlist(self.paths.root, timeout=3.0)
            if doc is None:
                return None
            return self._by_name(doc)
        conn = http.client.HTTPConnection(self.address, self.port, timeout=3)
        try:
            conn.request("GET", "/pods")
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                return None
            doc = json.loads(body)
        except (OSError, http.client.HTTPException, ValueError):
            return None
        finally:
            conn.close()
        return self._by_name(doc)

    def _by_name(self, doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
        suffix = f"-{self.node}"
        return {p["metadata"]["name"].removesuffix(suffix): p for p in doc.get("items", [])}

    def all_up(self) -> bool:
        rows = self.rows()
        return bool(rows) and all(r["state"] == "RUNNING" for r in rows.values()
                                  if r.get("enabled", True)) and self.pods() is not None

    def wait(self, what: str, predicate: Any, timeout: float, interval: float = 0.05) -> bool:
        deadline = _monotonic() + timeout
        while _monotonic() < deadline:
            proc = None if self.agent is None else self.agent.proc
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the agent exited {proc.returncode} while waiting for "
                                   f"{what} (see {self.tmp / 'agent.stderr'})")
            if predicate():
                return True
            time.sleep(interval)
        return False

    # --- observation -----------------------------------------------------------------------

    def marker_processes(self) -> dict[str, list[int]]:
        """Container key (``pod/container``) -> live PIDs carrying this run's marker."""
        out: dict[str, list[int]] = defaultdict(list)
        prefix = f"{self.token}/"
        for proc in psutil.process_iter(["name"]):
            if proc.info["name"] != "sleep":
                continue
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                value = proc.environ().get(MARKER, "")
            except psutil.Error:
                continue
            if value.startswith(prefix):
                out[value[len(prefix):]].append(proc.pid)
        return out

    def run_processes(self) -> list[psutil.Process]:
        """Every live process of this run: containers (marker) and, of a private agent, the
        agent's own processes (supervisor, subsystems, zygote, monitors: PODVISOR_ROOT_DIR or
        the config path). Attached to a user's agent: chaos's containers only."""
        config = str(self.config)

        def launched_here(proc: psutil.Process) -> bool:
            with contextlib.suppress(psutil.Error):
                return config in " ".join(proc.cmdline())
            return False
        return processes_of_root(None if self.attached else self.paths.root,
                                 (MARKER, f"{self.token}/"),
                                 None if self.attached else launched_here)

    def _sample(self) -> None:
        tick = 0
        while not self.stop_sampling.wait(0.25):
            pods = self.pods()
            now = _monotonic()
            if pods is not None:
                for name in self.probed:
                    pod = pods.get(name)
                    if pod is None:
                        continue
                    ready = _ready(pod)
                    with self.lock:
                        was = self.ready.get(name)
                        self.ready[name] = ready
                        cause = now - self.last_kill.get(name, -1e9) < CAUSE_WINDOW
                    if was and not ready and not cause:
                        self.report.invariants["ready_lost_without_cause"] += 1
                        self.report.details.append(f"{name} went NotReady without a kill")
            tick += 1
            if tick % 4 == 0:
                dupes = sum(len(p) - 1 for p in self.marker_processes().values() if len(p) > 1)
                self.max_dupes = max(self.max_dupes, dupes)

    # --- faults ----------------------------------------------------------------------------

    def _target(self) -> dict[str, Any] | None:
        """A RUNNING subsystem chaos may fault now (``_may_fault``: so the supervisor never
        gives it up), or None."""
        rows = [row for row in self.rows().values()
                if row["state"] == "RUNNING" and row["pid"] and self._may_fault(str(row["name"]))]
        if not rows:
            return None
        row = self.rng.choice(sorted(rows, key=lambda r: str(r["name"])))
        self.faulted[row["name"]].append(_monotonic())
        return row

    def fault_kill(self) -> None:
        row = self._target()
        if row is None:
            return
        name, pid = row["name"], int(row["pid"])
        t0 = _monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if self.bus is not None:
            self.bus.forget(name)
        self.report.faults["kill"] += 1

        def back() -> bool:
            r = self.rows().get(name)
            return r is not None and r["state"] == "RUNNING" and r["pid"] not in (None, pid)
        if self.wait(f"{name} restarted", back, RECOVERY_TIMEOUT):
            self.report.recovery[f"kill {name}"].append(_monotonic() - t0)
        else:
            self.report.details.append(f"{name} not RUNNING {RECOVERY_TIMEOUT:g} s after kill -9")

    def fault_stop(self) -> None:
        row = self._target()
        if row is None:
            return
        name, pid = row["name"], int(row["pid"])
        limit = self.limits.get(str(name), Limits()).heartbeat_timeout
        hold = self.rng.uniform(0.2, limit + 1.0)
        t0 = _monotonic()
        try:
            proc = psutil.Process(pid)
            proc.send_signal(signal.SIGSTOP)
        except psutil.Error:
            return
        self.report.faults["stop"] += 1
        time.sleep(hold)
        with contextlib.suppress(psutil.Error):
            if proc.is_running():
                proc.send_signal(signal.SIGCONT)

        def back() -> bool:
            r = self.rows().get(name)
            if r is None or r["state"] != "RUNNING" or not r["pid"]:
                return False
            try:
                return bool(psutil.Process(int(r["pid"])).status() != psutil.STATUS_STOPPED)
            except psutil.Error:
                return False
        if self.wait(f"{name} running after SIGSTOP", back, RECOVERY_TIMEOUT):
            self.report.recovery[f"stop {name}"].append(_monotonic() - t0)
        else:
            self.report.details.append(f"{name} not RUNNING {RECOVERY_TIMEOUT:g} s after SIGSTOP")

    def fault_container(self) -> None:
        procs = self.marker_processes()
        candidates = sorted(n for n in self.names
                            if self.kills[n] == 0 and len(procs.get(f"{n}/app", [])) == 1)
        if not candidates:
            return
        name = self.rng.choice(candidates)
        [pid] = procs[f"{name}/app"]
        t0 = _monotonic()
        with self.lock:
            self.kills[name] += 1
            self.last_kill[name] = t0
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.report.faults["container"] += 1

        def replaced() -> bool:
            return any(p != pid for p in self.marker_processes().get(f"{name}/app", []))
        if self.wait(f"{name} replaced", replaced, RECOVERY_TIMEOUT, 0.02):
            self.report.recovery["container"].append(_monotonic() - t0)

    def fault_supervisor(self) -> None:
        assert self.agent is not None
        t0 = _monotonic()
        self.agent.kill()
        if self.bus is not None:
            self.bus.forget()
        self.report.faults["supervisor"] += 1
        self.start_agent()
        if self.wait("the agent back after SIGKILL", self.all_up, RECOVERY_TIMEOUT):
            self.report.recovery["supervisor"].append(_monotonic() - t0)
        else:
            self.report.details.append(
                f"agent not back {RECOVERY_TIMEOUT:g} s after the supervisor's SIGKILL")

    # --- the run ---------------------------------------------------------------------------

    def fault_burst_kill(self) -> None:
        rows = self.rows()
        wanted = (self.opts.burst_target,) if self.opts.burst_target else BURST_TARGETS
        targets = [n for n in wanted if (r := rows.get(n)) is not None
                   and r["state"] == "RUNNING" and r["pid"] and self._may_fault(n)]
        if not targets:
            return
        name = self.rng.choice(targets)
        # A kill within backoffResetAfter of the last restart would measure the supervisor's
        # crash back-off (a crash loop's), not the recovery from one crash: wait it out.
        stable = self.limits.get(name, Limits()).backoff_reset_after

        def settled() -> bool:
            r = self.rows().get(name)
            return r is not None and r["state"] == "RUNNING" and (r["uptime"] or 0) >= stable
        if not self.wait(f"{name} up for {stable:g} s", settled, stable + RECOVERY_TIMEOUT, 0.2):
            return
        self.bursts += 1
        burst = [f"{self.prefix}b{self.bursts}-{i}" for i in range(self.opts.burst)]
        after = self.opts.burst_after or self.rng.randint(1, max(1, len(burst) // 2))
        after = min(after, len(burst))
        paths = self.write_manifests(burst, probed=set())

        def started() -> bool:
            procs = self.marker_processes()
            return sum(1 for n in burst if procs.get(f"{n}/app")) >= after
        if not self.wait(f"{after} of the burst running", started, RECOVERY_TIMEOUT, 0.005):
            self.report.details.append(f"burst {self.bursts}: {after} pods not running within "
                                       f"{RECOVERY_TIMEOUT:g} s; no kill")
        else:
            row = self.rows().get(name)
            pid = int(row["pid"]) if row is not None and row["pid"] else 0
            t0 = _monotonic()
            if pid:
                self.faulted[name].append(t0)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                if self.bus is not None:
                    self.bus.forget(name)
                self.report.faults["burst-kill"] += 1

            def all_running() -> bool:
                pods = self.pods()
                return pods is not None and all(
                    (p := pods.get(n)) is not None and _running(p) for n in burst)
            if self.wait(f"the burst running after kill -9 {name}", all_running,
                         RECOVERY_TIMEOUT, 0.02):
                if pid:
                    self.report.recovery[f"burst-kill {name}"].append(_monotonic() - t0)
            else:
                self.report.details.append(f"burst {self.bursts}: not all Running "
                                           f"{RECOVERY_TIMEOUT:g} s after kill -9 {name}")
        self._check_burst(burst)
        self._remove_burst(burst, paths)

    # --- what the control-endpoint faults (chaos_faults.py) use ---------------------------

    def fault_bus(self) -> None:
        fault_bus(self)

    def fault_cri(self) -> None:
        fault_cri(self)

    def fault_resource(self) -> None:
        fault_resource(self)

    def fault_api(self) -> None:
        fault_api(self)

    def fault_disk(self) -> None:
        fault_disk(self)

    @staticmethod
    def now() -> float:
        return _monotonic()

    @property
    def sync_frequency(self) -> float:
        return SYNC_FREQUENCY if self.agent is not None else self.attached_sync_frequency

    def limits_of(self, name: str) -> Limits:
        return self.limits.get(name, Limits())

    def may_fault(self, name: str) -> bool:
        return self._may_fault(name)

    def _may_fault(self, name: str) -> bool:
        """Fewer than ``intensity - 1`` faults of ``name`` within its ``intensityPeriod``."""
        lim = self.limits.get(name, Limits())
        now = _monotonic()
        self.faulted[name] = [t for t in self.faulted[name] if now - t < lim.intensity_period]
        return len(self.faulted[name]) < lim.intensity - 1

    def _check_burst(self, burst: list[str]) -> None:
        """Each burst pod runs once: one process, no restart."""
        procs = self.marker_processes()
        dupes = {n: len(procs.get(f"{n}/app", [])) for n in burst}
        extra = sum(max(0, k - 1) for k in dupes.values())
        if extra:
            self.max_dupes = max(self.max_dupes, extra)
            self.report.details.append(f"burst {self.bursts}: processes per pod "
                                       f"{ {n: k for n, k in dupes.items() if k != 1} }")
        pods = self.pods() or {}
        for n in burst:
            restarts = _restarts(pods[n]) if n in pods else 0
            if restarts:
                self.report.invariants["restarts_without_cause"] += restarts
                self.report.details.append(f"{n}: {restarts} restarts, no kill of it")

    def _remove_burst(self, burst: list[str], paths: list[Path]) -> None:
        """Remove the burst's manifests; once its pods left /pods and their processes had time
        to go, any left is an orphan (counted, then killed by PID)."""
        for path in paths:
            path.unlink(missing_ok=True)
            self.written.remove(path)

        def left_pods() -> bool:
            pods = self.pods()
            return pods is not None and not any(n in pods for n in burst)

        def no_process() -> bool:
            procs = self.marker_processes()
            return not any(procs.get(f"{n}/app") for n in burst)
        if not self.wait("the burst's pods gone", left_pods, CONVERGE_TIMEOUT, 0.05):
            self.report.details.append(f"burst {self.bursts}: pods still in /pods "
                                       f"{CONVERGE_TIMEOUT:g} s after their removal")
        self.wait("the burst's processes gone", no_process, RECOVERY_TIMEOUT, 0.05)
        procs = self.marker_processes()
        for n in burst:
            for pid in procs.get(f"{n}/app", []):
                self.report.invariants["orphans_after_removal"] += 1
                self.report.details.append(f"burst {self.bursts}: {n}'s process {pid} left "
                                           "after its pod was removed")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def converged(self) -> bool:
        pods = self.pods()
        if pods is None:
            return False
        for name in self.names:
            pod = pods.get(name)
            if pod is None or not _running(pod) or _restarts(pod) < self.kills[name]:
                return False
            if name in self.probed and not _ready(pod):
                return False
        return True

    def write_manifests(self, names: list[str], probed: set[str]) -> list[Path]:
        """Each manifest is written under a dot name (the static source skips those), then
        all are renamed in, so the agent never reads half a file and sees them at once."""
        staged = []
        for name in names:
            path = self.manifests / f"{name}.yaml"
            tmp = self.manifests / f".{name}.yaml.tmp"
            tmp.write_text(MANIFEST.format(
                name=name, marker=MARKER, token=self.token,
                probe=PROBE if name in probed else "",
            volume=SCRATCH if name in self.scratch else ""), encoding="utf-8")
            self.written.append(path)
            staged.append((tmp, path))
        for tmp, path in staged:
            tmp.replace(path)
        return [path for _, path in staged]

    def remove_manifests(self) -> None:
        for path in self.written:
            path.unlink(missing_ok=True)
            (path.parent / f".{path.name}.tmp").unlink(missing_ok=True)

    def run(self) -> None:
        self.write_manifests(self.names, self.probed)
        if self.attached:
            if not self.rows():
                raise RuntimeError(f"no agent answers on {self.paths.control}")
        else:
            self.start_agent()
        if not self.wait(f"{len(self.names)} pods running and ready", self.converged, 180.0,
                         0.2):
            raise RuntimeError(f"the {len(self.names)} pods did not all run within 180 s")
        self.bus = BusCounter(self.paths)
        self.sampler = threading.Thread(target=self._sample, name="chaos-sample", daemon=True)
        self.sampler.start()
        faults = [f for f in FAULTS if not (self.attached and f[0] == "supervisor")
                  and not (f[0] == "api" and not self.api)
                  and (not self.opts.faults or f[0] in self.opts.faults)]
        if not self.api and (not self.opts.faults or "api" in self.opts.faults):
            self.report.notes.append("no api faults: the agent has no API server (chaos "
                                     "--kubeconfig FILE, or an attached agent's kubeconfig)")
        # drawn from a shuffled deck holding each kind as many times as its weight, the first
        # deck each kind once: seeded random, every kind within the first len(faults) faults
        # and within each deck after
        deck = Deck(self.rng, [k for k, w in faults for _ in range(w)], [k for k, _ in faults])
        end = _monotonic() + self.opts.duration
        while _monotonic() < end and faults and not (
                self.opts.rounds and sum(self.report.faults.values()) >= self.opts.rounds):
            time.sleep(self.rng.uniform(0.2, 1.5))
            kind = deck.draw()
            getattr(self, f"fault_{kind.replace('-', '_')}")()
        self.wait("the pods to converge", self.converged, CONVERGE_TIMEOUT, 0.2)
        self.stop_sampling.set()
        self.sampler.join(10)
        self.check()

    def check(self) -> None:
        inv = self.report.invariants
        pods = self.pods() or {}
        for name in self.names:
            pod = pods.get(name)
            if pod is None or not _running(pod):
                inv["pods_lost"] += 1
                self.report.details.append(f"{name} {'missing' if pod is None else 'not running'}")
                continue
            restarts = _restarts(pod)
            if restarts > self.kills[name]:
                inv["restarts_without_cause"] += restarts - self.kills[name]
                self.report.details.append(
                    f"{name}: {restarts} restarts, {self.kills[name]} kills")
            elif restarts < self.kills[name]:
                inv["restarts_missed"] += self.kills[name] - restarts
                self.report.details.append(
                    f"{name}: {restarts} restarts, {self.kills[name]} kills")
        dupes = sum(len(p) - 1 for p in self.marker_processes().values() if len(p) > 1)
        inv["duplicate_containers"] = max(self.max_dupes, dupes)

    def detach(self) -> None:
        """Attached: remove chaos's pods from the running agent (which stays up); count (and
        kill) chaos's containers still alive once they left /pods."""
        self.remove_manifests()

        def gone() -> bool:
            pods = self.pods()
            return (pods is not None and not any(n in pods for n in self.names)
                    and not self.marker_processes())
        if not self.wait("chaos's pods removed", gone, CONVERGE_TIMEOUT, 0.2):
            self.report.details.append(
                f"chaos's pods still in /pods or running {CONVERGE_TIMEOUT:g} s after their "
                "manifests were removed")
        left = self.run_processes()
        self.report.invariants["processes_left"] = len(left)
        for proc in left:
            self.report.details.append(f"left after the pods were removed: {proc.pid}")
            with contextlib.suppress(psutil.Error):
                proc.kill()

    def shutdown(self) -> None:
        """`podvisorctl shutdown --pods`, then count (and kill) what is left of the run."""
        if self.attached:
            self.detach()
            return
        if self.agent is not None and self.agent.running:
            self.agent.shutdown_pods()
            if self.agent.running:
                self.report.details.append("the agent did not exit within 180 s of shutdown")
        left = self.run_processes()
        self.report.invariants["processes_left"] = len(left)
        for proc in left:
            self.report.details.append(f"left after shutdown --pods: {proc.pid} "
                                       f"{' '.join(proc.cmdline())[:80]}")
            with contextlib.suppress(psutil.Error):
                proc.kill()

    def close(self) -> None:
        self.stop_sampling.set()
        if self.bus is not None:
            self.report.bus_drops, self.report.bus_messages = self.bus.drops, self.bus.messages
            self.bus.close()
        if self.agent is not None:
            self.agent.kill()
            self.agent.stop()
        if self.attached:
            self.remove_manifests()  # the user's agent keeps running, without chaos's pods
        for proc in self.run_processes():  # never leave anything behind, whatever happened
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if self.agent is not None:
            self.agent.remove_cgroup_root()
        if not self.opts.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _status(pod: dict[str, Any]) -> PodStatus:
    """A ``GET /pods`` item's status, typed (Pending when it has none or a malformed one)."""
    try:
        return PodStatus.from_dict(pod.get("status") or {})
    except MapValueError:
        return PodStatus()


def _running(pod: dict[str, Any]) -> bool:
    statuses = _status(pod).container_statuses
    return bool(statuses) and all(s.state.running is not None for s in statuses)


def _ready(pod: dict[str, Any]) -> bool:
    ready = _status(pod).condition("Ready")
    return ready is not None and ready.true


def _restarts(pod: dict[str, Any]) -> int:
    return sum(s.restart_count for s in _status(pod).container_statuses)


def run_chaos(opts: ChaosOptions) -> Report:
    seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(1 << 31)
    report = Report(seed=seed, pods=opts.pods, duration=opts.duration)
    try:
        chaos = Chaos(opts, report)
    except RuntimeError as err:
        report.error = str(err)
        return report
    try:
        chaos.run()
        chaos.shutdown()
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        report.error = str(err)
    finally:
        chaos.close()
    return report


def main_chaos(args: Any) -> int:
    if args.pods < 1 or args.duration < 0:
        print("podvisor chaos: --pods must be >= 1 and --duration >= 0", file=sys.stderr)
        return 2
    root = Path(args.root_dir) if args.root_dir else None
    faults = tuple(k.strip() for k in (args.faults or "").split(",") if k.strip())
    unknown = sorted(set(faults) - {k for k, _ in FAULTS})
    if unknown:
        print(f"podvisor chaos: unknown fault kind(s) {', '.join(unknown)} (known: "
              f"{', '.join(k for k, _ in FAULTS)})", file=sys.stderr)
        return 2
    if args.burst < 1 or args.rounds < 0 or args.burst_after < 0:
        print("podvisor chaos: --burst must be >= 1, --rounds and --burst-after >= 0",
              file=sys.stderr)
        return 2
    report = run_chaos(ChaosOptions(args.pods, args.duration, args.seed, args.keep, root,
                                    faults, args.rounds, args.burst, args.burst_after,
                                    args.burst_target or "", args.kubeconfig or ""))
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        print(report.text())
    return 0 if report.ok else 1
