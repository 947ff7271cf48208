"""The dashboard's routes on the ops port (behind the same HTTP Basic auth as ``/RPC2``).

- ``GET /`` and ``GET /static/{file}``: the page, served from this package (no CDN).
- ``GET /api/state``: ``{"now", "processes": [...], "pods": [...], "timeline": [...]}``.
- ``GET /api/events``: server-sent events: ``state`` (the state above) when it changed,
  ``ping`` (``{"now", "every"}``) every ``keepalive`` with nothing sent. One broadcaster, while
  a client listens, event-driven (``feed.FeedPlan``): woken by the map pump's changed publish
  (a map update or a process state change on the bus), it computes the state (``OpsRpc`` on a
  worker thread) at most once per ``min_gap``, and sends it, encoded once, to every client
  when its content moved (``Snapshot.key``: the passing of time alone is no change; the page
  ticks uptimes and the timeline itself). With nothing moving it asks the supervisor again
  every ``recheck`` (a dropped bus message) and otherwise sleeps: no client, no work; idle
  clients, a ping each every 15 s.
  ``?beat=S``: also a comment line after ``S`` seconds without an event (the fleet's watchdog).
  Other events go to every page through ``push`` (the charts' ``usage`` samples).
- ``POST /api/action`` ``{"action": start|stop|restart|kill, "name": "group:name",
  "signal"?}``: the XML-RPC methods' semantics (a container's restart is a stop; its
  restartPolicy brings it back). Faults answer 409 with ``{"faultCode", "faultString"}``.
- ``GET /api/log?name=group:name&offset=N``: ``tailProcessStdoutLog`` (offset -1: the last
  16 KiB).
- ``GET /logtail/{group:name}[/{channel}]`` and ``GET /mainlogtail``: supervisord's log
  streams (``logtail``; registered here, with the rest of the ops port's GET routes).

The timeline keeps the state changes and restarts of every process and pod over the last hour
(``Timeline``: pure, fed each computed state with the wall time).
"""

from __future__ import annotations

import asyncio
import json
import threading
import xmlrpc.client
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from podvisor.ipc.clock import SYSTEM_CLOCK, Clock
from podvisor.ipc.maps import DesiredPod, PodStatusValue
from podvisor.ipc.podstatus import ContainerStatus, PodStatus
from podvisor.services.ops.faults_api import add_faults_api
from podvisor.services.ops.feed import (
    FEED_TIMES,
    RETRY_MS,
    Action,
    FeedPlan,
    FeedTimes,
    Snapshot,
    agent_key,
    frame,
    ping_frame,
)
from podvisor.services.ops.logtail import add_logtail
from podvisor.services.ops.procs import Proc, pod_procs
from podvisor.services.ops.rpc import OpsRpc

__all__ = ["Changes", "Dashboard", "Timeline", "add_dashboard"]

STATIC = Path(__file__).parent / "static"
WINDOW = 3600.0
LOG_CHUNK = 16384


class Timeline:
    """State changes per namespec over the last ``window`` seconds (pure)."""

    def __init__(self, window: float = WINDOW, limit: int = 20_000) -> None:
        self.window = window
        self.last: dict[str, tuple[str, int, int]] = {}
        self.changes: deque[dict[str, Any]] = deque(maxlen=limit)
        self.revision = 0  # + 1 whenever ``changes`` gains or loses an entry

    def observe(self, procs: list[Proc], now: float) -> None:
        for p in procs:
            key = (p.state.name, p.restarts, p.pid)
            prev = self.last.get(p.namespec)
            if prev is None or prev[0] != key[0] or prev[1] != key[1]:
                restarted = prev is not None and key[1] > prev[1]
                self.changes.append({"t": round(now, 3), "name": p.namespec,
                                     "group": p.group, "state": p.state.name,
                                     "restart": restarted, "pid": p.pid})
                self.revision += 1
            self.last[p.namespec] = key
        while self.changes and self.changes[0]["t"] < now - self.window:
            self.changes.popleft()
            self.revision += 1


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _proc_json(p: Proc, now: float) -> dict[str, Any]:
    info = p.info(now)
    extra = {k: v for k, v in p.extra.items() if k in ("reason", "lastExit", "restartPolicy",
                                                       "container_id", "uid", "module")}
    if p.kind == "agent":
        # the heartbeat: "ok", or since when it is late (wall seconds; the page ticks the age).
        # A fresh age at every ask would make an unchanged row look changed.
        late = bool(p.extra.get("heartbeatLate")) and p.state.name == "RUNNING"
        age = p.extra.get("heartbeatAge")
        extra["heartbeat"] = (round(now - float(age), 1) if late and isinstance(age, int | float)
                              else "ok" if p.state.name == "RUNNING" else None)
    return {**info, "namespec": p.namespec, "kind": p.kind, "restarts": p.restarts,
            "uptime": max(0, int(now - p.start)) if p.state.name == "RUNNING" else None,
            **extra}


def _pods_json(maps: Any) -> list[dict[str, Any]]:
    out = []
    for uid, entry in maps.desired.items():
        if not isinstance(entry, DesiredPod):
            continue
        ref = entry.ref
        value = maps.statuses.get(uid)
        status = value.status if isinstance(value, PodStatusValue) else PodStatus()
        out.append({
            "uid": uid, "name": ref.name, "namespace": ref.namespace,
            "group": f"{ref.namespace or 'default'}.{ref.name}",
            "phase": status.phase,
            "conditions": [{"type": c.type, "status": c.status} for c in status.conditions],
            "containers": [{"name": cs.name, "ready": cs.ready,
                            "restartCount": cs.restart_count, **_state_of(cs)}
                           for cs in status.container_statuses],
            "podIP": status.pod_ip or "",
        })
    return sorted(out, key=lambda p: p["group"])


def _state_of(cs: ContainerStatus) -> dict[str, str]:
    """``{"state": running|waiting|terminated, "reason"}`` of a ContainerStatus."""
    kind = cs.state.kind
    return {"state": kind, "reason": cs.state.reason} if kind else {"state": "unknown",
                                                                      "reason": ""}


class Changes(Protocol):
    """Where the broadcaster learns that the maps moved (``common.web.WebService``)."""

    changes: int

    async def next_change(self, since: int, timeout: float) -> int: ...


class Dashboard:
    def __init__(self, rpc: OpsRpc, maps: Callable[[], Any], executor: Executor,
                 changes: Changes, clock: Clock = SYSTEM_CLOCK,
                 times: FeedTimes = FEED_TIMES) -> None:
        self.rpc, self.maps, self.executor, self.source = rpc, maps, executor, changes
        self.clock, self.wall, self.times = clock, clock.wall, times
        self.timeline = Timeline()
        self.clients: set[asyncio.Queue[bytes]] = set()
        self.last_key: object = None
        self.last_frame = b""  # the last state sent, as its server-sent event
        self.sends = 0  # state frames handed to the clients (each encoded once)
        # kept from one broadcaster to the next: a page opened with nothing moved since the
        # last computation gets the last state, not a new computation
        self.plan = FeedPlan(times)
        self.seen = -1  # the source's ``changes`` at the last computation
        self.seen_procs = -1  # the maps' ``procs_version`` when the subsystems were last asked
        self._task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # one computation at a time (the timeline, the cache)
        # (pods version, container procs, their JSON text, the pods' JSON text): ``snapshot``
        self._pods_cache: tuple[Any, list[Proc], str, str] | None = None

    def snapshot(self, pods: bool = True) -> Snapshot:
        """The page's state. Blocking (control and map reads): run on a worker thread. The
        subsystems are asked each time; the containers and pods are computed and encoded again
        only when the pods' version moved (a pod, status or runtime record changed) and
        ``pods`` (else the last computed ones are reused), so a subsystem's change costs the
        control call and a small encoding. Uptimes tick in the page from ``start``, so a
        reused row's ``uptime`` is never shown stale."""
        with self._lock:
            now = self.wall()
            maps = self.maps()
            version = getattr(maps, "pods_version", None)
            cached = self._pods_cache
            if cached is None or (pods and (version is None or cached[0] != version)):
                procs = sorted(pod_procs(maps.desired, maps.statuses, maps.pleg,
                                         self.rpc.d.runtime_dir, getattr(maps, "pods", None)),
                               key=lambda p: (p.group, p.name))
                cached = (version, procs, _dumps([_proc_json(p, now) for p in procs]),
                          _dumps(_pods_json(maps)))
                self._pods_cache = cached
            agents = sorted(self.rpc._agent(), key=lambda p: p.name)
            self.timeline.observe(agents + cached[1], now)
            key = (cached[0], self.timeline.revision, agent_key(agents))
            listed = _dumps([_proc_json(p, now) for p in agents])
            # the subsystems' rows, then the containers' (one JSON array, spliced)
            processes = listed[:-1] + ("," if agents and cached[1] else "") + cached[2][1:]
            head = _dumps({"now": int(now), "timeline": list(self.timeline.changes)})[:-1]
            return Snapshot(key, f'{head},"processes":{processes},"pods":{cached[3]}}}')

    def body(self) -> str:
        return self.snapshot().body

    async def state_body(self) -> str:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.body)

    def _send(self, data: bytes) -> None:
        for q in list(self.clients):
            if q.qsize() < 4:  # a slow client skips states, never blocks the others
                q.put_nowait(data)

    def push(self, data: bytes) -> None:
        """Another event for every open page (web thread; the charts' samples): encoded once
        by the caller; it counts as the keep-alive."""
        if self.clients:
            self._send(data)
            self.plan.sent(self.clock.monotonic())

    async def broadcast(self) -> None:
        """While a client listens: compute, send, ping or sleep as ``FeedPlan`` says."""
        plan = self.plan
        loop, mono = asyncio.get_running_loop(), self.clock.monotonic
        try:
            while self.clients:
                now = mono()
                moved = self.source.changes != self.seen
                procs = getattr(self.maps(), "procs_version", 0)
                step = plan.next(now, moved, procs != self.seen_procs)
                if step.action is Action.WAIT:
                    # until ``at`` or a change; inside the gap after a computation (``moved``),
                    # until its end or a further change (a subsystem's is not held back)
                    since = self.source.changes if moved else self.seen
                    await self.source.next_change(since, step.at - now)
                    continue
                if step.action is Action.PING:
                    self._send(ping_frame(self.wall(), self.times.keepalive))
                    plan.sent(now)
                    continue
                full = step.action is Action.COMPUTE
                if full:
                    self.seen = self.source.changes
                    plan.computed(now)
                self.seen_procs = procs
                try:
                    snap = await loop.run_in_executor(self.executor, self.snapshot, full)
                except (OSError, xmlrpc.client.Fault):
                    continue  # the agent does not answer: the last state stands
                if snap.key != self.last_key:
                    self.last_key, self.last_frame = snap.key, frame("state", snap.body)
                    self.sends += 1
                    self._send(self.last_frame)
                    plan.sent(mono())
        finally:
            self._task = None

    async def index(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def state(self, request: web.Request) -> web.Response:
        return web.Response(text=await self.state_body(), content_type="application/json")

    def subscribe(self) -> asyncio.Queue[bytes]:
        """A new client's queue (web thread): the reconnect delay, the last state when it is
        current (the broadcaster runs, or nothing moved since it computed; else a new one comes
        at once) and the clock (that state may be old); the broadcaster started if need be."""
        q: asyncio.Queue[bytes] = asyncio.Queue()
        q.put_nowait(b"retry: %d\n\n" % RETRY_MS)
        current = self._task is not None or self.source.changes == self.seen
        if self.last_frame and current:
            q.put_nowait(self.last_frame)
            q.put_nowait(ping_frame(self.wall(), self.times.keepalive))
        self.clients.add(q)
        if self._task is None:
            if self.last_frame and current:  # its only client just got a ping
                self.plan.sent(self.clock.monotonic())
            self._task = asyncio.create_task(self.broadcast())
        return q

    async def events(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        q = self.subscribe()
        beat = _beat(request.query.get("beat"))
        try:
            while True:
                if beat is None:
                    await resp.write(await q.get())
                    continue
                try:  # a comment line every ``beat`` s: the fleet's dead-node watchdog
                    data = await asyncio.wait_for(q.get(), beat)
                except TimeoutError:
                    data = b": beat\n\n"
                await resp.write(data)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.clients.discard(q)
        return resp

    async def action(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            action, name = str(body["action"]), str(body["name"])
        except (ValueError, KeyError, TypeError):
            return web.json_response({"faultString": "need JSON {action, name}"}, status=400)
        sig = str(body.get("signal") or "KILL")
        calls: dict[str, Callable[[], object]] = {
            "start": lambda: self.rpc.startProcess(name, True),
            "stop": lambda: self.rpc.stopProcess(name, True),
            "restart": lambda: self._restart(name),
            "kill": lambda: self.rpc.signalProcess(name, sig),
        }
        if action not in calls:
            return web.json_response({"faultString": f"unknown action {action!r}"}, status=400)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, calls[action])
        except xmlrpc.client.Fault as fault:
            return web.json_response({"faultCode": fault.faultCode,
                                      "faultString": fault.faultString}, status=409)
        return web.json_response({"ok": True})

    def _restart(self, name: str) -> None:
        info = self.rpc.getProcessInfo(name)
        if info["group"] == "agent":
            self.rpc._control("restart", name=info["name"])
        else:  # a container: stop it; the pod's restartPolicy brings it back
            self.rpc.stopProcess(name, True)

    async def log(self, request: web.Request) -> web.Response:
        name = request.query.get("name", "")
        try:
            offset = int(request.query.get("offset", "-1"))
        except ValueError:
            return web.json_response({"faultString": "bad offset"}, status=400)
        loop = asyncio.get_running_loop()

        def tail() -> list[object]:
            start = offset
            if start < 0:
                size = self.rpc.tailProcessStdoutLog(name, 0, 0)[1]
                start = max(0, int(str(size)) - LOG_CHUNK)
            return self.rpc.tailProcessStdoutLog(name, start, LOG_CHUNK)

        try:
            text, nxt, overflow = await loop.run_in_executor(self.executor, tail)
        except xmlrpc.client.Fault as fault:
            return web.json_response({"faultCode": fault.faultCode,
                                      "faultString": fault.faultString}, status=404)
        return web.json_response({"text": text, "offset": nxt, "overflow": overflow})


def _beat(raw: str | None) -> float | None:
    """``?beat=S`` on ``/api/events``: a comment line after ``S`` seconds (1-60) without an
    event, so a client that needs to tell a hung node quickly (the fleet) can."""
    try:
        return None if raw is None else min(60.0, max(1.0, float(raw)))
    except ValueError:
        return None


def add_dashboard(app: web.Application, rpc: OpsRpc, maps: Callable[[], Any],
                  executor: Executor, changes: Changes, clock: Clock = SYSTEM_CLOCK,
                  times: FeedTimes = FEED_TIMES) -> Dashboard:
    dash = Dashboard(rpc, maps, executor, changes, clock, times)
    app.router.add_get("/", dash.index)
    app.router.add_static("/static/", STATIC)
    app.router.add_get("/api/state", dash.state)
    app.router.add_get("/api/events", dash.events)
    app.router.add_post("/api/action", dash.action)
    app.router.add_get("/api/log", dash.log)
    add_faults_api(app, rpc._control, executor)  # issue 28: the faults panel (faults_api.py)
    # supervisord's /logtail and /mainlogtail streams (supervisorctl tail -f, maintail -f)
    add_logtail(app, rpc.find_proc, rpc.d.logs_dir, executor)
    return dash
