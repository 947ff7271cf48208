"""CertificateSigningRequests as the kubelet makes them (issue 26; kubelet
``certificate/bootstrap``, client-go ``util/certificate`` and ``util/certificate/csr``).

- ``new_key()``: an ECDSA P-256 key (``keyutil.MakeEllipticPrivateKeyPEM``; client-go's manager
  too), PEM ``EC PRIVATE KEY``.
- ``Template``: subject CN ``system:node:<node>``, O ``system:nodes``; the serving one adds
  the node's DNS names and IPs. ``make_csr`` signs it with the key.
- ``digested_name``: ``node-csr-`` + base64url(SHA-512/256 of the public key, CN, O and the
  usages, each base64url-encoded and followed by ``|``): the bootstrap CSR's name, the same
  for the same key, so a restarted node finds its own request again.
- ``request()``: POST ``certificates.k8s.io/v1``; with a name, ``409 AlreadyExists`` reads the
  existing one and uses it if compatible (same subject and signer, signed by this key, its
  certificate not expired: ``ensureCompatible``); without a name the server generates one
  (``csr-``).
- ``wait()``: list + watch that one CSR (``fieldSelector=metadata.name``) until it is Approved
  and has a certificate; Denied or Failed end it with the condition's reason, a deleted or
  replaced (other UID) CSR too; the watch resumes from its version when cut.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from podvisor.services.apiserver import ApiConnection, ApiError, ApiMeta, ApiUnreachable, Obj

__all__ = ["CLIENT_SIGNER", "CLIENT_USAGES", "SERVING_SIGNER", "SERVING_USAGES", "CsrFailed",
           "Template", "digested_name", "make_csr", "new_key", "request", "wait"]

CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
SERVING_SIGNER = "kubernetes.io/kubelet-serving"
CLIENT_USAGES = ("digital signature", "key encipherment", "client auth")
SERVING_USAGES = ("digital signature", "key encipherment", "server auth")
PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
WATCH_TIMEOUT = 300


class CsrFailed(Exception):
    """The CSR will never give a certificate (denied, failed, deleted, incompatible)."""


@dataclass(frozen=True)
class Template:
    node: str
    signer: str
    usages: tuple[str, ...]
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    organizations: tuple[str, ...] = field(default=("system:nodes",))

    @property
    def common_name(self) -> str:
        return f"system:node:{self.node}"


def new_key() -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _key(key_pem: bytes) -> Any:
    from cryptography.hazmat.primitives import serialization

    return serialization.load_pem_private_key(key_pem, None)


def make_csr(key_pem: bytes, template: Template) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    name = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o)
                        for o in template.organizations),
                      x509.NameAttribute(NameOID.COMMON_NAME, template.common_name)])
    builder = x509.CertificateSigningRequestBuilder().subject_name(name)
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in template.dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in template.ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    from cryptography.hazmat.primitives.serialization import Encoding

    return builder.sign(_key(key_pem), hashes.SHA256()).public_bytes(Encoding.PEM)


def digested_name(key_pem: bytes, template: Template) -> str:
    from cryptography.hazmat.primitives import serialization

    def enc(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    public = _key(key_pem).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = hashlib.new("sha512_256")
    for part in (public, template.common_name.encode(),
                 *(o.encode() for o in template.organizations),
                 *(u.encode() for u in template.usages)):
        digest.update(enc(part) + b"|")
    return "node-csr-" + enc(digest.digest()).decode()


def _compatible(existing: Obj, csr_pem: bytes, key_pem: bytes, signer: str, now: float) -> str:
    """'' when ``existing`` can give this key its certificate, else why not."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    spec = existing.get("spec") or {}
    try:
        theirs = x509.load_pem_x509_csr(base64.b64decode(spec.get("request", "")))
    except ValueError as exc:
        return f"unable to parse the existing csr: {exc}"
    ours = x509.load_pem_x509_csr(csr_pem)
    if theirs.subject != ours.subject:
        return "csr subjects differ"
    if spec.get("signerName") and spec["signerName"] != signer:
        return f"csr signerNames differ: {spec['signerName']} vs {signer}"
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if theirs.public_key().public_bytes(*fmt) != _key(key_pem).public_key().public_bytes(*fmt):
        return "the existing csr is not signed by this key"
    cert = _field(existing, "status").get("certificate")
    if cert:
        for c in x509.load_pem_x509_certificates(base64.b64decode(cert)):
            if c.not_valid_after_utc.timestamp() < now:
                return "one of the certificates for the CSR has expired"
    return ""


def request(conn: ApiConnection, key_pem: bytes, template: Template, *, name: str = "",
            now: float) -> tuple[str, str]:
    """Create the CSR (or find this key's own); (name, uid)."""
    csr_pem = make_csr(key_pem, template)
    meta: Obj = {"name": name} if name else {"generateName": "csr-"}
    body = {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": meta,
            "spec": {"request": base64.b64encode(csr_pem).decode(),
                     "signerName": template.signer, "usages": list(template.usages)}}
    try:
        obj = conn.request("POST", PATH, body=body)
    except ApiError as exc:
        if exc.status != 409 or not name:
            raise
        obj = conn.request("GET", f"{PATH}/{name}")
        why = _compatible(obj, csr_pem, key_pem, template.signer, now)
        if why:
            raise CsrFailed(f"the certificate signing request {name} is not compatible: "
                            f"{why}") from None
    meta = obj.get("metadata") or {}
    return str(meta.get("name", name)), str(meta.get("uid", ""))


def _field(obj: Obj, name: str) -> Obj:
    """``obj[name]`` when it is an object, else an empty one (JSON from the API server)."""
    value = obj.get(name)
    return value if isinstance(value, dict) else {}


def issued(obj: Obj, uid: str) -> bytes | None:
    """The certificate once approved and signed; ``CsrFailed`` when it never will be."""
    meta = obj.get("metadata") or {}
    if uid and meta.get("uid") and meta["uid"] != uid:
        raise CsrFailed(f"csr {meta.get('name')!r} changed UIDs")
    status = obj.get("status") or {}
    approved = False
    for cond in status.get("conditions") or []:
        kind = cond.get("type")
        if kind == "Denied":
            raise CsrFailed(f"certificate signing request is denied, reason: "
                            f"{cond.get('reason', '')}, message: {cond.get('message', '')}")
        if kind == "Failed":
            raise CsrFailed(f"certificate signing request failed, reason: "
                            f"{cond.get('reason', '')}, message: {cond.get('message', '')}")
        if kind == "Approved":
            approved = True
    if approved and status.get("certificate"):
        return base64.b64decode(status["certificate"])
    return None


def wait(conn: ApiConnection, name: str, uid: str, stop: threading.Event,
         deadline: float, clock: Any,
         watching: Callable[[Any | None], None] = lambda stream: None) -> bytes | None:
    """The certificate, or None when ``stop`` is set or ``deadline`` (monotonic) passes.
    ``ApiError``/``ApiUnreachable`` end it too (the caller backs off and waits again).
    ``watching`` is told the watch stream open (then None): closing it ends the wait at once
    (the manager's ``halt``)."""
    selector = {"fieldSelector": f"metadata.name={name}"}
    rv = ""
    while not stop.is_set() and clock.monotonic() < deadline:
        if not rv:
            listed = conn.request("GET", PATH, query=selector)
            items = listed.get("items") or []
            if not items:
                raise CsrFailed(f"csr {name!r} was deleted")
            if (cert := issued(items[0], uid)) is not None:
                return cert
            rv = ApiMeta.of(listed).resource_version
        timeout = max(1, min(WATCH_TIMEOUT, int(deadline - clock.monotonic())))
        stream = conn.watch(PATH, {**selector, "resourceVersion": rv,
                                   "timeoutSeconds": str(timeout)}, read_timeout=timeout + 30)
        watching(stream)
        try:
            for event in stream:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        rv = ""
                        break
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("reason", "")),
                                   str(obj.get("message", "")))
                rv = ApiMeta.of(obj).resource_version or rv
                if kind == "DELETED":
                    raise CsrFailed(f"csr {name!r} was deleted")
                if kind in ("ADDED", "MODIFIED") and (cert := issued(obj, uid)) is not None:
                    return cert
        except ApiUnreachable:
            if stop.is_set():
                return None
            raise
        finally:
            watching(None)
            stream.close()
    return None
