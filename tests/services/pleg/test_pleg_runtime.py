"""PLEG against the real embedded runtime (standalone process), over a real bus.

Containers are created with CRI directly; a kill -9 of a container's process must show up as
ContainerDied with its exit code (via the event stream), and a PLEG restart must rebuild its map
without reporting a running container as died.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from cri_api.v1 import api_pb2 as pb

from podvisor.common.child import FakeChildContext
from podvisor.ipc.bus import BusProxy, Subscriber
from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.ipc.clone import MapReplica
from podvisor.ipc.maps import PLEG, PlegPod
from podvisor.ipc.paths import RunPaths
from podvisor.services.cri import RuntimeClient, new_runtime_client
from podvisor.services.pleg.records import pleg_value
from podvisor.services.pleg.relist import new_relister
from podvisor.services.pleg.service import serve
from tests.conftest import wait_for_impl

UID = "pleg-it-uid"


def _without_ts(record: PlegPod) -> PlegPod:
    return dataclasses.replace(record, ts=0.0)


def until(cond: Callable[[], Any], timeout: float = 20.0,
          pump: Callable[[], Any] | None = None) -> Any:
    return wait_for_impl(cond, timeout, 0.01, pump=pump)


@pytest.fixture
def runtime() -> Iterator[tuple[RunPaths, RuntimeClient]]:
    root = Path(f"/tmp/pvplg{os.getpid()}")
    shutil.rmtree(root, ignore_errors=True)
    paths = RunPaths(root)
    paths.ensure()
    proc = subprocess.Popen([sys.executable, "-m", "podvisor.services.runtime", "--root",
                             str(paths.runtime_dir), "--socket", str(paths.cri_socket)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = new_runtime_client(f"unix://{paths.cri_socket}", timeout=5.0)

    def up() -> bool:
        try:
            client.version()
            return True
        except Exception:
            return False
    try:
        until(up)
        yield paths, client
    finally:
        try:
            for c in client.list_containers():
                client.stop_container(c.id, 0)
                client.remove_container(c.id)
            for s in client.list_pod_sandbox():
                client.stop_pod_sandbox(s.id)
                client.remove_pod_sandbox(s.id)
        finally:
            client.close()
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
            shutil.rmtree(root, ignore_errors=True)


class Pleg:
    """The PLEG loop on a thread with a bus proxy, a map replica and an event subscriber."""

    def __init__(self, paths: RunPaths, zctx: zmq.Context[Any]) -> None:
        self.ctx = FakeChildContext(paths, "pleg", zctx=zctx)
        self.log = self.ctx.log
        self.client = new_runtime_client(f"unix://{paths.cri_socket}", timeout=4.0)
        self.thread = threading.Thread(target=serve, args=(self.ctx, self.client), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.ctx.stop.set()
        self.thread.join(10)
        self.client.close()


@pytest.fixture
def bus(runtime: tuple[RunPaths, RuntimeClient]) -> Iterator[zmq.Context[Any]]:
    zctx: zmq.Context[Any] = zmq.Context()
    proxy = BusProxy(zctx, runtime[0])
    proxy.start()
    yield zctx
    proxy.stop()
    zctx.destroy(linger=0)


def start_pod(client: RuntimeClient, paths: RunPaths) -> tuple[str, str, Path]:
    lab = {"io.kubernetes.pod.uid": UID, "io.kubernetes.pod.name": "it",
           "io.kubernetes.pod.namespace": "default"}
    logdir = paths.pod_logs_dir / f"default_it_{UID}"
    logdir.mkdir(parents=True, exist_ok=True)
    scfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="it", namespace="default", uid=UID), labels=lab,
        log_directory=str(logdir),
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER))))
    sid = client.run_pod_sandbox(scfg)
    pidfile = paths.root / "pid"
    cfg = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="app"), image=pb.ImageSpec(image="host"),
        command=["/bin/sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"],
        labels={**lab, "io.kubernetes.container.name": "app"},
        annotations={"io.kubernetes.container.restartCount": "0",
                     "io.kubernetes.container.hash": "abc"},
        log_path="app/0.log")
    cid = client.create_container(sid, cfg, scfg)
    client.start_container(cid)
    return sid, cid, pidfile


def test_events_cache_and_kill_via_stream(runtime: Any, bus: zmq.Context[Any]) -> None:
    paths, client = runtime
    replica = MapReplica(bus, paths, PLEG, clock=SYSTEM_CLOCK)
    events = Subscriber(bus, paths, ["pleg.pod.event"])
    seen: list[tuple[str, str]] = []

    def pump() -> None:
        replica.pump(0.01)
        while (env := events.recv(0)) is not None:
            seen.append((env.message.type, env.message.container_id))  # type: ignore[attr-defined]

    pleg = Pleg(paths, bus)
    try:
        # one relist at start, one when the stream connected; from then on events alone
        health = until(lambda: (h := replica.get("_health")) is not None
                       and h.events_mode == "stream" and h.relists >= 2 and h, pump=pump)
        sid, cid, pidfile = start_pod(client, paths)
        until(lambda: ("ContainerStarted", cid) in seen and replica.get(UID), pump=pump)
        rec = until(lambda: replica.get(UID) if replica.get(UID).containers else None,
                    pump=pump)
        assert rec.name == "it" and rec.sandboxes[0].id == sid
        c = rec.containers[0]
        assert c.id == cid and c.state == "CONTAINER_RUNNING" and c.hash == "abc"
        pid = int(until(lambda: pidfile.exists() and pidfile.read_text().strip()))
        os.kill(pid, signal.SIGKILL)
        until(lambda: ("ContainerDied", cid) in seen, pump=pump)
        died = until(lambda: [x for x in replica.get(UID).containers
                              if x.state == "CONTAINER_EXITED"], pump=pump)[0]
        assert died.exit_code == 137 and died.finished_at > 0
        assert replica.get("_health").events_mode == "stream"
        # built from the runtime's events alone (the fallback relist is 30 s away), and it is
        # what a relist renders
        assert replica.get("_health").relists == health.relists
        fresh = new_relister(client)
        fresh.relist()
        assert _without_ts(replica.get(UID)) == _without_ts(pleg_value(fresh.records()[UID]))
    finally:
        pleg.stop()
        replica.close()
        events.close()


def test_restart_rebuilds_without_spurious_deaths(runtime: Any, bus: zmq.Context[Any]) -> None:
    paths, client = runtime
    _sid, cid, _pidfile = start_pod(client, paths)
    replica = MapReplica(bus, paths, PLEG, clock=SYSTEM_CLOCK)
    events = Subscriber(bus, paths, ["pleg.pod.event"])
    seen: list[tuple[str, str]] = []

    def pump() -> None:
        replica.pump(0.01)
        while (env := events.recv(0)) is not None:
            seen.append((env.message.type, env.message.container_id))  # type: ignore[attr-defined]

    first = Pleg(paths, bus)
    until(lambda: replica.get(UID) and replica.get(UID).containers, pump=pump)
    epoch = replica.epoch
    first.stop()
    second = Pleg(paths, bus)
    try:
        until(lambda: replica.epoch != epoch and replica.get(UID)
              and replica.get(UID).containers, pump=pump)
        assert replica.get(UID).containers[0].state == "CONTAINER_RUNNING"
        assert ("ContainerDied", cid) not in seen
    finally:
        second.stop()
        replica.close()
        events.close()
