"""SyncPod's image step (KUBELET.md "Images, pulls and logs"): pull policy, ErrImagePull then
ImagePullBackOff with doubling delays, ErrImageNeverPull, InvalidImageName, the Pulling/Pulled
events with durations, and pulls serialized through the slots."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as pb

from podvisor.common.logs import MemoryLogger
from podvisor.services.cri import CriError
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.events.logbridge import events_for
from podvisor.services.pod.imageref import image_reference_error
from podvisor.services.pod.model import Pod
from podvisor.services.pod.parse import pod_from_dict
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff, SharedBackoff
from podvisor.services.syncloop.syncpod import SyncDeps, sync_pod


class Registry(FakeRuntimeClient):
    """Pulls succeed for ``good`` images only (the registry's reason otherwise)."""

    def __init__(self, clock: Any, good: set[str]) -> None:
        super().__init__(clock=clock)
        self.good = good
        self.pulls: list[str] = []
        self.active = 0
        self.most = 0

    def pull_image(self, image: str, sandbox_config: Any = None, annotations: Any = None,
                   auth: Any = None) -> str:
        self.pulls.append(image)
        if image not in self.good:
            raise CriError("PullImage", grpc.StatusCode.NOT_FOUND,
                           "manifest unknown: manifest unknown")
        with self._lock:
            self.images[image] = pb.Image(id="sha256:" + "a" * 64, repo_tags=[image],
                                          size=1234)
        return "sha256:" + "a" * 64


def pod(image: str, policy: str | None = None, uid: str = "u1") -> Pod:
    c: dict[str, Any] = {"name": "c", "image": image, "command": ["sleep", "100"]}
    if policy:
        c["imagePullPolicy"] = policy
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": f"p-{uid}", "namespace": "default", "uid": uid},
                          "spec": {"containers": [c]}}).pod


class Harness:
    def __init__(self, tmp: Path, good: set[str]) -> None:
        self.now = 100.0
        self.cri = Registry(lambda: int((1e9 + self.now) * 1e9), good)
        self.log = MemoryLogger()
        self.deps = SyncDeps(
            cri=self.cri, pods_dir=tmp / "pods", pod_logs_dir=tmp / "pod-logs",
            backoff=SharedBackoff(CrashBackoff(BackoffPolicy(10, 300, 600))),
            image_backoff=SharedBackoff(CrashBackoff(BackoffPolicy(10, 300, 600))),
            mono=lambda: self.now, wall=lambda: 1e9 + self.now, log=self.log,
            sleep=lambda _s: None, pull_slots=threading.Semaphore(1))

    def events(self) -> list[tuple[str, str, str]]:
        return [e for rec in self.log.events for e in events_for(rec["event"], rec)]


def test_pull_then_present_with_events(tmp_path: Path) -> None:
    h = Harness(tmp_path, {"reg.local/app:1"})
    r = sync_pod(h.deps, pod("reg.local/app:1"))
    assert r.ok and h.cri.pulls == ["reg.local/app:1"]
    reasons = [(e[1], e[2]) for e in h.events()]
    assert ("Pulling", 'Pulling image "reg.local/app:1"') in reasons
    pulled = [m for r_, m in reasons if r_ == "Pulled"]
    assert pulled and pulled[0].startswith('Successfully pulled image "reg.local/app:1" in 0s')
    assert pulled[0].endswith("including waiting).")
    # IfNotPresent (a tag other than latest) and present: no pull, the kubelet's event.
    h2 = Harness(tmp_path, {"reg.local/app:1"})
    h2.cri.images["reg.local/app:1"] = pb.Image(id="x", repo_tags=["reg.local/app:1"])
    assert sync_pod(h2.deps, pod("reg.local/app:1")).ok and h2.cri.pulls == []
    assert ("Normal", "Pulled", 'Container image "reg.local/app:1" already present on '
                                "machine") in h2.events()


def test_missing_tag_err_image_pull_then_back_off_growing(tmp_path: Path) -> None:
    h = Harness(tmp_path, set())
    p = pod("reg.local/app:nope")
    delays = []
    r = sync_pod(h.deps, p)
    assert r.waiting["c"].reason == "ErrImagePull"
    assert "manifest unknown" in r.waiting["c"].message
    for _ in range(4):
        r = sync_pod(h.deps, p)
        assert r.waiting["c"].reason == "ImagePullBackOff"
        assert r.retry_after is not None
        delays.append(r.retry_after)
        h.now += r.retry_after
        r = sync_pod(h.deps, p)
        assert r.waiting["c"].reason == "ErrImagePull"
    assert delays == [10.0, 20.0, 40.0, 80.0]
    assert len(h.cri.pulls) == 5
    assert ("Warning", "Failed", 'ErrImagePull: Failed to pull image "reg.local/app:nope": '
                                 "manifest unknown: manifest unknown") in h.events()


def test_never_and_invalid_names(tmp_path: Path) -> None:
    h = Harness(tmp_path, set())
    r = sync_pod(h.deps, pod("reg.local/app:1", "Never"))
    assert r.waiting["c"].reason == "ErrImageNeverPull"
    assert r.waiting["c"].message == ('Container image "reg.local/app:1" is not present with '
                                      "pull policy of Never")
    r = sync_pod(h.deps, pod("Reg.local/App:1", uid="u2"))
    assert r.waiting["c"].reason == "InvalidImageName"
    assert h.cri.pulls == []


def test_reference_grammar() -> None:
    for good in ("busybox", "busybox:1.36", "127.0.0.1:5000/podvisor/busybox:1",
                 "localhost/x", "docker.io/library/nginx@sha256:" + "a" * 64, "host"):
        assert image_reference_error(good) is None, good
    for bad in ("", "UPPER", "a b", "x:", "x@sha256:12", "/x", "x//y"):
        assert image_reference_error(bad) is not None, bad


def test_pulls_are_serialized(tmp_path: Path) -> None:
    h = Harness(tmp_path, {f"reg.local/app{i}:1" for i in range(4)})
    inner = h.cri.pull_image
    lock = threading.Lock()

    def counting(image: str, *a: Any, **k: Any) -> str:
        with lock:
            h.cri.active += 1
            h.cri.most = max(h.cri.most, h.cri.active)
        try:
            return inner(image, *a, **k)
        finally:
            with lock:
                h.cri.active -= 1

    h.cri.pull_image = counting  # type: ignore[method-assign]
    threads = [threading.Thread(target=sync_pod, args=(h.deps, pod(f"reg.local/app{i}:1",
                                                                   uid=f"u{i}")))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(h.cri.pulls) == 4 and h.cri.most == 1
