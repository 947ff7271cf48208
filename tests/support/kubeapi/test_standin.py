"""The stand-in API server, driven by the official ``kubernetes`` client over HTTPS (token and
client certificate), so the semantics the agent relies on are pinned by tests of their own."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.support.kubeapi import KubeApi
from tests.support.kubeapi.others import mark_pods_not_ready, set_condition

MERGE = "application/merge-patch+json"
SMP = "application/strategic-merge-patch+json"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path_factory.mktemp("kubeapi"), window=50, bookmark_interval=0.3)
    server.start()
    yield server
    server.stop()


def core(api: KubeApi, tmp: Path, token: str | None = None) -> client.CoreV1Api:
    path = api.kubeconfig(tmp / "kubeconfig", user="system:node:n1",
                          groups=("system:nodes",), token=token)
    return client.CoreV1Api(config.new_client_from_config(str(path)))


def pod(name: str, node: str = "n1") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [
        {"name": "c", "image": "busybox"}]}}


def watch_lines(v1: client.CoreV1Api, **kw: Any) -> list[dict[str, Any]]:
    resp = v1.list_pod_for_all_namespaces(watch=True, _preload_content=False, **kw)
    try:
        return [json.loads(line) for line in resp.read().decode().splitlines() if line]
    finally:
        resp.release_conn()


def test_auth_tls_token_and_client_cert(api: KubeApi, tmp_path: Path) -> None:
    by_cert = core(api, tmp_path)
    by_token = core(api, tmp_path, token="t0k3n")
    assert by_cert.read_namespace("default").metadata.name == "default"
    assert by_token.read_namespace("default").metadata.name == "default"
    assert api.requests[-1].user == "system:node:n1"
    anonymous = client.Configuration()
    anonymous.host = api.url
    anonymous.ssl_ca_cert = str(api.ca_file)
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(client.ApiClient(anonymous)).read_namespace("default")
    assert err.value.status == 401


def test_create_conflicts_patch_and_uid_precondition(api: KubeApi, tmp_path: Path) -> None:
    v1 = core(api, tmp_path)
    created = v1.create_namespaced_pod("default", pod("p1"))
    assert created.status.phase == "Pending" and created.metadata.uid
    # ServiceAccount admission: the kube-api-access volume and its mounts
    assert created.spec.volumes[0].name.startswith("kube-api-access-")
    assert created.spec.containers[0].volume_mounts[0].mount_path == \
        "/var/run/secrets/kubernetes.io/serviceaccount"
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod("default", pod("p1"))
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "AlreadyExists"
    uid = created.metadata.uid
    patched = v1.patch_namespaced_pod_status(
        "p1", "default", {"metadata": {"uid": uid}, "status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        _content_type=SMP)
    assert patched.status.phase == "Running"
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)
    # strategic merge: conditions merge on "type"
    patched = v1.patch_namespaced_pod_status(
        "p1", "default", {"status": {"conditions": [
            {"type": "Initialized", "status": "True"}]}}, _content_type=SMP)
    assert {c.type for c in patched.status.conditions} == {"Ready", "Initialized"}
    # merge patch replaces lists
    patched = v1.patch_namespaced_pod_status(
        "p1", "default", {"status": {"conditions": [
            {"type": "PodScheduled", "status": "True"}]}}, _content_type=MERGE)
    assert [c.type for c in patched.status.conditions] == ["PodScheduled"]
    # status through the main resource is ignored; spec through status is ignored
    v1.patch_namespaced_pod("p1", "default", {"status": {"phase": "Failed"}},
                            _content_type=MERGE)
    assert v1.read_namespaced_pod("p1", "default").status.phase == "Running"
    with pytest.raises(ApiException) as err:
        v1.patch_namespaced_pod_status("p1", "default", {"metadata": {"uid": "other"}},
                                       _content_type=MERGE)
    assert err.value.status == 409 and "Precondition failed" in err.value.body
    with pytest.raises(ApiException) as err:
        v1.patch_namespaced_pod("p1", "default", {"metadata": {
            "resourceVersion": created.metadata.resource_version, "labels": {"a": "b"}}},
            _content_type=MERGE)
    assert err.value.status == 409 and "the object has been modified" in err.value.body
    with pytest.raises(ApiException) as err:
        v1.read_namespaced_pod("nope", "default")
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod("missing-ns", pod("x"))
    assert err.value.status == 404


def test_graceful_deletion(api: KubeApi, tmp_path: Path) -> None:
    v1 = core(api, tmp_path)
    uid = v1.create_namespaced_pod("default", pod("gd")).metadata.uid
    marked = v1.delete_namespaced_pod("gd", "default", grace_period_seconds=5)
    assert marked.metadata.deletion_timestamp is not None
    assert marked.metadata.deletion_grace_period_seconds == 5
    # a longer grace never extends it
    again = v1.delete_namespaced_pod("gd", "default", grace_period_seconds=30)
    assert again.metadata.deletion_grace_period_seconds == 5
    with pytest.raises(ApiException) as err:
        v1.delete_namespaced_pod("gd", "default", body=client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid="wrong")))
    assert err.value.status == 409
    v1.delete_namespaced_pod("gd", "default", body=client.V1DeleteOptions(
        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)))
    with pytest.raises(ApiException) as err:
        v1.read_namespaced_pod("gd", "default")
    assert err.value.status == 404
    # an unscheduled pod goes at once
    v1.create_namespaced_pod("default", pod("unsched", node=""))
    v1.delete_namespaced_pod("unsched", "default")
    assert api.store.objects.get(("pods", "default", "unsched")) is None


def test_list_watch_bookmarks_selector_and_expiry(api: KubeApi, tmp_path: Path) -> None:
    v1 = core(api, tmp_path)
    v1.create_namespaced_pod("default", pod("w-mine"))
    v1.create_namespaced_pod("default", pod("w-other", node="n2"))
    listed = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    names = {p.metadata.name for p in listed.items}
    assert "w-mine" in names and "w-other" not in names
    rv = listed.metadata.resource_version
    v1.patch_namespaced_pod("w-mine", "default", {"metadata": {"labels": {"x": "1"}}},
                            _content_type=MERGE)
    v1.delete_namespaced_pod("w-other", "default", grace_period_seconds=0)
    events = watch_lines(v1, field_selector="spec.nodeName=n1", resource_version=rv,
                         allow_watch_bookmarks=True, timeout_seconds=1)
    types = [e["type"] for e in events]
    assert types[0] == "MODIFIED" and events[0]["object"]["metadata"]["name"] == "w-mine"
    assert "BOOKMARK" in types and "DELETED" not in types  # w-other is not on n1
    mark = next(e for e in events if e["type"] == "BOOKMARK")
    assert int(mark["object"]["metadata"]["resourceVersion"]) >= int(rv)
    # without a version: ADDED for every current match first
    initial = watch_lines(v1, field_selector="spec.nodeName=n1", timeout_seconds=1)
    assert {e["object"]["metadata"]["name"] for e in initial if e["type"] == "ADDED"} >= \
        {"w-mine"}
    with pytest.raises(ApiException) as err:
        v1.list_pod_for_all_namespaces(field_selector="spec.bogus=1")
    assert err.value.status == 400
    api.store.compact()
    expired = watch_lines(v1, resource_version=rv, timeout_seconds=1)
    assert expired[0]["type"] == "ERROR" and expired[0]["object"]["code"] == 410


def test_node_lease_token_request_and_reviews(api: KubeApi, tmp_path: Path) -> None:
    apic = config.new_client_from_config(str(api.kubeconfig(
        tmp_path / "kc", user="system:node:n1", groups=("system:nodes",))))
    v1 = client.CoreV1Api(apic)
    node = v1.create_node({"metadata": {"name": "n1"}})
    with pytest.raises(ApiException) as err:
        v1.create_node({"metadata": {"name": "n1"}})
    assert err.value.status == 409
    patched = v1.patch_node_status("n1", {"status": {"addresses": [
        {"type": "InternalIP", "address": "10.0.0.1"}]}}, _content_type=SMP)
    patched = v1.patch_node_status("n1", {"status": {"addresses": [
        {"type": "Hostname", "address": "n1"}]}}, _content_type=SMP)
    assert {a.type for a in patched.status.addresses} == {"InternalIP", "Hostname"}
    leases = client.CoordinationV1Api(apic)
    lease = leases.create_namespaced_lease("kube-node-lease", {
        "metadata": {"name": "n1", "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                                        "name": "n1",
                                                        "uid": node.metadata.uid}]},
        "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40}})
    lease.spec.renew_time = "2026-01-01T00:00:00.000000Z"
    renewed = leases.replace_namespaced_lease("n1", "kube-node-lease", lease)
    assert int(renewed.metadata.resource_version) > int(lease.metadata.resource_version)
    with pytest.raises(ApiException) as err:  # the stale version now conflicts
        leases.replace_namespaced_lease("n1", "kube-node-lease", lease)
    assert err.value.status == 409
    created = v1.create_namespaced_pod("default", pod("tok"))
    tr = v1.create_namespaced_service_account_token("default", "default", {
        "spec": {"audiences": ["api"], "expirationSeconds": 3607, "boundObjectRef": {
            "kind": "Pod", "apiVersion": "v1", "name": "tok",
            "uid": created.metadata.uid}}})
    assert tr.status.token and tr.status.expiration_timestamp
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_service_account_token("default", "default", {
            "spec": {"expirationSeconds": 60}})
    assert err.value.status == 422
    review = client.AuthenticationV1Api(apic).create_token_review(
        {"spec": {"token": tr.status.token}})
    assert review.status.authenticated
    assert review.status.user.username == "system:serviceaccount:default:default"
    api.allowed.add("alice")
    sar = client.AuthorizationV1Api(apic).create_subject_access_review({"spec": {
        "user": "alice", "resourceAttributes": {"verb": "get", "resource": "nodes",
                                                "subresource": "proxy", "name": "n1"}}})
    assert sar.status.allowed


def test_ephemeral_containers_subresource_and_service_account_pull_secrets(
        api: KubeApi, tmp_path: Path) -> None:
    """[issue 24] ``pods/ephemeralcontainers`` as ``kubectl debug`` uses it (add only, never
    change or remove; the forbidden fields refused), and the ServiceAccount plugin copying the
    account's ``imagePullSecrets`` into a pod that names none."""
    v1 = core(api, tmp_path)
    v1.create_namespaced_pod("default", pod("dbg"))
    debug = {"name": "debugger-x", "image": "busybox", "targetContainerName": "c"}
    out = v1.patch_namespaced_pod_ephemeralcontainers(
        "dbg", "default", {"spec": {"ephemeralContainers": [debug]}}, _content_type=SMP)
    assert out.spec.ephemeral_containers[0].target_container_name == "c"
    assert out.spec.containers[0].name == "c"
    for bad, why in (({"spec": {"ephemeralContainers": []}}, "may not be removed"),
                     ({"spec": {"ephemeralContainers": [{**debug, "image": "other"}]}},
                      "may not be changed"),
                     ({"spec": {"ephemeralContainers": [debug, {
                         "name": "p", "image": "i", "ports": [{"containerPort": 1}]}]}},
                      "cannot be set for an Ephemeral Container")):
        with pytest.raises(ApiException) as err:
            v1.patch_namespaced_pod_ephemeralcontainers("dbg", "default", bad,
                                                        _content_type=MERGE)
        assert err.value.status == 422 and why in err.value.body
    api.store.create("serviceaccounts", "default", {
        "metadata": {"name": "builder"}, "imagePullSecrets": [{"name": "regcred"}]})
    created = api.create_pod("default", {**pod("pulls"), "spec": {
        **pod("pulls")["spec"], "serviceAccountName": "builder"}})
    assert created["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_resize_subresource_takes_cpu_and_memory_only(api: KubeApi, tmp_path: Path) -> None:
    """[issue 24] ``pods/resize`` (in-place resize, 1.33): the containers' CPU and memory
    change, nothing else of the pod does; the API server's refusals (a memory limit decrease
    under NotRequired, a QoS class change, any other field, a static pod) are 422."""
    v1 = core(api, tmp_path)
    res = {"requests": {"cpu": "100m", "memory": "64Mi"},
           "limits": {"cpu": "200m", "memory": "128Mi"}}
    body = pod("rs")
    body["spec"]["containers"][0]["resources"] = res
    v1.create_namespaced_pod("default", body)

    def patch(resources: dict[str, Any], **extra: Any) -> Any:
        return v1.patch_namespaced_pod_resize("rs", "default", {"spec": {"containers": [
            {"name": "c", "resources": resources, **extra}]}}, _content_type=SMP)

    bigger = {"requests": {"cpu": "200m", "memory": "64Mi"},
              "limits": {"cpu": "400m", "memory": "256Mi"}}
    out = patch(bigger)
    assert out.spec.containers[0].resources.limits == {"cpu": "400m", "memory": "256Mi"}
    assert v1.read_namespaced_pod_resize("rs", "default").spec.containers[0].resources.requests \
        == {"cpu": "200m", "memory": "64Mi"}
    for bad, why in (
            ({**bigger, "limits": {"cpu": "400m", "memory": "128Mi"}},
             "memory limits cannot be decreased unless resizePolicy is RestartContainer"),
            ({"requests": {"cpu": "400m", "memory": "256Mi"},
              "limits": {"cpu": "400m", "memory": "256Mi"}},
             "Pod QOS Class may not change as a result of resizing"),
            ({**bigger, "limits": {"cpu": "400m", "memory": "256Mi", "ephemeral-storage": "1Gi"}},
             "only cpu and memory resources are mutable")):
        with pytest.raises(ApiException) as err:
            patch(bad)
        assert err.value.status == 422 and why in err.value.body
    with pytest.raises(ApiException) as err:
        patch(bigger, image="other")
    assert err.value.status == 422 and "only cpu and memory resources are mutable" in \
        err.value.body
    mirror = pod("rs-mirror")
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "x"}
    api.store.create("pods", "default", mirror)
    with pytest.raises(ApiException) as err:
        v1.patch_namespaced_pod_resize("rs-mirror", "default", {"spec": {"containers": [
            {"name": "c", "resources": bigger}]}}, _content_type=SMP)
    assert err.value.status == 422 and "static pods cannot be resized" in err.value.body


def test_strategic_merge_of_a_pod_status(api: KubeApi, tmp_path: Path) -> None:
    """As kube-apiserver: container statuses have no merge key (replaced whole, a waiting
    state never merged into a running one); conditions merge on ``type`` (``$patch: delete``
    removes one); ``$patch: replace`` replaces a keyed list; ``null`` deletes a field."""
    v1 = core(api, tmp_path)
    uid = v1.create_namespaced_pod("default", pod("smp")).metadata.uid

    def cs(name: str, state: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "image": "busybox", "imageID": "", "ready": False,
                "restartCount": 0, "state": state}

    v1.patch_namespaced_pod_status("smp", "default", {"metadata": {"uid": uid}, "status": {
        "reason": "Pulling", "podIPs": [{"ip": "10.0.0.1"}], "containerStatuses": [
            cs("c", {"waiting": {"reason": "ContainerCreating"}}), cs("old", {})],
        "conditions": [{"type": "Ready", "status": "False"},
                       {"type": "example.com/gate", "status": "True"}]}}, _content_type=SMP)
    patched = v1.patch_namespaced_pod_status("smp", "default", {"status": {
        "reason": None, "podIPs": [{"ip": "10.0.0.2"}, {"$patch": "replace"}],
        "containerStatuses": [cs("c", {"running": {"startedAt": "2025-05-01T10:00:00Z"}})],
        "conditions": [{"type": "Ready", "$patch": "delete"},
                       {"type": "Initialized", "status": "True"}]}}, _content_type=SMP)
    st = patched.status
    assert [c.name for c in st.container_statuses] == ["c"]
    assert st.container_statuses[0].state.waiting is None
    assert st.container_statuses[0].state.running is not None
    assert [p.ip for p in st.pod_ips] == ["10.0.0.2"] and st.reason is None
    assert sorted(c.type for c in st.conditions) == ["Initialized", "example.com/gate"]


def test_a_restart_expires_older_versions_and_keeps_the_data(tmp_path: Path) -> None:
    """``stop()``: connections refused; what other clients write meanwhile is kept; ``start()``
    on the same port as a restarted kube-apiserver: a watch from a version before the restart
    gets 410 Expired, a list shows everything, a watch from its version goes on."""
    server = KubeApi(tmp_path / "kubeapi", bookmark_interval=0.3)
    server.start()
    try:
        v1 = core(server, tmp_path)
        v1.create_namespaced_pod("default", pod("r1"))
        v1.patch_namespaced_pod_status("r1", "default", {"status": {"conditions": [
            {"type": "Ready", "status": "True"}]}}, _content_type=SMP)
        rv = v1.list_namespaced_pod("default").metadata.resource_version
        port = server.port
        server.stop()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        assert mark_pods_not_ready(server.store, "n1", server.wall) == ["r1"]
        set_condition(server.store, "default", "r1", {"type": "example.com/gate",
                                                      "status": "False"}, server.wall)
        server.start()
        assert server.port == port
        expired = watch_lines(v1, resource_version=rv, timeout_seconds=1)
        assert expired[0]["type"] == "ERROR" and expired[0]["object"]["code"] == 410
        listed = v1.list_namespaced_pod("default")
        conds = {c.type: c.status for c in listed.items[0].status.conditions}
        assert conds == {"Ready": "False", "example.com/gate": "False"}
        assert int(listed.metadata.resource_version) > int(rv)
        events = watch_lines(v1, resource_version=listed.metadata.resource_version,
                             allow_watch_bookmarks=True, timeout_seconds=1)
        assert "ERROR" not in [e["type"] for e in events]
        # pods of other nodes and pods without a Ready condition are left alone
        assert mark_pods_not_ready(server.store, "n1", server.wall) == []
    finally:
        server.stop()
