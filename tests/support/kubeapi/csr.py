"""The stand-in's ``certificates.k8s.io/v1`` CertificateSigningRequests, bootstrap tokens and the
built-in signers (issue 26), as kube-apiserver and kube-controller-manager document them:

- **create** (kube-apiserver's registry and validation): ``spec.request`` must be a PEM
  ``CERTIFICATE REQUEST`` with a valid signature, ``spec.signerName`` and ``spec.usages`` are
  required (known usages, no duplicates), ``spec.expirationSeconds`` >= 600; the server sets
  ``spec.username``, ``spec.uid``, ``spec.groups`` (with ``system:authenticated``) from the
  requester and drops any status given.
- **approval** (``PUT .../approval``, what ``kubectl certificate approve`` sends): only
  ``status.conditions`` change; Approved and Denied exclude each other; they can never be
  removed. **status** (``PUT .../status``): only ``status.certificate`` and other conditions;
  a certificate, once set, is immutable and must be PEM.
- **signing** (the csrsigning controllers of kube-controller-manager): an approved, unsigned CSR
  of ``kubernetes.io/kube-apiserver-client-kubelet`` or ``kubernetes.io/kubelet-serving`` is
  checked as ``ValidateKubeletClientCSR``/``ValidateKubeletServingCSR`` do (else a ``Failed``
  condition, reason ``SignerValidationFailure``) and signed by the test CA (the cluster CA) in
  a second write, as the controller does: the key usages asked, the CSR's SANs, ``notBefore`` =
  now - ``backdate`` (5 min in kube-controller-manager; a test may shorten it to get an honest
  short lifetime), ``notAfter`` = now + the TTL (``--cluster-signing-duration``, or
  ``expirationSeconds``: at least 10 min, at most the TTL), less the backdate for TTLs of 8 h
  and more. ``auto_approve`` plays csrapproving's ``nodeclient``/``selfnodeclient`` roles.
- **bootstrap tokens** (``[a-z0-9]{6}.[a-z0-9]{16}``): the Secret
  ``kube-system/bootstrap-token-<id>`` of type ``bootstrap.kubernetes.io/token`` with
  ``token-secret``, ``usage-bootstrap-authentication: true``, an ``expiration`` not passed, gives
  user ``system:bootstrap:<id>`` in ``system:bootstrappers`` plus its ``auth-extra-groups``. Such
  a user may do what RBAC gives it and no more: discovery, ``/version`` and the health checks
  (``system:public-info-viewer``), and create, get, list and watch CSRs when a
  ClusterRoleBinding binds ``system:node-bootstrapper`` to one of its groups (``kubeadm init``
  makes the one for ``system:bootstrappers:kubeadm:default-node-token``:
  ``seed_kubeadm_bindings``); anything else is 403. ClusterRoleBindings are stored as given.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import ipaddress
import re
from collections.abc import Callable
from typing import Any

from tests.support.kubeapi.store import ApiError, Obj, Store, now_rfc3339

CLIENT_KUBELET = "kubernetes.io/kube-apiserver-client-kubelet"
SERVING = "kubernetes.io/kubelet-serving"
KUBE_SIGNERS = (CLIENT_KUBELET, SERVING)
USAGES = ("signing", "digital signature", "content commitment", "key encipherment",
          "key agreement", "data encipherment", "cert sign", "crl sign", "encipher only",
          "decipher only", "any", "server auth", "client auth", "code signing",
          "email protection", "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user",
          "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc")
TOKEN = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
BOOTSTRAP_GROUP = "system:bootstrappers"
PUBLIC_PATHS = ("/version", "/healthz", "/readyz", "/livez", "/api", "/apis")
CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


def _b64(data: str) -> str:
    return base64.b64decode(data).decode() if data else ""


def bootstrap_user(store: Store, token: str, now: float) -> tuple[str, list[str]] | None:
    """kube-apiserver's bootstrap token authenticator."""
    match = TOKEN.match(token)
    if match is None:
        return None
    token_id, secret = match.groups()
    try:
        obj = store.get("secrets", "kube-system", f"bootstrap-token-{token_id}")
    except ApiError:
        return None
    if obj.get("type") != "bootstrap.kubernetes.io/token" or \
            obj.get("metadata", {}).get("deletionTimestamp"):
        return None
    data = {k: _b64(v) for k, v in (obj.get("data") or {}).items()}
    data.update(obj.get("stringData") or {})
    if data.get("token-secret") != secret or data.get("token-id", token_id) != token_id or \
            data.get("usage-bootstrap-authentication") != "true":
        return None
    expiration = data.get("expiration", "")
    if expiration:
        when = dt.datetime.fromisoformat(expiration.replace("Z", "+00:00")).timestamp()
        if when <= now:
            return None
    groups = [BOOTSTRAP_GROUP, *(g.strip() for g in data.get("auth-extra-groups", "").split(",")
                                 if g.strip().startswith("system:bootstrappers:"))]
    return f"system:bootstrap:{token_id}", groups


KUBEADM_BINDINGS = {
    "kubeadm:kubelet-bootstrap": "system:node-bootstrapper",
    "kubeadm:node-autoapprove-bootstrap":
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient"}


def seed_kubeadm_bindings(store: Store) -> None:
    for name, role in KUBEADM_BINDINGS.items():
        store.create("clusterrolebindings", "", {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                          "name": "system:bootstrappers:kubeadm:default-node-token"}]})


def _bound(store: Store, groups: list[str], role: str) -> bool:
    items, _ = store.list("clusterrolebindings", None)
    return any(b.get("roleRef", {}).get("name") == role and any(
        s.get("kind") == "Group" and s.get("name") in groups for s in b.get("subjects") or [])
        for b in items)


def bootstrap_may(store: Store, groups: list[str], method: str, path: str) -> bool:
    """What RBAC lets a bootstrap token's user do (see the module doc)."""
    if method == "GET" and (path in PUBLIC_PATHS or (path.startswith("/apis/") and
                            path.count("/") <= 3)):
        return True
    if not _bound(store, groups, "system:node-bootstrapper"):
        return False
    if path == CSR_PATH:
        return method in ("POST", "GET")
    if path.startswith(CSR_PATH + "/"):
        return method == "GET" and path.count("/") == 5
    return False


def forbidden(user: str, method: str, path: str) -> ApiError:
    verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete"}.get(method, method.lower())
    return ApiError(403, "Forbidden", f'forbidden: User "{user}" cannot {verb} path "{path}"')


def _invalid(name: str, field: str, why: str) -> ApiError:
    return ApiError(422, "Invalid", f'CertificateSigningRequest.certificates.k8s.io "{name}" '
                    f"is invalid: {field}: {why}")


def parse_request(pem: str, name: str = "") -> Any:
    from cryptography import x509

    try:
        text = base64.b64decode(pem)
        csr = x509.load_pem_x509_csr(text)
    except ValueError as exc:
        raise _invalid(name, "spec.request", f"Invalid value: []byte{{...}}: {exc}") from None
    if not csr.is_signature_valid:
        raise _invalid(name, "spec.request", "Invalid value: []byte{...}: the CSR's signature "
                       "does not verify")
    return csr


def validate_create(obj: Obj) -> None:
    name = obj.get("metadata", {}).get("name") or obj.get("metadata", {}).get("generateName", "")
    spec = obj.get("spec") or {}
    if not spec.get("request"):
        raise _invalid(name, "spec.request", "Required value")
    parse_request(spec["request"], name)
    if not spec.get("signerName"):
        raise _invalid(name, "spec.signerName", "Required value")
    usages = spec.get("usages") or []
    if not usages:
        raise _invalid(name, "spec.usages", "Required value")
    for i, usage in enumerate(usages):
        if usage not in USAGES:
            raise _invalid(name, f"spec.usages[{i}]", f'Unsupported value: "{usage}"')
    if len(set(usages)) != len(usages):
        raise _invalid(name, "spec.usages", "Duplicate value")
    seconds = spec.get("expirationSeconds")
    if seconds is not None and int(seconds) < 600:
        raise _invalid(name, "spec.expirationSeconds", f"Invalid value: {seconds}: may not "
                       "specify a duration less than 600 seconds (10 minutes)")


def _cn_o(csr: Any) -> tuple[str, list[str]]:
    from cryptography.x509.oid import NameOID

    cn = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    orgs = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    return (str(cn[0]) if cn else ""), [str(o) for o in orgs]


def _sans(csr: Any) -> tuple[list[str], list[str], list[str], list[str]]:
    from cryptography import x509

    try:
        ext = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], [], [], []
    return ([str(v) for v in ext.get_values_for_type(x509.DNSName)],
            [str(v) for v in ext.get_values_for_type(x509.IPAddress)],
            [str(v) for v in ext.get_values_for_type(x509.RFC822Name)],
            [str(v) for v in ext.get_values_for_type(x509.UniformResourceIdentifier)])


def signer_problem(signer: str, csr: Any, usages: list[str]) -> str:
    """``ValidateKubeletClientCSR`` / ``ValidateKubeletServingCSR`` (pkg/apis/certificates)."""
    cn, orgs = _cn_o(csr)
    dns, ips, emails, uris = _sans(csr)
    if orgs != ["system:nodes"]:
        return "subject organization is not system:nodes"
    if emails:
        return "Email subjectAltNames are not allowed"
    if uris:
        return "URI subjectAltNames are not allowed"
    if signer == CLIENT_KUBELET:
        if dns:
            return "DNS subjectAltNames are not allowed"
        if ips:
            return "IP subjectAltNames are not allowed"
        want = ({"digital signature", "key encipherment", "client auth"},
                {"digital signature", "client auth"})
    else:
        if not dns and not ips:
            return "DNS or IP subjectAltName is required"
        want = ({"digital signature", "key encipherment", "server auth"},
                {"digital signature", "server auth"})
    if set(usages) not in want:
        return f"usages did not match {sorted(want[0])}"
    if not cn.startswith("system:node:"):
        return "subject common name does not begin with system:node:"
    return ""


def approval_state(obj: Obj) -> tuple[bool, bool, bool]:
    types = {c.get("type") for c in (obj.get("status") or {}).get("conditions") or []
             if c.get("status", "True") == "True"}
    return "Approved" in types, "Denied" in types, "Failed" in types


class CsrApi:
    """The CSR part of the stand-in; ``KubeApi`` routes ``certificates.k8s.io`` here."""

    def __init__(self, store: Store, wall: Callable[[], float], ca: Any) -> None:
        self.store = store
        self.wall = wall
        self.ca = ca
        self.signing_duration = 365 * 86400.0  # --cluster-signing-duration (8760h)
        self.backdate = 300.0  # the controller's 5 min; tests may shorten it
        self.auto_approve = False  # csrapproving: nodeclient and selfnodeclient
        self.signed: list[str] = []  # names, in signing order

    def create(self, body: Obj, who: tuple[str, list[str]]) -> Obj:
        obj = copy.deepcopy(body)
        validate_create(obj)
        user, groups = who
        spec = obj["spec"]
        spec["username"] = user
        spec["groups"] = [*groups, *(["system:authenticated"]
                                     if "system:authenticated" not in groups else [])]
        spec["uid"] = ""
        spec.pop("extra", None)
        obj["status"] = {}
        created = self.store.create("certificatesigningrequests", "", obj)
        if self.auto_approve and self._auto_approvable(created):
            self.approve(created["metadata"]["name"], "AutoApproved",
                         "Auto approving kubelet client certificate after SubjectAccessReview.")
        return created

    def _auto_approvable(self, obj: Obj) -> bool:
        spec = obj["spec"]
        if spec.get("signerName") != CLIENT_KUBELET:
            return False
        csr = parse_request(spec["request"])
        if signer_problem(CLIENT_KUBELET, csr, spec.get("usages") or []):
            return False
        cn, _ = _cn_o(csr)
        return BOOTSTRAP_GROUP in spec.get("groups", []) or spec.get("username") == cn

    def approve(self, name: str, reason: str = "KubectlApprove",
                message: str = "This CSR was approved by the stand-in's approver.") -> Obj:
        def mutate(old: Obj) -> Obj:
            new = copy.deepcopy(old)
            conds = new.setdefault("status", {}).setdefault("conditions", [])
            if not any(c.get("type") == "Approved" for c in conds):
                conds.append({"type": "Approved", "status": "True", "reason": reason,
                              "message": message, "lastUpdateTime": now_rfc3339(self.wall()),
                              "lastTransitionTime": now_rfc3339(self.wall())})
            return new
        return self.store.update("certificatesigningrequests", "", name, mutate)

    def put_approval(self, name: str, body: Obj) -> Obj:
        def mutate(old: Obj) -> Obj:
            new = copy.deepcopy(old)
            meta = body.get("metadata") or {}
            if meta.get("resourceVersion"):
                new["metadata"]["resourceVersion"] = meta["resourceVersion"]
            else:
                new["metadata"].pop("resourceVersion", None)
            conds = copy.deepcopy((body.get("status") or {}).get("conditions") or [])
            for c in conds:
                if c.get("type") in ("Approved", "Denied") and c.get("status", "True") != "True":
                    raise _invalid(name, "status.conditions", 'Unsupported value: the status of '
                                   'an Approved or Denied condition must be "True"')
                c.setdefault("status", "True")
            types = {c.get("type") for c in conds}
            if {"Approved", "Denied"} <= types:
                raise _invalid(name, "status.conditions", "Approved and Denied conditions are "
                               "mutually exclusive")
            was = {c.get("type") for c in (old.get("status") or {}).get("conditions") or []}
            for kept in ("Approved", "Denied"):
                if kept in was and kept not in types:
                    raise _invalid(name, "status.conditions", f"Forbidden: updates may not "
                                   f"remove a condition of type {kept!r}")
            new.setdefault("status", {})["conditions"] = conds
            return new
        obj = self.store.update("certificatesigningrequests", "", name, mutate)
        return obj

    def put_status(self, name: str, body: Obj) -> Obj:
        def mutate(old: Obj) -> Obj:
            new = copy.deepcopy(old)
            status = copy.deepcopy(body.get("status") or {})
            before = old.get("status") or {}
            if before.get("certificate") and status.get("certificate") != before["certificate"]:
                raise _invalid(name, "status.certificate", "Forbidden: updates may not modify "
                               "existing certificate content")
            if status.get("certificate"):
                from cryptography import x509

                try:
                    x509.load_pem_x509_certificates(base64.b64decode(status["certificate"]))
                except ValueError:
                    raise _invalid(name, "status.certificate", "Invalid value: must contain "
                                   "at least one CERTIFICATE PEM block") from None
            keep = [c for c in before.get("conditions") or []
                    if c.get("type") in ("Approved", "Denied")]
            other = [c for c in status.get("conditions") or []
                     if c.get("type") not in ("Approved", "Denied")]
            status["conditions"] = keep + other
            new["status"] = status
            return new
        return self.store.update("certificatesigningrequests", "", name, mutate)

    # -- kube-controller-manager's csrsigning ------------------------------------------------
    def sign_pending(self) -> None:
        items, _ = self.store.list("certificatesigningrequests", None)
        for obj in items:
            approved, denied, failed = approval_state(obj)
            spec = obj["spec"]
            if not approved or denied or failed or (obj.get("status") or {}).get("certificate") \
                    or spec.get("signerName") not in KUBE_SIGNERS:
                continue
            name = obj["metadata"]["name"]
            csr = parse_request(spec["request"], name)
            problem = signer_problem(spec["signerName"], csr, spec.get("usages") or [])
            status = copy.deepcopy(obj.get("status") or {})
            if problem:
                status.setdefault("conditions", []).append({
                    "type": "Failed", "status": "True", "reason": "SignerValidationFailure",
                    "message": problem, "lastUpdateTime": now_rfc3339(self.wall())})
            else:
                status["certificate"] = base64.b64encode(self.sign(
                    csr, spec.get("usages") or [], spec.get("expirationSeconds"))).decode()
                self.signed.append(name)
            self.put_status(name, {"status": status})

    def duration(self, seconds: int | None) -> float:
        if seconds is None:
            return self.signing_duration
        return min(self.signing_duration, max(600.0, float(seconds)))

    def sign(self, csr: Any, usages: list[str], seconds: int | None) -> bytes:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID

        key = serialization.load_pem_private_key(self.ca.private_key_pem.bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(self.ca.cert_pem.bytes())
        now = dt.datetime.fromtimestamp(self.wall(), dt.UTC)
        ttl = dt.timedelta(seconds=self.duration(seconds))
        backdate = dt.timedelta(seconds=self.backdate)
        not_after = now + ttl if ttl < dt.timedelta(hours=8) else now + ttl - backdate
        not_after = min(not_after, ca_cert.not_valid_after_utc)
        ku = {u: True for u in usages}
        eku = [oid for name, oid in (("server auth", ExtendedKeyUsageOID.SERVER_AUTH),
                                     ("client auth", ExtendedKeyUsageOID.CLIENT_AUTH))
               if name in usages]
        builder = (x509.CertificateBuilder().subject_name(csr.subject)
                   .issuer_name(ca_cert.subject).public_key(csr.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - backdate).not_valid_after(not_after)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
                   .add_extension(x509.KeyUsage(
                       digital_signature=ku.get("digital signature", False),
                       content_commitment=False,
                       key_encipherment=ku.get("key encipherment", False),
                       data_encipherment=False, key_agreement=False, key_cert_sign=False,
                       crl_sign=False, encipher_only=False, decipher_only=False), True)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                       ca_cert.public_key()), False))  # type: ignore[arg-type]
        if eku:
            builder = builder.add_extension(x509.ExtendedKeyUsage(eku), False)
        dns, ips, _, _ = _sans(csr)
        if dns or ips:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [*(x509.DNSName(d) for d in dns),
                 *(x509.IPAddress(ipaddress.ip_address(i)) for i in ips)]), False)
        cert = builder.sign(key, hashes.SHA256())  # type: ignore[arg-type]
        return cert.public_bytes(serialization.Encoding.PEM)
