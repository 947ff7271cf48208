"""SyncPod's image step (KUBELET.md "Images, pulls and logs"): pull policy, ErrImagePull then
ImagePullBackOff with doubling delays, ErrImageNeverPull, InvalidImageName, the Pulling/Pulled
events with durations, and pulls serialized through the slots."""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.common.logs import MemoryLogger
from podvisor.services.cri import CriError
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.events.logbridge import events_for
from podvisor.services.pod.imageref import image_reference_error
from podvisor.services.pod.model import Pod
from podvisor.services.pod.parse import pod_from_dict
from podvisor.services.syncloop.backoff import BackoffPolicy, CrashBackoff, SharedBackoff
from podvisor.services.syncloop.keyring import (
    DOCKER_CONFIG_JSON,
    DOCKERCFG,
    Credential,
    Keyring,
    KeyringError,
    parse_config,
    repository,
)
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


@pytest.mark.parametrize("code,message", [
    (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"),
    (grpc.StatusCode.UNKNOWN, "Stream removed"),  # the runtime killed during the pull
])
def test_a_pull_cut_off_by_the_runtime_going_away_is_no_back_off(
        tmp_path: Path, code: grpc.StatusCode, message: str) -> None:
    """Issue 22: the runtime's crash is not the image's fault. The sync says the runtime is
    down (retried at the runtime's back-off, as soon as it answers) and the next sync pulls
    again, with no ImagePullBackOff; a real failure still backs off."""
    h = Harness(tmp_path, {"reg.local/app:1"})
    real_pull = h.cri.pull_image
    cut = [True]

    def pull(image: str, *args: Any, **kwargs: Any) -> str:
        if cut.pop() if cut else False:
            h.cri.pulls.append(image)
            raise CriError("PullImage", code, message)
        return real_pull(image, *args, **kwargs)

    h.cri.pull_image = pull  # type: ignore[method-assign]
    p = pod("reg.local/app:1")
    r = sync_pod(h.deps, p)
    assert r.waiting["c"].reason == "ErrImagePull" and r.runtime_down
    r = sync_pod(h.deps, p)  # at once: no back-off recorded
    assert r.ok and h.cri.pulls == ["reg.local/app:1", "reg.local/app:1"]
    assert CriError("PullImage", code, message).unavailable
    assert not CriError("PullImage", grpc.StatusCode.UNKNOWN, "no such image").unavailable


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


# --- [issue 24] registry credentials: imagePullSecrets and the node's config.json ------------

class PrivateRegistry(Registry):
    """``priv.local:5000`` wants puller:s3cret; every attempt is recorded with its login."""

    def __init__(self, clock: Any, good: set[str]) -> None:
        super().__init__(clock, good)
        self.logins: list[tuple[str, str]] = []

    def pull_image(self, image: str, sandbox_config: Any = None, annotations: Any = None,
                   auth: Any = None) -> str:
        login = (auth.username, auth.password) if auth is not None else ("", "")
        self.logins.append(login)
        if image.startswith("priv.local:5000/") and login != ("puller", "s3cret"):
            raise CriError("PullImage", grpc.StatusCode.UNKNOWN,
                           "unauthorized: authentication required")
        return super().pull_image(image, sandbox_config, annotations, auth)


class Secrets:
    """The API objects reader as the sync loop uses it for pull Secrets."""

    def __init__(self, found: dict[str, tuple[str, dict[str, bytes]]]) -> None:
        self.found = found

    def pull_secret(self, namespace: str, name: str) -> tuple[str, dict[str, bytes]] | None:
        if name == "unreadable":
            raise OSError("the API server is unreachable")
        return self.found.get(name)


def docker_json(host: str, user: str, password: str) -> bytes:
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    return json.dumps({"auths": {host: {"auth": auth}}}).encode()


def secret_pod(secrets: list[str], image: str = "priv.local:5000/team/app:1") -> Pod:
    return pod_from_dict({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
                          "spec": {"imagePullSecrets": [{"name": n} for n in secrets],
                                   "containers": [{"name": "c", "image": image,
                                                   "command": ["sleep", "1"]}]}}).pod


def test_pull_secrets_are_tried_in_turn_and_the_wrong_type_is_ignored(tmp_path: Path) -> None:
    image = "priv.local:5000/team/app:1"
    h = Harness(tmp_path, {image})
    h.cri = PrivateRegistry(h.cri._clock, {image})
    secrets = Secrets({
        "stale": (DOCKER_CONFIG_JSON, {".dockerconfigjson": docker_json(
            "priv.local:5000", "puller", "old")}),
        "opaque": ("Opaque", {".dockerconfigjson": docker_json(
            "priv.local:5000", "x", "y")}),
        "current": (DOCKERCFG, {".dockercfg": json.dumps({"https://priv.local:5000/v1/": {
            "username": "puller", "password": "s3cret"}}).encode()})})
    h.deps = replace(h.deps, cri=h.cri, objects=cast(Any, secrets))
    r = sync_pod(h.deps, secret_pod(["stale", "opaque", "current", "unreadable"]))
    assert r.ok, r.errors
    assert h.cri.logins == [("puller", "old"), ("puller", "s3cret")]  # no anonymous try
    assert ("Warning", "FailedToRetrieveImagePullSecret",
            "Unable to retrieve some image pull secrets (unreadable); attempting to pull the "
            "image may not succeed.") in h.events()


def test_all_credentials_failing_is_err_image_pull_naming_each(tmp_path: Path) -> None:
    image = "priv.local:5000/team/app:1"
    h = Harness(tmp_path, {image})
    h.cri = PrivateRegistry(h.cri._clock, {image})
    secrets = Secrets({n: (DOCKER_CONFIG_JSON, {".dockerconfigjson": docker_json(
        "priv.local:5000", "puller", n)}) for n in ("a", "b")})
    h.deps = replace(h.deps, cri=h.cri, objects=cast(Any, secrets))
    r = sync_pod(h.deps, secret_pod(["a", "b"]))
    assert r.waiting["c"].reason == "ErrImagePull"
    assert r.waiting["c"].message == (
        f'Failed to pull image "{image}": [unauthorized: authentication required, '
        "unauthorized: authentication required]")


def test_node_credentials_serve_a_static_pod_with_no_api(tmp_path: Path) -> None:
    """A static pod naming a pull Secret with no API connection: the kubelet says so
    (FailedToRetrieveImagePullSecret) and pulls with the node's own credentials
    (``<rootDir>/config.json``)."""
    image = "priv.local:5000/team/app:1"
    h = Harness(tmp_path, {image})
    h.cri = PrivateRegistry(h.cri._clock, {image})
    (tmp_path / "config.json").write_bytes(docker_json("priv.local:5000", "puller", "s3cret"))
    h.deps = replace(h.deps, cri=h.cri, docker_config_paths=(tmp_path / "none", tmp_path))
    assert sync_pod(h.deps, secret_pod(["regcred"])).ok
    assert h.cri.logins == [("puller", "s3cret")]
    assert any(e[1] == "FailedToRetrieveImagePullSecret" for e in h.events())
    # an image of another registry: no credential matches, an anonymous pull
    h.cri.good.add("other.local/app:1")
    assert sync_pod(h.deps, secret_pod([], "other.local/app:1")).ok
    assert h.cri.logins[-1] == ("", "")


def test_keyring_matching_is_the_kubelets() -> None:
    cred = Credential("u", "p")
    ring = Keyring([("*.example.com", cred), ("reg.example.com/team", Credential("t", "p")),
                    ("https://index.docker.io/v1/", Credential("hub", "p")),
                    ("localhost:5000", Credential("l", "p"))])
    assert [c.username for c in ring.lookup("reg.example.com/team/app")] == ["t", "u"]
    assert [c.username for c in ring.lookup("reg.example.com/other")] == ["u"]
    assert ring.lookup("a.b.example.com/x") == []  # a glob stands for one host part
    assert [c.username for c in ring.lookup(repository("busybox"))] == ["hub"]
    assert ring.lookup("localhost:5001/x") == []  # the port must match
    assert repository("127.0.0.1:5000/a/b:1@sha256:" + "0" * 64) == "127.0.0.1:5000/a/b"
    with pytest.raises(KeyringError, match="base64"):
        parse_config(json.dumps({"auths": {"h": {"auth": "bm9jb2xvbg=="}}}).encode(), "s",
                     auths=True)
