"""TLS bootstrap and rotation below the agent (issue 26): the stand-in's CSR API and signers
through the official client, the pair store's crash safety at every step, the rotation
deadline, the kubelet's CSR name, and one ``Manager`` bootstrapping and rotating in-process
against the stand-in (the real client, real files)."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from podvisor.ipc.clock import SYSTEM_CLOCK
from podvisor.services.apiserver import ApiConnection, ApiError
from podvisor.services.certificates import csr
from podvisor.services.certificates.kubeconfig import client_pair, read_kubeconfig
from podvisor.services.certificates.manager import Manager, rotation_deadline, satisfies
from podvisor.services.certificates.store import PairStore, load_pair
from tests.support.kubeapi import KubeApi
from tests.support.kubeapi.bootstrap import (
    Approver,
    admin_kubeconfig,
    bootstrap_kubeconfig,
    create_token,
)

NODE = "boot-node"
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def _add(self, event: str, **kw: Any) -> None:
        self.events.append((event, kw))

    info = warning = error = debug = _add

    def named(self, event: str) -> list[dict[str, Any]]:
        return [kw for e, kw in self.events if e == event]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(tmp_path / "kubeapi")
    server.start()
    yield server
    server.stop()


def _request(key: bytes, template: csr.Template) -> dict[str, Any]:
    return {"metadata": {"name": csr.digested_name(key, template)},
            "spec": {"request": base64.b64encode(csr.make_csr(key, template)).decode(),
                     "signerName": template.signer, "usages": list(template.usages)}}


def test_standin_csr_api_signers_and_bootstrap_tokens(api: KubeApi, tmp_path: Path) -> None:
    from kubernetes import client, config

    token = create_token(api)
    boot = ApiConnection(str(bootstrap_kubeconfig(api, tmp_path / "boot", token)))
    key = csr.new_key()
    template = csr.Template(NODE, csr.CLIENT_SIGNER, csr.CLIENT_USAGES)
    created = boot.request("POST", CSRS, body=_request(key, template))
    assert created["spec"]["username"] == f"system:bootstrap:{token[:6]}"
    assert "system:bootstrappers" in created["spec"]["groups"]
    assert "system:authenticated" in created["spec"]["groups"]
    # kubeadm's RBAC: a bootstrap token may only use the CSR API
    with pytest.raises(ApiError) as err:
        boot.request("GET", "/api/v1/nodes")
    assert err.value.status == 403
    assert boot.request("GET", "/version")["major"] == "1"
    # validation as kube-apiserver: signerName and usages required, a parseable request
    for broken in ({"signerName": ""}, {"usages": []}, {"request": "bm90IGEgY3Ny"},
                   {"usages": ["client auth", "client auth"]}, {"expirationSeconds": 60}):
        body = _request(csr.new_key(), template)
        body["spec"].update(broken)
        with pytest.raises(ApiError) as err:
            boot.request("POST", CSRS, body=body)
        assert err.value.status == 422, broken
    # the official client approves (PUT .../approval); the signer signs in a second write
    admin = config.new_client_from_config(str(admin_kubeconfig(api, tmp_path / "admin")))
    certs = client.CertificatesV1Api(admin)
    name = created["metadata"]["name"]
    obj = certs.read_certificate_signing_request(name)
    obj.status.conditions = [client.V1CertificateSigningRequestCondition(
        type="Approved", status="True", reason="Test", message="ok")]
    certs.replace_certificate_signing_request_approval(name, obj)
    got = csr.wait(boot, name, created["metadata"]["uid"], threading.Event(),
                   SYSTEM_CLOCK.monotonic() + 20, SYSTEM_CLOCK)
    assert got is not None
    pair = load_pair(_write(tmp_path / "pair.pem", got + key))
    assert pair.common_name == f"system:node:{NODE}" and pair.organizations == ("system:nodes",)
    # a serving CSR without an address fails the signer's validation (Failed condition)
    bad = csr.Template(NODE, csr.SERVING_SIGNER, csr.SERVING_USAGES)
    node_conn = ApiConnection(str(api.kubeconfig(tmp_path / "node", user=f"system:node:{NODE}",
                                                 groups=("system:nodes",))))
    failed = node_conn.request("POST", CSRS, body=_request(csr.new_key(), bad))
    api.approve_csr(failed["metadata"]["name"])
    with pytest.raises(csr.CsrFailed, match="SignerValidationFailure"):
        csr.wait(node_conn, failed["metadata"]["name"], "", threading.Event(),
                 SYSTEM_CLOCK.monotonic() + 20, SYSTEM_CLOCK)
    # denied: the waiter ends with the reason
    denied = node_conn.request("POST", CSRS, body=_request(csr.new_key(), template))
    obj = certs.read_certificate_signing_request(denied["metadata"]["name"])
    obj.status.conditions = [client.V1CertificateSigningRequestCondition(
        type="Denied", status="True", reason="NotYou", message="no")]
    certs.replace_certificate_signing_request_approval(denied["metadata"]["name"], obj)
    with pytest.raises(csr.CsrFailed, match="denied, reason: NotYou"):
        csr.wait(node_conn, denied["metadata"]["name"], "", threading.Event(),
                 SYSTEM_CLOCK.monotonic() + 20, SYSTEM_CLOCK)
    admin.close()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _signed_pair(api: KubeApi, tmp: Path, seconds: float = 3600) -> tuple[bytes, bytes]:
    key = csr.new_key()
    conn = ApiConnection(str(api.kubeconfig(tmp / f"k{len(list(tmp.iterdir()))}",
                                            user=f"system:node:{NODE}",
                                            groups=("system:nodes",))))
    template = csr.Template(NODE, csr.CLIENT_SIGNER, csr.CLIENT_USAGES)
    name, uid = csr.request(conn, key, template, name=csr.digested_name(key, template),
                            now=SYSTEM_CLOCK.wall())
    api.csr.signing_duration = seconds
    api.approve_csr(name)
    cert = csr.wait(conn, name, uid, threading.Event(), SYSTEM_CLOCK.monotonic() + 20,
                    SYSTEM_CLOCK)
    assert cert is not None
    return cert, key


class Crash(Exception):
    pass


@pytest.mark.parametrize("point", ["pair.before_file", "pair.before_symlink",
                                   "pair.before_swap", "pair.after_swap"])
def test_a_crash_at_any_step_leaves_a_usable_pair(api: KubeApi, tmp_path: Path,
                                                  point: str) -> None:
    old_cert, old_key = _signed_pair(api, tmp_path)
    new_cert, new_key = _signed_pair(api, tmp_path)
    pki = tmp_path / "pki"
    PairStore(pki, "kubelet-client").update(old_cert, old_key, 1000.0)

    def crash(at: str) -> None:
        if at == point:
            raise Crash(at)

    store = PairStore(pki, "kubelet-client", crash)
    store.save_pending_key(new_key)
    with pytest.raises(Crash):
        store.update(new_cert, new_key, 2000.0)
    # a new process: recover, then the current pair loads and is one of the two, whole
    after = PairStore(pki, "kubelet-client")
    after.recover()
    pair = after.current()
    assert pair is not None
    assert (pair.cert_pem, pair.key_pem) in ((old_cert, old_key), (new_cert, new_key))
    if point != "pair.after_swap":
        assert (pair.cert_pem, pair.key_pem) == (old_cert, old_key)
        assert after.pending_key() == new_key  # the request it was for is not lost
    assert not list(pki.glob(".*.tmp")) and not (pki / "kubelet-client-updated.pem").exists()


def test_recover_finishes_a_swap_cut_between_remove_and_rename(tmp_path: Path,
                                                               api: KubeApi) -> None:
    cert, key = _signed_pair(api, tmp_path)
    pki = tmp_path / "pki"
    store = PairStore(pki, "kubelet-client")
    pair = store.update(cert, key, 1000.0)
    store.current_path.unlink()  # client-go's store removes current before the rename
    (pki / "kubelet-client-updated.pem").symlink_to(pair.path.name)
    store.recover()
    assert store.current() is not None and store.current_path.is_symlink()


def test_rotation_deadline_is_70_to_90_percent_of_the_lifetime(api: KubeApi,
                                                               tmp_path: Path) -> None:
    cert, key = _signed_pair(api, tmp_path)
    pair = load_pair(_write(tmp_path / "p.pem", cert + key))
    life = pair.not_after - pair.not_before
    assert rotation_deadline(pair, lambda: 0.0) == pytest.approx(pair.not_before + 0.7 * life)
    assert rotation_deadline(pair, lambda: 1.0) == pytest.approx(pair.not_before + 0.9 * life)
    serving = csr.Template(NODE, csr.SERVING_SIGNER, csr.SERVING_USAGES, ("h",), ("10.0.0.1",))
    assert not satisfies(pair, serving)  # a missing address means a new certificate now
    assert satisfies(pair, csr.Template(NODE, csr.CLIENT_SIGNER, csr.CLIENT_USAGES))


def test_digested_name_is_the_kubelets(tmp_path: Path) -> None:
    key = csr.new_key()
    template = csr.Template(NODE, csr.CLIENT_SIGNER, csr.CLIENT_USAGES)
    name = csr.digested_name(key, template)
    assert name.startswith("node-csr-") and len(name) == len("node-csr-") + 43
    assert name == csr.digested_name(key, template)  # same key, same request
    assert name != csr.digested_name(csr.new_key(), template)


def _drive(manager: Manager) -> None:
    """What the process's service loop worker does with ``Manager.step`` (services/certificates
    /main.py), on a plain thread: each turn at the time the previous one returned."""
    while (due := manager.step(SYSTEM_CLOCK.monotonic())) is not None:
        manager.stop.wait(max(0.0, due - SYSTEM_CLOCK.monotonic()))


def test_manager_bootstraps_then_rotates_in_process(api: KubeApi, tmp_path: Path) -> None:
    token = create_token(api)
    boot = bootstrap_kubeconfig(api, tmp_path / "bootstrap-kubeconfig", token)
    kubeconfig = tmp_path / "kubeconfig"
    api.csr.signing_duration, api.csr.backdate = 30.0, 0.0
    approver = Approver(admin_kubeconfig(api, tmp_path / "admin")).start()
    store = PairStore(tmp_path / "pki", "kubelet-client")
    conns: dict[str, ApiConnection] = {}

    def conn(path: Path) -> ApiConnection:
        return conns.setdefault(str(path), ApiConnection(str(path)))

    def on_update(pair: Any) -> None:
        from podvisor.services.certificates.kubeconfig import write_kubeconfig
        write_kubeconfig(kubeconfig, read_kubeconfig(boot).cluster, store.current_path)

    log = Log()
    manager = Manager("client", store, lambda: csr.Template(NODE, csr.CLIENT_SIGNER,
                                                            csr.CLIENT_USAGES),
                      lambda pair: conn(kubeconfig) if pair else conn(boot), SYSTEM_CLOCK, log,
                      rotate=True, digested_name=True,
                      current=lambda: store.current(), on_update=on_update)
    thread = threading.Thread(target=_drive, args=(manager,), daemon=True)
    thread.start()
    try:
        import time
        deadline = time.monotonic() + 60
        while manager.rotations < 2 and time.monotonic() < deadline:
            manager.stop.wait(0.1)
        assert manager.rotations >= 2, log.events
    finally:
        manager.stop.set()
        thread.join(5)
        approver.stop()
    first, second = log.named("certificates.issued")[:2]
    assert first["csr"].startswith("node-csr-")
    # the bootstrap CSR came with the token, the rotation with the node's own certificate
    users = {r.user for r in api.requests if r.method == "POST" and r.path == CSRS}
    assert users == {f"system:bootstrap:{token[:6]}", f"system:node:{NODE}"}
    pair = client_pair(read_kubeconfig(kubeconfig))
    assert pair is not None and pair.serial != int(first["serial"], 16)
    assert yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["client-certificate"] \
        == str(store.current_path)
    life = second["not_after"] - second["not_before"]
    assert life == pytest.approx(30.0, abs=1)


def test_api_connection_waits_for_its_kubeconfig_and_takes_a_new_pair(api: KubeApi,
                                                                      tmp_path: Path) -> None:
    """Before TLS bootstrap wrote the kubeconfig a request is ApiUnreachable; once written it
    works; after the pair behind the symlink changed, the next request (also on a kept-alive
    connection's pool) uses the new certificate, and an expired old one is never presented."""
    from podvisor.services.apiserver import ApiUnreachable
    from podvisor.services.certificates.kubeconfig import write_kubeconfig

    kubeconfig = tmp_path / "kubeconfig"
    conn = ApiConnection(str(kubeconfig))
    with pytest.raises(ApiUnreachable, match="does not exist"):
        conn.request("GET", "/version")
    store = PairStore(tmp_path / "pki", "kubelet-client")
    first = store.update(*_signed_pair(api, tmp_path, seconds=3600), SYSTEM_CLOCK.wall())
    write_kubeconfig(kubeconfig, {"server": api.url, "certificate-authority": str(api.ca_file)},
                     store.current_path)
    conn.request("GET", "/api/v1/namespaces")
    conn.request("GET", "/api/v1/namespaces")  # the same kept-alive connection
    second = store.update(*_signed_pair(api, tmp_path, seconds=3600), SYSTEM_CLOCK.wall() + 1)
    conn.request("GET", "/api/v1/namespaces/default")
    serials = [int(r.serial, 16) for r in api.requests
               if r.path.startswith("/api/v1/namespaces") and r.serial]
    assert serials[:2] == [first.serial, first.serial] and serials[-1] == second.serial
    assert conn.reloads == 1
    conn.close()


def test_rotation_waits_out_an_unreachable_api_server_then_bootstraps_again(
        api: KubeApi, tmp_path: Path) -> None:
    """The API server gone at the deadline: the manager backs off (client-go's steps) while the
    current pair serves; gone past its expiry: the node's credentials are no good any more and
    the bootstrap kubeconfig asks (kubelet ``clientsetFn``)."""
    import time

    token = create_token(api)
    boot = bootstrap_kubeconfig(api, tmp_path / "bootstrap-kubeconfig", token)
    api.csr.signing_duration, api.csr.backdate = 12.0, 0.0
    approver = Approver(admin_kubeconfig(api, tmp_path / "admin")).start()
    store = PairStore(tmp_path / "pki", "kubelet-client")
    kubeconfig = tmp_path / "kubeconfig"
    conns: dict[str, ApiConnection] = {}

    def conn(path: Path) -> ApiConnection:
        return conns.setdefault(str(path), ApiConnection(str(path)))

    def on_update(pair: Any) -> None:
        from podvisor.services.certificates.kubeconfig import write_kubeconfig
        write_kubeconfig(kubeconfig, read_kubeconfig(boot).cluster, store.current_path)

    log = Log()
    manager = Manager("client", store, lambda: csr.Template(NODE, csr.CLIENT_SIGNER,
                                                            csr.CLIENT_USAGES),
                      lambda pair: conn(kubeconfig) if pair else conn(boot), SYSTEM_CLOCK, log,
                      rotate=True, digested_name=True, on_update=on_update)
    thread = threading.Thread(target=_drive, args=(manager,), daemon=True)
    thread.start()

    def until(check: Any, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"{what}: {log.events[-5:]}"
            manager.stop.wait(0.1)

    try:
        until(lambda: manager.rotations >= 1, "bootstrapped")
        approver.stop()
        api.stop()
        pair = store.current()
        assert pair is not None
        until(lambda: len(log.named("certificates.request_failed")) >= 2, "backing off")
        delays = [e["retry_in"] for e in log.named("certificates.request_failed")]
        assert 2.0 <= delays[0] <= 2.3 and 4.0 <= delays[1] <= 4.5
        until(lambda: SYSTEM_CLOCK.wall() > pair.not_after + 1, "the pair expired", 30)
        api.start()
        approver = Approver(admin_kubeconfig(api, tmp_path / "admin2")).start()
        until(lambda: manager.rotations >= 2, "a new pair after the outage", 90)
    finally:
        manager.stop.set()
        thread.join(5)
        approver.stop()
    boot_user = f"system:bootstrap:{token[:6]}"
    posts = [r.user for r in api.requests if r.method == "POST" and r.path == CSRS
             and r.code == 201]
    assert posts[0] == boot_user and posts[-1] == boot_user  # the expired pair: bootstrap again
