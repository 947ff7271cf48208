"""Bad input end to end (real agent, embedded runtime): one staticPodPath holding invalid YAML,
a Deployment, a Pod without image, a 20 MiB file, two files with the same pod name, a Secret
volume, an unknown field, and 3 valid pods. Every valid pod runs; each bad file is reported
with its file name and a specific reason in the source's JSON log and in `podvisorctl events`;
the source process is never restarted. Plus bad requests to the read-only server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

POD = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: host
    command: ["sleep", "3600"]
{extra}"""

DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
"""

NO_IMAGE = """apiVersion: v1
kind: Pod
metadata:
  name: noimage
spec:
  containers:
  - name: app
    command: ["sleep", "3600"]
"""

SECRET = POD.format(name="secret", extra="""    volumeMounts:
    - name: creds
      mountPath: /creds
  volumes:
  - name: creds
    secret:
      secretName: creds
""")

UNKNOWN = POD.format(name="unknown", extra="    frobnicate: 3\n")

HOSTPORT = POD.format(name="hostport", extra="""    ports:
    - {name: a, containerPort: 8080, hostPort: 18080}
    - {name: b, containerPort: 8081, hostPort: 18080}
""")

# file -> (event reason, a word the log/event message must hold, log event name)
BAD = {
    "broken.yaml": ("FailedParse", "invalid YAML", "source.pod.invalid"),
    "deployment.yaml": ("WrongKind", "Deployment", "source.pod.invalid"),
    "noimage.yaml": ("FailedValidation", "image", "source.pod.invalid"),
    "huge.yaml": ("FileTooLarge", "larger than", "source.pod.invalid"),
    "dup-b.yaml": ("DuplicatePodName", "dup-a.yaml", "source.pod.duplicate"),
    "secret.yaml": ("ReferencesAPIObject", "Secret", "source.pod.invalid"),
    "unknown.yaml": ("UnsupportedField", "frobnicate", "source.pod.warning"),
}
RUNNING = {"ok1-e2e", "ok2-e2e", "ok3-e2e", "dup-e2e", "unknown-e2e"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(port: int, path: str, method: str = "GET") -> tuple[int, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")
    except (OSError, ValueError):
        return 0, None


def write_manifests(d: Path) -> None:
    for i in (1, 2, 3):
        (d / f"ok{i}.yaml").write_text(POD.format(name=f"ok{i}", extra=""))
    (d / "dup-a.yaml").write_text(POD.format(name="dup", extra=""))
    (d / "dup-b.yaml").write_text(POD.format(name="dup", extra="").replace("3600", "3601"))
    (d / "broken.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: [oops\n")
    (d / "deployment.yaml").write_text(DEPLOYMENT)
    (d / "noimage.yaml").write_text(NO_IMAGE)
    (d / "secret.yaml").write_text(SECRET)
    (d / "unknown.yaml").write_text(UNKNOWN)
    (d / "hostport.yaml").write_text(HOSTPORT)
    with (d / "huge.yaml").open("wb") as f:  # 20 MiB, sparse: the size alone rejects it
        f.write(b"apiVersion: v1\nkind: Pod\n# ")
        f.truncate(20 << 20)


def running(port: int) -> set[str]:
    code, body = request(port, "/pods")
    if code != 200:
        return set()
    return {p["metadata"]["name"] for p in body["items"]
            if p["status"].get("phase") == "Running"}


def source_log(root: Path) -> list[dict[str, Any]]:
    path = root / "logs" / "source-file.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def logged(root: Path) -> dict[str, list[dict[str, Any]]]:
    """file name -> the log records about it (invalid, duplicate, warning)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for rec in source_log(root):
        if rec.get("event", "").startswith("source.pod.") and "file" in rec:
            found.setdefault(Path(rec["file"]).name, []).append(rec)
    return found


def events(handle: Any) -> list[dict[str, Any]]:
    out = handle.ctl("events", "--json")
    assert out.returncode == 0, out.stderr
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def evented(handle: Any) -> dict[str, list[dict[str, Any]]]:
    """file name -> the source's events about it."""
    found: dict[str, list[dict[str, Any]]] = {}
    for e in events(handle):
        if e["involvedObject"].get("file") and e["source"]["component"] == "source-file":
            found.setdefault(Path(e["involvedObject"]["file"]).name, []).append(e)
    return found


@pytest.mark.timeout(170)
def test_bad_manifests_reported_valid_ones_run(agent: Any, wait_for: Any) -> None:
    port = free_port()
    manifests = Path(tempfile.mkdtemp(prefix="pvbad", dir="/tmp"))
    try:
        write_manifests(manifests)
        handle = agent(config={
            "nodeName": "e2e", "port": 0, "staticPodPath": str(manifests), "readOnlyPort": port,
            "stopPodsOnExit": True, "opsPort": 0,
            "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})
        root = handle.paths.root
        wait_for(lambda: running(port) == RUNNING, 90.0, message="valid pods Running")

        logs = wait_for(lambda: (f := logged(root)).keys() >= BAD.keys() and f,
                        30.0, message="every bad file in the source log")
        for name, (reason, word, event_name) in BAD.items():
            recs = [r for r in logs[name] if r["event"] == event_name
                    and r["file"] == str(manifests / name) and word in json.dumps(r)
                    and r.get("code", reason) == reason]
            assert recs, (name, logs[name])
        assert Path(logs["dup-b.yaml"][0]["first"]).name == "dup-a.yaml"
        assert "dup-a.yaml" not in logs  # the first of the two runs, unreported

        evs = wait_for(lambda: (e := evented(handle)).keys() >= BAD.keys() and e, 30.0,
                       message="every bad file in podvisorctl events")
        for name, (reason, word, _) in BAD.items():
            hits = [e for e in evs[name] if e["type"] == "Warning" and e["reason"] == reason
                    and word in e["message"] and name in e["message"]]
            assert hits, (name, evs[name])
            assert all(e["count"] == 1 for e in evs[name]), evs[name]  # relists do not repeat
        assert evs["dup-b.yaml"][0]["involvedObject"]["name"] == "dup-e2e"
        # the valid pods' own events came from the sync loop
        started = {e["involvedObject"].get("name") for e in events(handle)
                   if e["reason"] == "Started"}
        assert started >= RUNNING

        text = handle.ctl("events")
        assert text.returncode == 0 and "FileTooLarge" in text.stdout
        assert "LAST SEEN" in text.stdout.splitlines()[0]

        status = json.loads(handle.ctl("status", "--json").stdout)
        src = next(p for p in status["processes"] if p["name"] == "source-file")
        assert src["state"] == "RUNNING" and src["restarts"] == 0, src

        # bad requests to the read-only server: JSON errors, the server keeps serving
        code, body = request(port, "/no/such/path")
        assert code == 404 and body["kind"] == "Status" and body["reason"] == "NotFound"
        code, body = request(port, "/pods", method="POST")
        assert code == 405 and body["reason"] == "MethodNotAllowed"
        assert running(port) == RUNNING

        # valid but not admitted: in /pods as Failed with the reason, and a Warning event
        code, body = request(port, "/pods")
        hp = next(p for p in body["items"] if p["metadata"]["name"] == "hostport-e2e")
        assert hp["status"]["phase"] == "Failed", hp["status"]
        assert hp["status"]["reason"] == "HostPortConflict" and "18080" in hp["status"]["message"]
        assert any(e["reason"] == "HostPortConflict" and e["type"] == "Warning"
                   and e["involvedObject"].get("name") == "hostport-e2e"
                   and e["source"]["component"] == "syncloop" for e in events(handle))
    finally:
        shutil.rmtree(manifests, ignore_errors=True)


@pytest.mark.timeout(120)
def test_events_survive_agent_restart(agent: Any, wait_for: Any) -> None:
    manifests = Path(tempfile.mkdtemp(prefix="pvbad", dir="/tmp"))
    try:
        (manifests / "deployment.yaml").write_text(DEPLOYMENT)
        handle = agent(config={"nodeName": "e2e", "port": 0, "staticPodPath": str(manifests),
                               "opsPort": 0, "supervision": {"heartbeatInterval": "200ms"}})
        wait_for(lambda: "deployment.yaml" in evented(handle), 30.0)
        assert handle.stop() == 0
        saved = handle.paths.state_dir / "events.jsonl"
        assert "WrongKind" in saved.read_text()
        # the same rootDir again, without the bad file: the event was kept
        (manifests / "deployment.yaml").unlink()
        again = type(handle)(handle.root, handle.config, [], dict(os.environ))  # AgentHandle
        try:
            again.wait_ready()
            kept = evented(again)
            assert [e["reason"] for e in kept["deployment.yaml"]] == ["WrongKind"]
        finally:
            assert again.stop() == 0
    finally:
        shutil.rmtree(manifests, ignore_errors=True)
