"""API-backed pod data end to end (embedded runtime, stand-in API server): env from a ConfigMap
and a Secret (configMapKeyRef, secretKeyRef, envFrom), configMap and secret volumes and the
projected service-account volume the ServiceAccount admission plugin adds to every pod (token
from the TokenRequest API, kube-root-ca.crt, the namespace); a ConfigMap update reaches the
file mounted in the running container through the object's watch (the default
``configMapAndSecretChangeDetectionStrategy: Watch``): at once, with ``syncFrequency`` far
away, and with no GET of the object (nothing polled)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kubeapi import ApiError, KubeApi
from tests.support.lifecycle import free_port

NODE = "e2e-data"
LOOP = ("echo \"$FROM_CM|$FROM_SECRET|$P_color\" > /marks/env; "
        "while true; do cat /etc/cfg/key > /marks/cfg.tmp && mv /marks/cfg.tmp /marks/cfg; "
        "cat /var/run/secrets/kubernetes.io/serviceaccount/namespace > /marks/ns; "
        "sleep 0.2; done")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=1.0)
    server.start()
    yield server
    server.stop()


def data_pod(marks: Path) -> dict[str, Any]:
    return {"metadata": {"name": "data"}, "spec": {
        "nodeName": NODE, "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "cfg", "configMap": {"name": "app"}},
                    {"name": "sec", "secret": {"secretName": "creds",
                                               "items": [{"key": "password",
                                                          "path": "pw"}]}},
                    {"name": "marks", "hostPath": {"path": str(marks)}}],
        "containers": [{
            "name": "c", "image": "host", "command": ["sh", "-c", LOOP],
            "env": [{"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {
                        "name": "app", "key": "key"}}},
                    {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {
                        "name": "creds", "key": "password"}}},
                    {"name": "MISSING", "valueFrom": {"configMapKeyRef": {
                        "name": "nope", "key": "x", "optional": True}}}],
            "envFrom": [{"prefix": "P_", "configMapRef": {"name": "app"}}],
            "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"},
                             {"name": "sec", "mountPath": "/etc/sec"},
                             {"name": "marks", "mountPath": "/marks"}]}]}}


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def test_configmap_secret_env_volumes_and_service_account(api: KubeApi, agent: Any,
                                                          wait_for: Callable[..., Any],
                                                          tmp_path: Path) -> None:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", user=f"system:node:{NODE}",
                                groups=("system:nodes",))
    marks = tmp_path / "marks"
    marks.mkdir()
    api.store.create("configmaps", "default", {"metadata": {"name": "app"},
                                               "data": {"key": "v1", "color": "blue"}})
    api.store.create("secrets", "default", {"metadata": {"name": "creds"}, "data": {
        "password": base64.b64encode(b"s3cret").decode()}})
    created = api.create_pod("default", data_pod(marks))
    uid = created["metadata"]["uid"]
    handle = agent(config={
        "nodeName": NODE, "kubeconfig": str(kubeconfig), "readOnlyPort": free_port(),
        "syncFrequency": "10m", "stopPodsOnExit": True,
        "supervision": {"heartbeatInterval": "200ms", "shutdownTimeout": "30s"}})
    wait_for(lambda: read(marks / "env"), timeout=60, message="the container's env")
    assert read(marks / "env") == "v1|s3cret|blue"
    wait_for(lambda: read(marks / "ns") == "default", timeout=30)
    volumes = handle.paths.pods_dir / uid / "volumes"
    assert read(volumes / "kubernetes.io~secret" / "sec" / "pw") == "s3cret"
    [access] = (volumes / "kubernetes.io~projected").iterdir()
    token = read(access / "token")
    assert api.tokens[token][0] == "system:serviceaccount:default:default"
    assert api.token_requests[-1]["spec"]["boundObjectRef"]["uid"] == uid
    assert read(access / "ca.crt").startswith("-----BEGIN CERTIFICATE-----")
    assert (access / "..data").is_symlink()
    # a ConfigMap update reaches the file mounted in the running container
    assert read(marks / "cfg") == "v1"
    api.store.update("configmaps", "default", "app",
                     lambda cm: {**cm, "data": {"key": "v2", "color": "blue"}})
    wait_for(lambda: read(marks / "cfg") == "v2", timeout=30,
             message="the ConfigMap update in the mounted file")
    cm = "/api/v1/namespaces/default/configmaps"
    assert api.count("GET", f"{cm}/app") == 0  # read through its watch: never polled
    assert any(r.path == cm and "metadata.name%3Dapp" in r.query for r in api.requests)

    def phase() -> str:
        try:
            return str(api.store.get("pods", "default", "data").get("status", {}).get("phase"))
        except ApiError:
            return ""

    # status-api writes the pod's status as its version advances: it may trail the container
    wait_for(lambda: phase() == "Running", timeout=30, message="phase Running in the API")
    # the pod deleted: once it is terminated nobody references the objects: watches end
    api.store.delete("pods", "default", "data", grace=1)

    def watch_ended(name: str) -> bool:
        return any(r.path == cm and "watch=" in r.query and f"metadata.name%3D{name}" in r.query
                   for r in api.requests)

    wait_for(lambda: watch_ended("app") and watch_ended("kube-root-ca.crt"), timeout=60,
             message="the ConfigMaps' watches stopped with the last pod referencing them")
