"""Units of the main port: config keys, token file, authentication, attributes, log options and
the CRI log decoder, redaction; and the application over real HTTP in-process (403 from a
denying authorizer, anonymous when enabled)."""

from __future__ import annotations

import asyncio
import datetime
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web

from podvisor.common.config import (
    ConfigError,
    config_from_mapping,
    config_to_mapping,
)
from podvisor.common.timefmt import parse_rfc3339
from podvisor.ipc.control import ProcessRow
from podvisor.services.server.auth import (
    ANONYMOUS,
    AlwaysAllow,
    Attributes,
    Authenticator,
    TokenFileError,
    User,
    attributes,
    load_token_file,
    user_from_cert,
)
from podvisor.services.server.containerlogs import (
    Decoder,
    LogRequestError,
    parse_options,
)
from podvisor.services.server.mainport import REDACTED, make_main_app, redact_config
from podvisor.services.server.metrics import render_metrics
from podvisor.services.server.replicas import View
from podvisor.services.server.tls import serving_context, serving_pair
from tests.support.plegs import pleg_map

# --- config ---


def test_authentication_and_authorization_keys_round_trip() -> None:
    cfg = config_from_mapping({
        "port": 10250, "tlsCertFile": "/c.crt", "tlsPrivateKeyFile": "/c.key",
        "authentication": {"anonymous": {"enabled": True}, "x509": {"clientCAFile": "/ca"},
                           "tokenFile": "/t.csv", "webhook": {"enabled": False,
                                                              "cacheTTL": "1m"}},
        "authorization": {"mode": "AlwaysAllow", "webhook": {"cacheAuthorizedTTL": "1m"}}})
    assert cfg.authentication.anonymous_enabled and cfg.authentication.client_ca_file == "/ca"
    assert cfg.authentication.token_file == "/t.csv" and cfg.tls_cert_file == "/c.crt"
    assert config_from_mapping(config_to_mapping(cfg)) == cfg
    default = config_from_mapping({})
    assert default.port == 10250 and not default.authentication.anonymous_enabled
    assert default.authorization.mode == "AlwaysAllow"


@pytest.mark.parametrize(("raw", "key", "words"), [
    ({"authorization": {"mode": "Webhook"}}, "authorization.mode", "API server"),
    ({"authorization": {"mode": "AlwaysDeny"}}, "authorization.mode", "AlwaysAllow"),
    ({"authentication": {"webhook": {"enabled": True}}}, "authentication.webhook.enabled",
     "API server"),
    ({"authentication": {"anonymous": {"enabled": "yes please"}}},
     "authentication.anonymous.enabled", ""),
    ({"authentication": {"x509": {"clientCAfile": "/ca"}}},
     "authentication.x509.clientCAfile", "unknown"),
    ({"authentication": {"tokenfile": "/t"}}, "authentication.tokenfile", "unknown"),
    ({"authentication": "on"}, "authentication", "map"),
    ({"tlsCertFile": "/c.crt"}, "tlsPrivateKeyFile", "together"),
])
def test_bad_auth_config_names_the_key(raw: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mapping(raw)
    assert err.value.key == key
    assert words in str(err.value)


def test_relative_auth_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    from podvisor.common.config import load_config

    (tmp_path / "c.yaml").write_text("authentication:\n  tokenFile: tokens.csv\n"
                                     "  x509: {clientCAFile: ca.crt}\n"
                                     "tlsCertFile: s.crt\ntlsPrivateKeyFile: s.key\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.authentication.token_file == str(tmp_path / "tokens.csv")
    assert cfg.authentication.client_ca_file == str(tmp_path / "ca.crt")
    assert cfg.tls_cert_file == str(tmp_path / "s.crt")


def test_configz_redacts_header_values() -> None:
    cfg = config_to_mapping(config_from_mapping(
        {"staticPodURL": "http://x", "staticPodURLHeader": {"Authorization": ["Bearer x"]}}))
    out = redact_config(cfg)
    assert out["staticPodURLHeader"] == {"Authorization": [REDACTED]}
    assert "Bearer x" not in repr(out)


# --- tokens and users ---


def test_token_file_in_kube_apiserver_format(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text('# comment\nabc,alice,1000,"dev,ops"\n\nxyz,bob,1001\n')
    tokens = load_token_file(f)
    assert tokens["abc"] == User("alice", "1000", ("dev", "ops"))
    assert tokens["xyz"] == User("bob", "1001", ())


@pytest.mark.parametrize(("text", "words"), [("abc,alice\n", "line 1"),
                                             ("a,b,c\na,d,e\n", "duplicate"),
                                             (",alice,1\n", "line 1")])
def test_bad_token_file_names_the_line(tmp_path: Path, text: str, words: str) -> None:
    f = tmp_path / "t.csv"
    f.write_text(text)
    with pytest.raises(TokenFileError, match=words):
        load_token_file(f)
    with pytest.raises(TokenFileError, match="cannot read"):
        load_token_file(tmp_path / "missing.csv")


def test_authenticator_order_and_anonymous() -> None:
    tokens = {"abc": User("alice", "1", ("dev",))}
    strict = Authenticator(tokens, anonymous=False)
    user, _ = strict.authenticate("Bearer abc", None)
    assert user is not None and user.name == "alice"
    assert user.groups == ("dev", "system:authenticated")
    assert strict.authenticate("Bearer nope", None)[0] is None
    assert strict.authenticate("Basic abc", None)[0] is None
    assert strict.authenticate(None, None) == (None, strict.authenticate(None, {})[1])
    cert = {"subject": ((("commonName", "carol"),), (("organizationName", "ops"),))}
    by_cert, _ = strict.authenticate(None, cert)
    assert by_cert is not None and by_cert.name == "carol" and "ops" in by_cert.groups
    lax = Authenticator(tokens, anonymous=True)
    assert lax.authenticate(None, None)[0] == ANONYMOUS
    assert lax.authenticate("Bearer nope", None)[0] is None  # a bad token is never anonymous
    assert user_from_cert({"subject": ()}) is None


def test_attributes_as_the_kubelet() -> None:
    assert attributes("GET", "/stats/summary", "n") == Attributes("get", "nodes", "stats", "n",
                                                                  "/stats/summary")
    assert attributes("GET", "/metrics/probes", "n").subresource == "metrics"
    assert attributes("POST", "/exec/ns/p/c", "n").verb == "create"
    assert attributes("GET", "/pods", "n").subresource == "proxy"


# --- logs ---


def test_rfc3339_with_nanoseconds_and_offsets() -> None:
    assert parse_rfc3339("2024-01-02T03:04:05.123456789Z") == pytest.approx(
        datetime.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=datetime.UTC).timestamp())
    assert parse_rfc3339("2024-01-02T04:04:05+01:00") == parse_rfc3339("2024-01-02T03:04:05Z")
    with pytest.raises(ValueError):
        parse_rfc3339("2024-01-02T03:04:05")


def test_decoder_joins_partials_and_keeps_first_timestamp() -> None:
    dec = Decoder()
    out = dec.feed(b"2024-01-02T03:04:05.1Z stdout P hel\n2024-01-02T03:04:06Z stderr F "
                   b"err\n2024-01-02T03:04:07Z stdout F lo\ngarbage\n2024-01-02T03:04:08Z std")
    assert [(ln.timestamp, ln.text) for ln in out] == [
        (b"2024-01-02T03:04:06Z", b"err\n"), (b"2024-01-02T03:04:05.1Z", b"hello\n"),
        (b"", b"garbage\n")]
    assert dec.feed(b"out F x\n")[0].text == b"x\n"


def test_log_options() -> None:
    opts = parse_options({"follow": "true", "tailLines": "3", "sinceSeconds": "10",
                          "limitBytes": "5", "timestamps": "1"}, 1000.0)
    assert (opts.follow, opts.tail_lines, opts.since, opts.limit_bytes, opts.timestamps) == (
        True, 3, 990.0, 5, True)
    with pytest.raises(LogRequestError, match="tailLines"):
        parse_options({"tailLines": "-2"}, 0.0)


# --- metrics ---


def _pleg_view() -> View:
    def c(cid: str, state: str) -> dict[str, str]:
        return {"id": cid, "name": cid, "state": state}
    pleg = pleg_map({
        "_health": {"last_relist_ok": 1700000000.5, "relists": 7, "relist_errors": 1},
        "u1": {"sandboxes": [{"id": "s1", "state": "SANDBOX_READY"}],
               "containers": [c("a", "CONTAINER_RUNNING"), c("b", "CONTAINER_EXITED")]},
        "u2": {"sandboxes": [{"id": "s2", "state": "SANDBOX_NOTREADY"}],
               "containers": [c("c", "CONTAINER_EXITED"), c("d", "?")]},
    })
    return View(pleg=pleg, pleg_synced=True)


ROWS = [ProcessRow.from_wire(r) for r in (
    {"name": "pleg", "state": "RUNNING", "restarts": 2, "heartbeatAge": 0.25},
    {"name": "prober", "state": "BACKOFF", "restarts": 5, "heartbeatAge": None})]


def test_metrics_from_the_pleg_view_and_the_processes() -> None:
    text = render_metrics(_pleg_view(), ROWS).decode()
    assert 'podvisor_process_restarts_total{process="prober"} 5.0' in text
    assert 'podvisor_process_state{process="prober",state="BACKOFF"} 1.0' in text
    assert 'podvisor_process_state{process="prober",state="RUNNING"} 0.0' in text
    assert 'podvisor_heartbeat_age_seconds{process="pleg"} 0.25' in text
    assert 'podvisor_heartbeat_age_seconds{process="prober"}' not in text
    assert "podvisor_process" not in render_metrics(_pleg_view(), None).decode()
    assert "kubelet_running_pods 1.0" in text
    assert 'kubelet_running_containers{container_state="exited"} 2.0' in text
    assert 'kubelet_running_containers{container_state="unknown"} 1.0' in text
    assert "kubelet_pleg_last_seen_seconds 1.7000000005e+09" in text
    assert "podvisor_pleg_relists_total 7.0" in text


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian package prometheus; "
                           ".ci/test-packages.txt)")
def test_metrics_pass_promtool() -> None:
    text = render_metrics(_pleg_view(), ROWS)
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


# --- the application in-process, over real HTTPS ---


class Deny:
    def authorize(self, user: User, attrs: Attributes) -> tuple[bool, str]:
        return False, "denied by test"


def _serve_and_get(tmp_path: Path, authz: Any, anonymous: bool, path: str,
                   headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    now = datetime.datetime.now(datetime.UTC)
    pair = serving_pair(str(tmp_path), "", "", "n", "127.0.0.1", now)
    ssl_ctx = serving_context(pair, "")
    view = View(desired={}, statuses={}, desired_synced=True, statuses_synced=True)

    class Log:
        def info(self, event: str, **kw: Any) -> None: ...
        def debug(self, event: str, **kw: Any) -> None: ...

    app = make_main_app(lambda: view, authn=Authenticator({"t": User("u")}, anonymous),
                        authz=authz, node_name="n", root_dir=str(tmp_path), config={},
                        log=Log(), stopping=lambda: False)

    async def go() -> tuple[int, dict[str, Any]]:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_ctx)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            import ssl
            client_ctx = ssl.create_default_context(cafile=str(pair.cert))
            async with ClientSession() as session, session.get(
                    f"https://127.0.0.1:{port}{path}", headers=headers, ssl=client_ctx) as resp:
                return resp.status, await resp.json()
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_forbidden_is_403_with_the_attributes(tmp_path: Path) -> None:
    code, body = _serve_and_get(tmp_path, Deny(), False, "/pods", {"Authorization": "Bearer t"})
    assert code == 403 and body["reason"] == "Forbidden"
    assert "user=u" in body["message"] and "denied by test" in body["message"]


def test_anonymous_only_when_enabled(tmp_path: Path) -> None:
    assert _serve_and_get(tmp_path, AlwaysAllow(), True, "/configz", {})[0] == 200
    assert _serve_and_get(tmp_path, AlwaysAllow(), False, "/configz", {})[0] == 401
    key = tmp_path / "pki" / "kubelet.key"
    assert key.stat().st_mode & 0o777 == 0o600


def test_podvisorctl_top_without_a_runtime_exits_2(tmp_path: Path) -> None:
    ctl = Path(sys.executable).parent / "podvisorctl"
    done = subprocess.run([str(ctl), "--root-dir", str(tmp_path), "top"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and "did not answer ListContainerStats" in done.stderr


def test_auth_flags_use_the_kubelet_names() -> None:
    import argparse

    from podvisor.cli.flags import add_config_flags, overrides_from_args

    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    args = parser.parse_args(["--anonymous-auth", "true", "--client-ca-file", "/ca.crt",
                              "--token-auth-file", "/t.csv", "--authorization-mode",
                              "AlwaysAllow", "--tls-cert-file", "/s.crt",
                              "--tls-private-key-file", "/s.key", "--port", "0"])
    cfg = config_from_mapping(overrides_from_args(args))
    assert cfg.authentication.anonymous_enabled and cfg.authentication.client_ca_file == "/ca.crt"
    assert cfg.authentication.token_file == "/t.csv" and cfg.tls_cert_file == "/s.crt"
    assert cfg.port == 0
    bad = parser.parse_args(["--authorization-mode", "Webhook"])
    with pytest.raises(ConfigError, match="API server"):
        config_from_mapping(overrides_from_args(bad))


def _rotated_container_dir(tmp_path: Path) -> Path:
    """A container log dir as imagegc's rotation leaves it: instance 0 rotated twice (the older
    file gzipped) and its last file, instance 1 live."""
    import gzip

    cdir = tmp_path / "default_web_uid1" / "c"
    cdir.mkdir(parents=True)

    def recs(first: int, count: int) -> bytes:
        return b"".join(f"2026-01-01T00:00:{s:02d}.000000001Z stdout F line{s}\n".encode()
                        for s in range(first, first + count))

    with gzip.open(cdir / "0.log.20260101-000003.gz", "wb") as packed:
        packed.write(recs(0, 3) + b"2026-01-01T00:00:03.000000001Z stdout P split-\n")
    (cdir / "0.log.20260101-000006").write_bytes(
        b"2026-01-01T00:00:03.000000002Z stdout F across\n" + recs(4, 2))
    (cdir / "0.log").write_bytes(recs(6, 2))
    (cdir / "1.log").write_bytes(recs(20, 2))
    return tmp_path


@pytest.mark.parametrize(("opts", "expect"), [
    ({"previous": True}, [b"line0", b"line1", b"line2", b"split-across", b"line4", b"line5",
                          b"line6", b"line7"]),
    ({"previous": True, "tail_lines": 4}, [b"line4", b"line5", b"line6", b"line7"]),
    ({"previous": True, "since": 1767225605.0}, [b"line5", b"line6", b"line7"]),
    ({"previous": True, "limit_bytes": 20}, [b"line0", b"line1", b"line2", b"sp"]),
    ({}, [b"line20", b"line21"]),
])
def test_container_logs_read_across_rotation(tmp_path: Path, opts: dict[str, Any],
                                             expect: list[bytes]) -> None:
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from podvisor.services.server.containerlogs import (
        LogOptions,
        find_container_files,
        serve_logs,
    )

    pod_logs = _rotated_container_dir(tmp_path)
    files = find_container_files(pod_logs, "default", "web", "c", set)
    assert [f.name for f in files] == ["0.log", "1.log"]  # rotated files are not instances

    async def handler(request: web.Request) -> web.StreamResponse:
        return await serve_logs(request, files, LogOptions(**opts), lambda: True)

    async def fetch() -> bytes:
        app = web.Application()
        app.router.add_get("/", handler)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            resp = await client.get("/")
            assert resp.status == 200
            return await resp.read()

    body = asyncio.run(fetch())
    if "limit_bytes" in opts:
        assert body == b"\n".join(expect) and len(body) == 20
    else:
        assert body.splitlines() == expect


def test_ctl_logs_and_the_main_port_share_the_rotation_reader(tmp_path: Path) -> None:
    from podvisor.cli.ctl_logs import tail_lines
    from podvisor.common.crilog import with_rotated

    cdir = _rotated_container_dir(tmp_path) / "default_web_uid1" / "c"
    assert [p.name for p in with_rotated(cdir / "0.log")] == [
        "0.log.20260101-000003.gz", "0.log.20260101-000006", "0.log"]
    assert tail_lines(with_rotated(cdir / "0.log"), 2) == [b"line6\n", b"line7\n"]


_IMAGEGC_CHILD = """
from cri_api.v1 import api_pb2 as pb
from podvisor.common.logs import MemoryLogger
from podvisor.services.cri.fake import FakeRuntimeClient
from podvisor.services.imagegc import Usage
from podvisor.services.imagegc.service import EventSink, ImageGC

cri = FakeRuntimeClient()
cri.images.clear()  # no built-in host image: two images of 100 bytes, both unused
cri.images.update({f"sha256:{i}": pb.Image(id=f"sha256:{i}", repo_tags=[f"r/{i}:1"], size=100)
                   for i in "ab"})
gc = ImageGC(cri, lambda: Usage(1000, 950), MemoryLogger(),
             EventSink(lambda t, r, m, o: None, lambda: None), "node", 85, 80, 0.0)
gc.step(0.0, {}, None)
"""


def test_image_gc_metrics_through_the_multiprocess_directory(tmp_path: Path) -> None:
    """imagegc's counters land in prometheus-client's multiprocess directory (as in the agent,
    where the supervisor sets PROMETHEUS_MULTIPROC_DIR) and the main port's /metrics sums them,
    a restarted imagegc's counts included."""
    import os
    import sys

    mdir = tmp_path / "metrics"
    mdir.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mdir)}
    for _ in range(2):  # two imagegc processes in turn: the counts add up
        subprocess.run([sys.executable, "-c", _IMAGEGC_CHILD], env=env, check=True,
                       timeout=60)
    text = render_metrics(_pleg_view(), ROWS, str(mdir)).decode()
    assert 'kubelet_image_garbage_collected_total{reason="space"} 4.0' in text
    assert "podvisor_image_gc_freed_bytes_total 400.0" in text
    assert "podvisor_image_gc_failures_total" in text
    assert "podvisor_image_fs_usage_percent" in text
    if shutil.which("promtool"):
        done = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                              capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_summary_logs_count_rotated_files_and_image_fs_from_cri(tmp_path: Path) -> None:
    from cri_api.v1 import api_pb2 as pb

    from podvisor.services.server.summary import image_fs_stats, log_usage, summary

    pod_logs = _rotated_container_dir(tmp_path)
    cdir = pod_logs / "default_web_uid1" / "c"
    total = sum(f.stat().st_size for f in cdir.iterdir())
    usage = log_usage(str(pod_logs))
    assert usage == {("uid1", "c"): (total, 4)}  # 0.log, 1.log and two rotated (one .gz)
    info = pb.ImageFsInfoResponse(image_filesystems=[pb.FilesystemUsage(
        timestamp=1_700_000_000_000_000_000, fs_id=pb.FilesystemIdentifier(
            mountpoint=str(tmp_path)), used_bytes=pb.UInt64Value(value=1234),
        inodes_used=pb.UInt64Value(value=7))])
    image_fs = image_fs_stats(info)
    assert image_fs is not None
    assert image_fs["usedBytes"] == 1234 and image_fs["inodesUsed"] == 7
    assert image_fs["capacityBytes"] > 0 and image_fs["time"].startswith("2023-11-14T")
    assert image_fs_stats(pb.ImageFsInfoResponse()) is None
    stats = [pb.ContainerStats(
        attributes=pb.ContainerAttributes(id="c1", metadata=pb.ContainerMetadata(name="c"),
                                          labels={"io.kubernetes.pod.uid": "uid1",
                                                  "io.kubernetes.pod.name": "web",
                                                  "io.kubernetes.pod.namespace": "default"}),
        cpu=pb.CpuUsage(timestamp=1, usage_core_nano_seconds=pb.UInt64Value(value=5)))]
    body = summary("n", 0, {}, stats, {}, usage, image_fs, 1_700_000_000_000_000_000)
    assert body["node"]["runtime"]["imageFs"] == image_fs
    assert body["pods"][0]["containers"][0]["logs"]["usedBytes"] == total
