"""A stand-in kube-apiserver for podvisor's tests (no real one can be installed here).

It serves HTTPS on 127.0.0.1 (a test CA from ``trustme``), authenticates a bearer token or a
client certificate (CN = user, O = groups) and answers 401 otherwise, and implements, faithfully
to the API's documented behaviour, what podvisor uses (see ``store.py`` for the storage
semantics):

- ``certificates.k8s.io/v1`` CertificateSigningRequests (+ ``approval``, ``status``), the
  built-in kubelet signers and bootstrap tokens (``csr.py``); a client certificate past its
  ``notAfter`` is 401 on every request, also on a connection opened before it expired, as
  kube-apiserver's x509 authenticator verifies per request;
- core/v1 ``pods`` (+ ``status``; ``ephemeralcontainers``, as ``kubectl debug`` uses it;
  ``exec``, ``attach``, ``portforward``: proxied to the node's main port as kube-apiserver
  does, see ``_proxy_to_node``), ``nodes`` (+ ``status``),
  ``namespaces``, ``configmaps``,
  ``secrets``, ``serviceaccounts`` (+ ``token``: TokenRequest), ``events``;
  ``coordination.k8s.io/v1`` ``leases``; ``node.k8s.io/v1`` ``runtimeclasses`` (``handler`` a
  DNS label, immutable); TokenReview and SubjectAccessReview;
- list (``resourceVersion`` in the list metadata) and watch (``watch=1``) with
  ``resourceVersion``, ``allowWatchBookmarks`` (BOOKMARK every ``bookmark_interval``),
  ``timeoutSeconds`` (else a server timeout randomised in [t, 2t) of ``watch_timeout``),
  ``fieldSelector`` (the fields the real server indexes per kind) and ``labelSelector``
  (equality-based); an expired version is a ``410 Expired`` ERROR event on a watch;
- create (409 AlreadyExists), PUT (409 Conflict on a stale resourceVersion), PATCH as
  ``application/merge-patch+json`` or ``application/strategic-merge-patch+json`` (a
  ``metadata.uid`` or ``metadata.resourceVersion`` in the patch is a precondition: 409),
  DELETE with ``DeleteOptions`` (``gracePeriodSeconds``, ``preconditions``);
- admission: NamespaceLifecycle (404 for a missing namespace) and ServiceAccount (default
  ``serviceAccountName``, the account's ``imagePullSecrets`` for a pod that names none, the
  ``kube-api-access-*`` projected volume and its mounts; a mirror pod may not reference a
  service account, secrets (pull secrets included) or configmaps' API objects).
Not implemented (answered 415/404, never silently wrong): JSON patch, server-side apply,
protobuf, pagination with ``continue``, other resources.

``KubeApi`` runs the server on a thread of the test process; ``stop()``/``start()`` take it off
the network (open watches cut, connections refused) and back on the same port with the same
data (the "API unreachable" tests), as a restarted kube-apiserver: its watch cache starts again
at the current resourceVersion, so a watch from an older version gets ``410 Expired`` and its
client lists again (``Store.compact`` at every start after the first). What other clients
write meanwhile (through another API server of the cluster: ``store`` writes, ``others.py``)
is in that list.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import json
import random
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import trustme
import yaml
from aiohttp import web

from podvisor.common.upgrade import (
    UpgradeError,
    connect_upgrade,
    finish_hijacked,
    hijack,
    splice,
)
from tests.support.kubeapi.csr import (
    BOOTSTRAP_GROUP,
    CsrApi,
    bootstrap_may,
    bootstrap_user,
    forbidden,
    seed_kubeadm_bindings,
)
from tests.support.kubeapi.patch import PatchError, merge_patch, strategic_merge_patch
from tests.support.kubeapi.protowire import PROTOBUF, csr_approval
from tests.support.kubeapi.resize import ResizeError, resized
from tests.support.kubeapi.store import KINDS, ApiError, Event, Obj, Store, not_found, now_rfc3339

FIELDS: dict[str, tuple[str, ...]] = {
    "pods": ("metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
             "spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork",
             "status.phase", "status.podIP", "status.nominatedNodeName"),
    "nodes": ("metadata.name", "spec.unschedulable"),
    "events": ("metadata.name", "metadata.namespace", "involvedObject.kind",
               "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
               "involvedObject.apiVersion", "involvedObject.resourceVersion",
               "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"),
    "secrets": ("metadata.name", "metadata.namespace", "type"),
    "certificatesigningrequests": ("metadata.name", "spec.signerName"),
}
GROUPS = ("coordination.k8s.io/v1", "certificates.k8s.io/v1", "rbac.authorization.k8s.io/v1",
          "storage.k8s.io/v1", "node.k8s.io/v1")
DEFAULT_FIELDS = ("metadata.name", "metadata.namespace")
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
MIRROR = "kubernetes.io/config.mirror"
NODE_PROXIED = ("exec", "attach", "portforward")
EPHEMERAL = "ephemeralcontainers"
RESIZE = "resize"
# what an ephemeral container may not set (validateEphemeralContainers)
EPHEMERAL_FORBIDDEN = ("ports", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle",
                       "resources", "resizePolicy", "restartPolicy")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    user: str
    code: int
    at: float  # when it was answered (a watch: when it ended)
    started: float = 0.0  # when it came in
    serial: str = ""  # the client certificate's serial (hex), when one authenticated it
    agent: str = ""  # its User-Agent


@dataclass
class Selector:
    terms: list[tuple[str, str, str]]  # (path, op "="|"!=", value) ; op "exists"/"!exists"

    @classmethod
    def fields(cls, text: str, resource: str) -> Selector:
        terms = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            op = "!=" if "!=" in part else "=="
            name, _, value = part.partition("!=" if op == "!=" else
                                            ("==" if "==" in part else "="))
            allowed = FIELDS.get(resource, DEFAULT_FIELDS)
            if name not in allowed:
                raise ApiError(400, "BadRequest", f'field label "{name}" not supported for '
                               f"{KINDS[resource][0]}")
            terms.append((name, op, value))
        return cls(terms)

    @classmethod
    def labels(cls, text: str) -> Selector:
        terms = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            if "!=" in part:
                k, _, v = part.partition("!=")
                terms.append(("metadata.labels." + k, "!=", v))
            elif "=" in part:
                k, _, v = part.partition("==" if "==" in part else "=")
                terms.append(("metadata.labels." + k, "==", v))
            elif part.startswith("!"):
                terms.append(("metadata.labels." + part[1:], "!exists", ""))
            else:
                terms.append(("metadata.labels." + part, "exists", ""))
        return cls(terms)

    def matches(self, obj: Obj) -> bool:
        for path, op, value in self.terms:
            found, got = _lookup(obj, path)
            text = ("true" if got else "false") if isinstance(got, bool) else \
                ("" if got is None else str(got))
            if (op == "==" and text != value) or (op == "!=" and text == value) or \
                    (op == "exists" and not found) or (op == "!exists" and found):
                return False
        return True


def _lookup(obj: Obj, path: str) -> tuple[bool, Any]:
    if path.startswith("metadata.labels."):
        labels = obj.get("metadata", {}).get("labels") or {}
        key = path[len("metadata.labels."):]
        return key in labels, labels.get(key)
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


@dataclass
class _Route:
    resource: str
    namespace: str | None  # None: all namespaces / cluster-scoped
    name: str
    sub: str


class KubeApi:
    """The stand-in server. ``tokens`` maps bearer tokens to (user, groups)."""

    def __init__(self, root: Path, *, wall: Callable[[], float] = time.time,
                 window: int = 1000, bookmark_interval: float = 60.0,
                 watch_timeout: float = 1800.0, kubeadm: bool = True) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.store = Store(wall, window=window)
        self.wall = wall
        self.bookmark_interval = bookmark_interval
        self.watch_timeout = watch_timeout
        self.tokens: dict[str, tuple[str, list[str]]] = {}
        self.token_extra: dict[str, dict[str, list[str]]] = {}  # a TokenReview's user.extra
        self.requests: list[Request] = []
        self.token_requests: list[Obj] = []
        self.reviews: list[Obj] = []
        self.authorize: Callable[[Obj], bool] = lambda spec: spec.get("user") in self.allowed
        self.allowed: set[str] = set()
        self.service_account_admission = True
        self._ca = trustme.CA()
        self._server_cert = self._ca.issue_cert("127.0.0.1", "localhost")
        self.ca_file = root / "ca.crt"
        self._ca.cert_pem.write_to_path(str(self.ca_file))
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._closing = threading.Event()
        self.starts = 0  # a start after the first is a restart
        # pods/exec|attach|portforward: the nodes run on this machine, reached on loopback
        # with the API server's own client certificate (``kubelet_client_ca``: its CA)
        self.kubelet_host = "127.0.0.1"
        self._kubelet_client = self._ca.issue_cert(
            "kube-apiserver.invalid", common_name="kube-apiserver-kubelet-client",
            organization_name="system:masters")
        self.kubelet_client_ca = self.ca_file
        self.csr = CsrApi(self.store, wall, self._ca)  # CSRs, signers, bootstrap tokens
        self.version: dict[str, str] = {"major": "1", "minor": "33",
                                         "gitVersion": "v1.33.0-standin"}
        self.node_proxy_requests: list[tuple[str, str, str]] = []  # method, URL, Upgrade
        for ns in ("default", "kube-system", "kube-node-lease", "kube-public"):
            self.seed_namespace(ns)
        if kubeadm:  # what `kubeadm init` binds for bootstrap tokens (csr.py)
            seed_kubeadm_bindings(self.store)

    # -- test-side helpers ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def seed_namespace(self, ns: str) -> None:
        """What the cluster's controllers create in every namespace: the Namespace, its
        ``default`` ServiceAccount and the ``kube-root-ca.crt`` ConfigMap."""
        self.store.create("namespaces", "", {"metadata": {"name": ns}})
        self.store.create("serviceaccounts", ns, {"metadata": {"name": "default"}})
        self.store.create("configmaps", ns, {"metadata": {"name": "kube-root-ca.crt"},
                                             "data": {"ca.crt": self._ca.cert_pem.bytes()
                                                      .decode()}})

    def create_pod(self, ns: str, pod: Obj) -> Obj:
        """Create a pod as a POST would: through the admission plugins (ServiceAccount)."""
        self.store.get("namespaces", "", ns)
        return self.store.create("pods", ns, self._admit_pod(ns, pod))

    def client_cert(self, user: str, groups: tuple[str, ...] = ()) -> tuple[Path, Path]:
        """A client certificate (CN ``user``, O ``groups``) and its key, as files."""
        cert = self._ca.issue_cert("client.invalid", common_name=user,
                                   organization_name=groups[0] if groups else None)
        safe = hashlib.sha1(user.encode()).hexdigest()[:10]
        crt, key = self.root / f"{safe}.crt", self.root / f"{safe}.key"
        cert.cert_chain_pems[0].write_to_path(str(crt))
        cert.private_key_pem.write_to_path(str(key))
        return crt, key

    def kubeconfig(self, path: Path, *, user: str, groups: tuple[str, ...] = (),
                   token: str | None = None) -> Path:
        """A kubeconfig for ``user``: a bearer token when given, else a client certificate."""
        entry: dict[str, Any]
        if token is not None:
            self.tokens[token] = (user, list(groups))
            entry = {"token": token}
        else:
            crt, key = self.client_cert(user, groups)
            entry = {"client-certificate": str(crt), "client-key": str(key)}
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
               "clusters": [{"name": "test", "cluster": {
                   "server": self.url, "certificate-authority": str(self.ca_file)}}],
               "users": [{"name": user, "user": entry}],
               "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}]}
        path.write_text(yaml.safe_dump(doc))
        return path

    def count(self, method: str = "", path_part: str = "", code: int | None = None) -> int:
        return sum(1 for r in list(self.requests)
                   if (not method or r.method == method) and path_part in r.path
                   and (code is None or r.code == code))

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> KubeApi:
        """Serve; after a ``stop()``, as a restarted kube-apiserver: the watch history starts
        at the current version (older versions expire)."""
        if self.starts:
            self.store.compact()
        self.starts += 1
        self._closing.clear()
        ready = threading.Event()
        errors: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:  # reported to start()
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=main, name="kubeapi", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        """Take the server off the network (open watches are cut); data is kept."""
        if self._thread is None or self._loop is None:
            return
        self._closing.set()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None

    async def _serve(self) -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_cert.configure_cert(ctx)
        self._ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_OPTIONAL
        app = web.Application(client_max_size=3 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.2,
                                     access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=ctx,
                           reuse_address=True)
        await site.start()
        if not self.port:
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- HTTP -----------------------------------------------------------------------------------
    def _user(self, request: web.Request) -> tuple[str, list[str]] | None:
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            token = auth[7:].strip()
            return self.tokens.get(token) or bootstrap_user(self.store, token, self.wall())
        transport = request.transport
        cert = transport.get_extra_info("peercert") if transport is not None else None
        if cert:
            now = self.wall()  # verified per request: a kept-alive connection's too
            if not ssl.cert_time_to_seconds(cert["notBefore"]) <= now < \
                    ssl.cert_time_to_seconds(cert["notAfter"]):
                return None
            cn = ""
            groups = []
            for rdn in cert.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        cn = value
                    elif key == "organizationName":
                        groups.append(value)
            if cn:
                return cn, groups
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        who = self._user(request)
        user = who[0] if who else ""
        try:
            if who is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if BOOTSTRAP_GROUP in who[1] and not bootstrap_may(
                    self.store, who[1], request.method, request.path.rstrip("/")):
                raise forbidden(user, request.method, request.path)
            response = await self._dispatch(request, who)
        except ApiError as exc:
            response = web.json_response(exc.status(), status=exc.code)
        except PatchError as exc:
            response = web.json_response(ApiError(422, "Invalid", str(exc)).status(),
                                         status=422)
        transport = request.transport
        cert = transport.get_extra_info("peercert") if transport is not None else None
        serial = str(cert.get("serialNumber", "")).lower() if cert and who and \
            not request.headers.get("Authorization") else ""
        self.requests.append(Request(request.method, request.path, request.query_string,
                                     user, response.status, time.monotonic(), started, serial,
                                     request.headers.get("User-Agent", "")))
        return response

    async def _dispatch(self, request: web.Request, who: tuple[str, list[str]],
                        ) -> web.StreamResponse:
        path = request.path.rstrip("/")
        if path in ("/version", "/healthz", "/readyz", "/livez"):
            if path == "/version":
                return web.json_response(self.version)
            return web.Response(text="ok")
        if request.method == "GET" and path in ("/api", "/apis", "/api/v1",
                                                *(f"/apis/{g}" for g in GROUPS)):
            return web.json_response(self._discovery(path))
        if request.method == "GET" and path.startswith("/openapi/v3"):
            return web.json_response(self._openapi(path))
        if path == "/apis/authentication.k8s.io/v1/tokenreviews" and request.method == "POST":
            return await self._token_review(request)
        if path == "/apis/authorization.k8s.io/v1/subjectaccessreviews" and \
                request.method == "POST":
            return await self._access_review(request)
        route = self._route(path)
        q = request.query
        if route.sub == "token" and route.resource == "serviceaccounts":
            if request.method != "POST":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
            return await self._token_request(request, route)
        if route.resource == "pods" and route.sub in NODE_PROXIED and route.namespace:
            return await self._proxy_to_node(request, route)
        if route.resource == "pods" and route.sub == EPHEMERAL and route.name:
            return await self._ephemeral_containers(request, route)
        if route.resource == "pods" and route.sub == RESIZE and route.name:
            return await self._resize(request, route)
        if route.resource == "certificatesigningrequests" and request.method in ("POST", "PUT"):
            return await self._csr_write(request, route, who)
        if route.sub not in ("", "status", "approval"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = route.namespace or ""
        if request.method == "GET":
            if route.name:
                return web.json_response(self.store.get(route.resource, ns, route.name))
            if q.get("watch") in ("1", "true"):
                return await self._watch(request, route)
            return self._list(route, q)
        if request.method == "POST" and not route.name:
            body = await self._body(request)
            if route.namespace is None and KINDS[route.resource][2]:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
            if route.namespace is not None:  # NamespaceLifecycle admission comes first
                self.store.get("namespaces", "", ns)
            if route.resource == "pods":
                body = self._admit_pod(ns, body)
            return web.json_response(self.store.create(route.resource, ns, body), status=201)
        if request.method == "PUT" and route.name:
            body = await self._body(request)
            obj = self.store.update(route.resource, ns, route.name,
                                    lambda _old: copy.deepcopy(body), subresource=route.sub)
            return web.json_response(obj)
        if request.method == "PATCH" and route.name:
            return await self._patch(request, route)
        if request.method == "DELETE" and route.name:
            options = await self._body(request) if request.can_read_body else {}
            grace = options.get("gracePeriodSeconds")
            if "gracePeriodSeconds" in q:
                grace = int(q["gracePeriodSeconds"])
            pre = options.get("preconditions") or {}
            obj = self.store.delete(route.resource, ns, route.name,
                                    grace=None if grace is None else int(grace),
                                    uid=pre.get("uid"), rv=pre.get("resourceVersion"))
            return web.json_response(obj)
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")

    async def _ephemeral_containers(self, request: web.Request,
                                    route: _Route) -> web.Response:
        """``pods/<name>/ephemeralcontainers`` (``kubectl debug``): of the Pod written, its
        ``spec.ephemeralContainers`` is all that is taken: ephemeral containers may be added,
        never changed or removed, with unique names and none of the fields an ephemeral
        container may not set (the API server's ``ValidatePodEphemeralContainersUpdate``)."""

        def take(old: Obj, written: Obj) -> Obj:
            wanted = (written.get("spec") or {}).get(EPHEMERAL_KEY) or []
            _check_ephemeral(route.name, old, wanted)
            new = copy.deepcopy(old)
            new["spec"][EPHEMERAL_KEY] = wanted
            return new

        return await self._pod_subresource(request, route, take)

    async def _resize(self, request: web.Request, route: _Route) -> web.Response:
        """``pods/<name>/resize`` (in-place resize, ``resize.py``): of the Pod written, only
        the containers' CPU and memory are taken."""

        def take(old: Obj, written: Obj) -> Obj:
            try:
                return resized(route.name, old, written)
            except ResizeError as err:
                raise ApiError(422, "Invalid", err.message) from None

        return await self._pod_subresource(request, route, take)

    async def _pod_subresource(self, request: web.Request, route: _Route,
                               take: Callable[[Obj, Obj], Obj]) -> web.Response:
        """A pod subresource that writes part of the pod: GET is the pod; PATCH (merge or
        strategic merge) or PUT gives a whole Pod, of which ``take(old, written)`` makes the
        new pod (or raises the ApiError the API server answers)."""
        ns = route.namespace or ""
        if request.method == "GET":
            return web.json_response(self.store.get("pods", ns, route.name))
        body = await self._body(request)
        if request.method == "PATCH":
            ctype = request.content_type
            if ctype == "application/merge-patch+json":
                apply: Callable[[Obj], Obj] = lambda old: merge_patch(old, body)  # noqa: E731
            elif ctype == "application/strategic-merge-patch+json":
                apply = lambda old: strategic_merge_patch(old, body)  # noqa: E731
            else:
                raise ApiError(415, "UnsupportedMediaType",
                               f"the stand-in does not implement the patch type {ctype!r}")
        elif request.method == "PUT":
            apply = lambda old: copy.deepcopy(body)  # noqa: E731
        else:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
        return web.json_response(self.store.update(
            "pods", ns, route.name, lambda old: take(old, apply(copy.deepcopy(old)))))

    async def _csr_write(self, request: web.Request, route: _Route,
                         who: tuple[str, list[str]]) -> web.Response:
        if request.content_type == PROTOBUF and route.sub == "approval":
            try:  # kubectl certificate approve|deny
                body = csr_approval(await request.read())
            except (ValueError, IndexError) as exc:
                raise ApiError(415, "UnsupportedMediaType", str(exc)) from None
        else:
            body = await self._body(request)
        if request.method == "POST" and not route.name:
            return web.json_response(self.csr.create(body, who), status=201)
        if request.method == "PUT" and route.name and route.sub == "approval":
            obj = self.csr.put_approval(route.name, body)
            asyncio.get_running_loop().call_soon(self.csr.sign_pending)  # the controller
            return web.json_response(obj)
        if request.method == "PUT" and route.name and route.sub == "status":
            return web.json_response(self.csr.put_status(route.name, body))
        if request.method == "PUT" and route.name and not route.sub:
            def mutate(old: Obj) -> Obj:  # the main resource: metadata only
                new = copy.deepcopy(old)
                new["metadata"] = {**old["metadata"], **{
                    k: v for k, v in (body.get("metadata") or {}).items()
                    if k in ("labels", "annotations", "finalizers", "resourceVersion")}}
                return new
            return web.json_response(self.store.update(route.resource, "", route.name, mutate))
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")

    def approve_csr(self, name: str) -> Obj:
        """A test acting as the approver (``kubectl certificate approve``'s condition); the
        signer runs after it, as kube-controller-manager's would."""
        obj = self.csr.approve(name)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.csr.sign_pending)
        return obj

    def _openapi(self, path: str) -> Obj:
        """Just enough OpenAPI v3 for kubectl to see that the server validates fields itself
        (``fieldValidation`` on each kind's PATCH): ``kubectl apply``/``create -f`` then send
        ``fieldValidation=Strict`` instead of validating against a schema. The stand-in
        stores what it is given (no schemas)."""
        gvs = ["api/v1", *(f"apis/{g}" for g in GROUPS)]
        if path == "/openapi/v3":
            return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash=standin"}
                              for gv in gvs}}
        gv = path.removeprefix("/openapi/v3/")
        if gv not in gvs:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        api_version = gv.removeprefix("api/").removeprefix("apis/")
        paths: Obj = {}
        for plural, (kind, version, namespaced, _, _) in KINDS.items():
            if version != api_version:
                continue
            group, _, ver = version.rpartition("/")
            where = f"/{gv}/" + ("namespaces/{namespace}/" if namespaced else "") + plural
            paths[where + "/{name}"] = {"patch": {
                "x-kubernetes-group-version-kind": {"group": group, "version": ver,
                                                    "kind": kind},
                "parameters": [{"name": "fieldValidation", "in": "query",
                                "schema": {"type": "string"}}]}}
        return {"openapi": "3.0.0", "info": {"title": "stand-in", "version": "v1"},
                "paths": paths}

    def _discovery(self, path: str) -> Obj:
        """Legacy (non-aggregated) discovery, what kubectl reads to map ``pod/NAME``."""
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}]}
        if path == "/apis":
            groups = []
            for gv in GROUPS:
                entry = {"groupVersion": gv, "version": gv.split("/")[1]}
                groups.append({"name": gv.split("/")[0], "versions": [entry],
                               "preferredVersion": entry})
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        group = path.removeprefix("/apis/") if path.startswith("/apis/") else "v1"
        resources: list[Obj] = []
        for plural, (kind, gv, namespaced, status, _) in KINDS.items():
            if gv != group:
                continue
            resources.append({"name": plural, "singularName": kind.lower(),
                              "namespaced": namespaced, "kind": kind, "verbs": [
                                  "create", "delete", "get", "list", "patch", "update",
                                  "watch"],
                              **({"shortNames": ["csr"]}
                                 if plural == "certificatesigningrequests" else {})})
            subs = (["status"] if status else []) + (
                [*NODE_PROXIED, EPHEMERAL] if plural == "pods" else []) + (
                ["approval", "status"] if plural == "certificatesigningrequests" else [])
            for sub in subs:
                resources.append({"name": f"{plural}/{sub}", "singularName": "",
                                  "namespaced": namespaced,
                                  "kind": "PodExecOptions" if sub in NODE_PROXIED else kind,
                                  "verbs": ["create", "get"] if sub in NODE_PROXIED
                                  else ["get", "patch", "update"]})
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group,
                "resources": resources}

    # -- pods/exec, pods/attach, pods/portforward: to the node's main port --------------------
    async def _proxy_to_node(self, request: web.Request, route: _Route) -> web.StreamResponse:
        """As kube-apiserver: the kubelet's URL for the subresource (its own query names), a
        connection to the node's main port with the API server's own client certificate (the
        node's serving certificate is not verified, as without
        ``--kubelet-certificate-authority``), the client's upgrade headers and no credentials;
        after the node's 101 the two connections are spliced byte for byte."""
        ns, name = route.namespace or "", route.name
        pod = self.store.get("pods", ns, name)
        spec = pod.get("spec", {})
        node_name = spec.get("nodeName") or ""
        if not node_name:
            raise ApiError(400, "BadRequest", f"pod {name} does not have a host assigned")
        node = self.store.get("nodes", "", node_name)
        port = int(node.get("status", {}).get("daemonEndpoints", {})
                   .get("kubeletEndpoint", {}).get("Port", 0))
        if not port:
            raise ApiError(400, "BadRequest", f"node {node_name} has no kubelet endpoint")
        q = request.query
        if route.sub == "portforward":
            path = f"/portForward/{ns}/{name}"
            params = [("port", p) for p in q.getall("ports", [])]
        else:
            names = [c["name"] for c in spec.get("containers", [])]
            container = q.get("container") or (names[0] if len(names) == 1 else "")
            if not container:
                raise ApiError(400, "BadRequest", f"a container name must be specified for pod "
                                                  f"{name}, choose one of: {names}")
            path = f"/{route.sub}/{ns}/{name}/{container}"
            params = [(kubelet, "1") for api, kubelet in (
                ("stdin", "input"), ("stdout", "output"), ("stderr", "error"), ("tty", "tty"))
                if q.get(api) in ("true", "1")]
            if route.sub == "exec":
                params = [("command", c) for c in q.getall("command", [])] + params
        target = path + (f"?{urlencode(params)}" if params else "")
        skip = {"authorization", "host", "content-length", "transfer-encoding", "cookie"}
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in skip]
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        self._kubelet_client.configure_cert(ctx)
        try:
            status, reason, got, body, reader, writer = await connect_upgrade(
                f"https://{self.kubelet_host}:{port}", request.method, target, headers,
                ssl_context=ctx)
        except (OSError, UpgradeError) as exc:
            raise ApiError(502, "BadGateway", f"error dialing backend: {exc}") from None
        self.node_proxy_requests.append((request.method, target,
                                         request.headers.get("Upgrade", "")))
        if status != 101:
            return web.Response(status=status, reason=reason, body=body, headers={
                k: v for k, v in got if k.lower() == "content-type"})
        client = await hijack(request, got)
        with contextlib.suppress(ConnectionError, OSError):
            await splice(client, (reader, writer))
        return finish_hijacked()

    @staticmethod
    async def _body(request: web.Request) -> Obj:
        if request.content_type == PROTOBUF:
            raise ApiError(415, "UnsupportedMediaType", "the stand-in reads JSON bodies "
                           "(protobuf only for a CSR's approval)")
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, "BadRequest", f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        return body

    @staticmethod
    def _route(path: str) -> _Route:
        if path.startswith("/api/v1/"):
            group, parts = "", path[len("/api/v1/"):].split("/")
        elif any(path.startswith(f"/apis/{gv}/") for gv in GROUPS):
            gv = next(gv for gv in GROUPS if path.startswith(f"/apis/{gv}/"))
            group, parts = gv.split("/")[0], path[len(f"/apis/{gv}/"):].split("/")
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if parts[0] == "namespaces" and len(parts) >= 3:
            ns: str | None = parts[1]
            parts = parts[2:]
        else:
            ns = None
        resource = parts[0]
        name = parts[1] if len(parts) > 1 else ""
        sub = parts[2] if len(parts) > 2 else ""
        known = KINDS.get(resource)
        if known is None or len(parts) > 3 or \
                (known[1].partition("/")[0] if "/" in known[1] else "") != group or \
                (ns is not None and not known[2]) or (ns is None and known[2] and name):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub == "status" and not known[3] and resource != "certificatesigningrequests":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub == "approval" and resource != "certificatesigningrequests":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _Route(resource, ns, name, sub)

    def _list(self, route: _Route, q: Any) -> web.Response:
        fsel = Selector.fields(q.get("fieldSelector", ""), route.resource)
        lsel = Selector.labels(q.get("labelSelector", ""))
        rv = q.get("resourceVersion", "")
        if q.get("resourceVersionMatch") == "Exact" and rv:
            raise ApiError(410, "Expired", f"too old resource version: {rv}")
        items, current = self.store.list(route.resource, route.namespace)
        kind, api_version = KINDS[route.resource][:2]
        return web.json_response({
            "kind": kind + "List", "apiVersion": api_version,
            "metadata": {"resourceVersion": str(current)},
            "items": [i for i in items if fsel.matches(i) and lsel.matches(i)]})

    async def _watch(self, request: web.Request, route: _Route) -> web.StreamResponse:
        q = request.query
        fsel = Selector.fields(q.get("fieldSelector", ""), route.resource)
        lsel = Selector.labels(q.get("labelSelector", ""))
        bookmarks = q.get("allowWatchBookmarks") in ("1", "true")
        timeout = float(q["timeoutSeconds"]) if "timeoutSeconds" in q else \
            self.watch_timeout * (1 + random.random())
        kind, api_version = KINDS[route.resource][:2]
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Obj]] = asyncio.Queue()

        def matches(obj: Obj | None) -> bool:
            if obj is None:
                return False
            ns = obj.get("metadata", {}).get("namespace", "")
            return (route.namespace is None or ns == route.namespace) and \
                fsel.matches(obj) and lsel.matches(obj)

        def convert(event: Event) -> tuple[str, Obj] | None:
            if event.key[0] != route.resource:
                return None
            now, before = matches(event.obj), matches(event.old)
            if event.type == "DELETED":
                return ("DELETED", event.obj) if before else None
            if now and before:
                return "MODIFIED", event.obj
            if now:
                return "ADDED", event.obj
            if before and event.old is not None:
                gone = copy.deepcopy(event.old)
                gone["metadata"]["resourceVersion"] = str(event.rv)
                return "DELETED", gone
            return None

        def watcher(event: Event) -> None:
            item = convert(event)
            if item is not None:
                loop.call_soon_threadsafe(queue.put_nowait, item)

        rv_text = q.get("resourceVersion", "")
        initial: list[tuple[str, Obj]] = []
        with self.store.lock:
            if rv_text in ("", "0"):
                items, _ = self.store.list(route.resource, route.namespace)
                initial = [("ADDED", i) for i in items if matches(i)]
            else:
                try:
                    rv = int(rv_text)
                except ValueError:
                    raise ApiError(400, "BadRequest",
                                   f"invalid resource version: {rv_text}") from None
                try:
                    initial = [c for e in self.store.since(rv) if (c := convert(e))]
                except ApiError as exc:
                    initial = [("ERROR", exc.status())]
            self.store.watchers.append(watcher)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        deadline = loop.time() + timeout
        next_bookmark = loop.time() + self.bookmark_interval
        try:
            for item in initial:
                await self._send(response, item)
                if item[0] == "ERROR":
                    return response
            while not self._closing.is_set():
                now = loop.time()
                if now >= deadline:
                    break
                if bookmarks and now >= next_bookmark:
                    next_bookmark = now + self.bookmark_interval
                    with self.store.lock:
                        mark = {"kind": kind, "apiVersion": api_version,
                                "metadata": {"resourceVersion": str(self.store.rv)}}
                        loop.call_soon_threadsafe(queue.put_nowait, ("BOOKMARK", mark))
                wait = min(deadline, next_bookmark if bookmarks else deadline, now + 0.2) - now
                try:
                    item = await asyncio.wait_for(queue.get(), max(wait, 0.01))
                except TimeoutError:
                    continue
                await self._send(response, item)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            with self.store.lock, contextlib.suppress(ValueError):
                self.store.watchers.remove(watcher)
        if not self._closing.is_set():
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
        return response

    @staticmethod
    async def _send(response: web.StreamResponse, item: tuple[str, Obj]) -> None:
        await response.write(json.dumps({"type": item[0], "object": item[1]}).encode() + b"\n")

    async def _patch(self, request: web.Request, route: _Route) -> web.Response:
        ctype = request.content_type
        body = await self._body(request)
        if ctype == "application/merge-patch+json":
            apply: Callable[[Obj], Obj] = lambda old: merge_patch(old, body)  # noqa: E731
        elif ctype == "application/strategic-merge-patch+json":
            apply = lambda old: strategic_merge_patch(old, body)  # noqa: E731
        else:
            raise ApiError(415, "UnsupportedMediaType",
                           f"the stand-in does not implement the patch type {ctype!r}")
        meta = body.get("metadata") or {}

        def mutate(old: Obj) -> Obj:
            new = apply(old)
            # a version in the patch is a precondition; otherwise the patch is unconditional
            new.setdefault("metadata", {})["resourceVersion"] = meta.get("resourceVersion", "")
            if not meta.get("resourceVersion"):
                new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            return new

        obj = self.store.update(route.resource, route.namespace or "", route.name, mutate,
                                subresource=route.sub)
        return web.json_response(obj)

    # -- admission ------------------------------------------------------------------------------
    def _admit_pod(self, ns: str, pod: Obj) -> Obj:
        pod = copy.deepcopy(pod)
        spec = pod.setdefault("spec", {})
        spec.setdefault("securityContext", {})  # SetDefaults_PodSpec (kubectl debug reads it)
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if MIRROR in annotations:
            if spec.get("serviceAccountName"):
                raise ApiError(403, "Forbidden", "pod is forbidden: a mirror pod may not "
                               "reference service accounts")
            for v in spec.get("volumes") or []:
                if "secret" in v or "projected" in v:
                    raise ApiError(403, "Forbidden", "pod is forbidden: a mirror pod may not "
                                   "reference secrets")
            if any(ref.get("name") for ref in spec.get("imagePullSecrets") or []):
                raise ApiError(403, "Forbidden", "pod is forbidden: a mirror pod may not "
                               "reference secrets")  # VisitPodSecretNames counts them
            return pod
        if not self.service_account_admission:
            return pod
        sa_name = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        spec["serviceAccountName"] = sa_name
        try:
            sa = self.store.get("serviceaccounts", ns, sa_name)
        except ApiError:
            raise ApiError(403, "Forbidden", f"pods is forbidden: error looking up service "
                           f'account {ns}/{sa_name}: serviceaccount "{sa_name}" not found'
                           ) from None
        if not spec.get("imagePullSecrets") and sa.get("imagePullSecrets"):
            # the ServiceAccount plugin: a pod without pull secrets gets its account's
            spec["imagePullSecrets"] = [{"name": r.get("name", "")}
                                        for r in sa["imagePullSecrets"]]
        automount = spec.get("automountServiceAccountToken")
        if automount is None:
            automount = sa.get("automountServiceAccountToken", True)
        if not automount:
            return pod
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        if any(m.get("mountPath") == SA_MOUNT for c in containers
               for m in c.get("volumeMounts") or []):
            return pod
        name = "kube-api-access-" + uuid.uuid4().hex[:5]
        spec.setdefault("volumes", []).append({"name": name, "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt",
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}})
        for c in containers:
            c.setdefault("volumeMounts", []).append(
                {"name": name, "readOnly": True, "mountPath": SA_MOUNT})
        return pod

    # -- authentication API ---------------------------------------------------------------------
    async def _token_request(self, request: web.Request, route: _Route) -> web.Response:
        ns = route.namespace or ""
        body = await self._body(request)
        sa = self.store.get("serviceaccounts", ns, route.name)
        spec = body.get("spec") or {}
        seconds = int(spec.get("expirationSeconds") or 3600)
        if seconds < 600:
            raise ApiError(422, "Invalid", 'TokenRequest.authentication.k8s.io "'
                           f'{route.name}" is invalid: spec.expirationSeconds: Invalid '
                           f"value: {seconds}: may not specify a duration less than 10 minutes")
        bound = spec.get("boundObjectRef")
        if bound:
            if bound.get("kind") not in ("Pod", "Secret", "Node"):
                raise ApiError(422, "Invalid", "spec.boundObjectRef.kind: Unsupported value")
            resource = {"Pod": "pods", "Secret": "secrets", "Node": "nodes"}[bound["kind"]]
            obj = self.store.get(resource, ns if resource != "nodes" else "", bound["name"])
            if bound.get("uid") and bound["uid"] != obj["metadata"]["uid"]:
                raise ApiError(409, "Conflict", f"the UID in the bound object reference "
                               f"({bound['uid']}) does not match the UID in record. The "
                               "object might have been deleted and then recreated")
        now = self.wall()
        user = f"system:serviceaccount:{ns}:{route.name}"
        claims = {"aud": spec.get("audiences") or ["https://kubernetes.default.svc"],
                  "exp": int(now + seconds), "iat": int(now), "sub": user,
                  "kubernetes.io": {"namespace": ns, "serviceaccount": {
                      "name": route.name, "uid": sa["metadata"]["uid"]},
                      **({"pod": {"name": bound["name"], "uid": bound.get("uid", "")}}
                         if bound and bound.get("kind") == "Pod" else {})}}

        def part(doc: Any) -> str:
            return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

        token = ".".join((part({"alg": "none", "kid": "standin"}), part(claims),
                          uuid.uuid4().hex))
        self.tokens[token] = (user, ["system:serviceaccounts",
                                     f"system:serviceaccounts:{ns}", "system:authenticated"])
        if bound and bound.get("kind") == "Pod":  # what kube-apiserver's SA authenticator adds
            self.token_extra[token] = {
                "authentication.kubernetes.io/pod-name": [bound["name"]],
                "authentication.kubernetes.io/pod-uid": [obj["metadata"]["uid"]]}
        out = {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
               "metadata": {"name": route.name, "namespace": ns,
                            "creationTimestamp": None},
               "spec": {**spec, "expirationSeconds": seconds},
               "status": {"token": token, "expirationTimestamp": now_rfc3339(now + seconds)}}
        self.token_requests.append(out)
        return web.json_response(out, status=201)

    async def _token_review(self, request: web.Request) -> web.Response:
        """TokenReview as kube-apiserver's registry answers it: 400 without a token; the token
        goes through the server's own authenticators (here: ``tokens``); an unknown one is
        ``authenticated: false`` with ``status.error`` (kube-apiserver's bearer-token
        authenticator says "invalid bearer token"), which its clients do not cache."""
        body = await self._body(request)
        spec = body.get("spec") or {}
        token = spec.get("token", "")
        if not token:
            raise ApiError(400, "BadRequest",
                           "token is required for TokenReview in authentication")
        who = self.tokens.get(token)
        self.reviews.append(body)
        status: Obj
        if who is None:
            status = {"user": {}, "error": "invalid bearer token"}
        else:
            groups = list(who[1])
            if "system:authenticated" not in groups:  # the server's authenticated-group adder
                groups.append("system:authenticated")
            status = {"authenticated": True, "user": {"username": who[0], "groups": groups}}
            if token in self.token_extra:
                status["user"]["extra"] = self.token_extra[token]
            if spec.get("audiences"):
                status["audiences"] = spec["audiences"]
        out = {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
               "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}
        return web.json_response(out, status=201)

    async def _access_review(self, request: web.Request) -> web.Response:
        """SubjectAccessReview: validated as kube-apiserver does (exactly one of
        ``resourceAttributes``/``nonResourceAttributes``, a user or a group: else 422), then
        decided by ``authorize(spec)`` (the cluster's authorizers); ``status.allowed`` is always
        there, ``reason`` only for a denial."""
        body = await self._body(request)
        spec = body.get("spec") or {}
        if ("resourceAttributes" in spec) == ("nonResourceAttributes" in spec):
            raise ApiError(422, "Invalid", 'SubjectAccessReview.authorization.k8s.io "" is '
                           "invalid: spec.resourceAttributes: Invalid value: \"null\": exactly "
                           "one of nonResourceAttributes or resourceAttributes must be specified")
        if not spec.get("user") and not spec.get("groups"):
            raise ApiError(422, "Invalid", 'SubjectAccessReview.authorization.k8s.io "" is '
                           'invalid: spec.user: Invalid value: "": at least one of user or '
                           "group must be specified")
        allowed = bool(self.authorize(spec))
        self.reviews.append(body)
        out = {"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
               "metadata": {"creationTimestamp": None}, "spec": spec,
               "status": {"allowed": allowed, **(
                   {} if allowed else {"reason": "denied by the stand-in's policy"})}}
        return web.json_response(out, status=201)

EPHEMERAL_KEY = "ephemeralContainers"


def _check_ephemeral(name: str, old: Obj, wanted: Any) -> None:
    """``ValidatePodEphemeralContainersUpdate``, as far as the stand-in goes (422 otherwise)."""
    where = f'Pod "{name}" is invalid: spec.ephemeralContainers'
    if not isinstance(wanted, list) or not all(isinstance(c, dict) for c in wanted):
        raise ApiError(422, "Invalid", f"{where}: Invalid value: must be a list of containers")
    before = {c["name"]: c for c in (old.get("spec") or {}).get(EPHEMERAL_KEY) or []}
    now = {str(c.get("name", "")): c for c in wanted}
    for cname, c in before.items():
        if cname not in now:
            raise ApiError(422, "Invalid", f'{where}: Forbidden: existing ephemeral containers '
                                           f'"{cname}" may not be removed')
        if now[cname] != c:
            raise ApiError(422, "Invalid", f'{where}: Forbidden: existing ephemeral containers '
                                           f'"{cname}" may not be changed')
    spec = old.get("spec") or {}
    taken = {c.get("name") for key in ("containers", "initContainers")
             for c in spec.get(key) or []}
    for i, c in enumerate(wanted):
        cname = c.get("name")
        if not cname or not c.get("image"):
            raise ApiError(422, "Invalid", f"{where}[{i}]: Required value: name and image")
        if cname in taken or [x.get("name") for x in wanted].count(cname) > 1:
            raise ApiError(422, "Invalid", f'{where}[{i}].name: Duplicate value: "{cname}"')
        for key in EPHEMERAL_FORBIDDEN:
            if c.get(key):  # an empty value sets nothing (kubectl sends resources: {})
                raise ApiError(422, "Invalid", f"{where}[{i}].{key}: Forbidden: cannot be set "
                                               "for an Ephemeral Container")


__all__ = ["ApiError", "KubeApi", "not_found"]
