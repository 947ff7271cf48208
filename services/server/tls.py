"""The main port's TLS: the serving pair and the server's ``ssl.SSLContext``.

``tlsCertFile``/``tlsPrivateKeyFile`` when set; else a self-signed pair generated once under
``<rootDir>/pki`` (``kubelet.crt``, ``kubelet.key`` mode 0600), as the kubelet does, and kept
across restarts (clients that pinned it keep working). It is made in-process with the
``cryptography`` package (no dependency on an ``openssl`` binary being installed, and the
subjectAltNames are data, not a config file): an ECDSA P-256 key, valid one year, for the node
name, ``localhost``, 127.0.0.1 and ``address`` when it is an IP. Written to temp names then
renamed, key first, so a kill during generation never leaves a half pair.

With ``authentication.x509.clientCAFile`` the context asks for a client certificate and verifies
it against that bundle when one is given (a certificate it does not sign fails the handshake, as
with the kubelet); requests without one go on to token or anonymous authentication.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ServingPair", "TlsError", "serving_context", "serving_pair"]


class TlsError(Exception):
    """A configured file is missing or unusable (the message names it)."""


@dataclass(frozen=True)
class ServingPair:
    cert: Path
    key: Path
    generated: bool


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def generate_self_signed(cert: Path, key: Path, node_name: str, address: str,
                         now: datetime.datetime) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(
        NameOID.COMMON_NAME, f"{node_name}@{int(now.timestamp())}")])
    alt: list[x509.GeneralName] = [x509.DNSName(node_name), x509.DNSName("localhost"),
                                   x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    try:
        ip = ipaddress.ip_address(address)
        if not ip.is_unspecified and str(ip) != "127.0.0.1":
            alt.append(x509.IPAddress(ip))
    except ValueError:
        pass
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(private.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .sign(private, hashes.SHA256()))
    key_pem = private.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    _write(key, key_pem, 0o600)
    _write(cert, certificate.public_bytes(serialization.Encoding.PEM), 0o644)


def serving_pair(root_dir: str, cert_file: str, key_file: str, node_name: str, address: str,
                 now: datetime.datetime) -> ServingPair:
    """The configured pair, else ``<rootDir>/pki/kubelet.{crt,key}`` (made when absent)."""
    if cert_file:
        return ServingPair(Path(cert_file), Path(key_file), generated=False)
    pki = Path(root_dir) / "pki"
    pki.mkdir(mode=0o755, parents=True, exist_ok=True)
    cert, key = pki / "kubelet.crt", pki / "kubelet.key"
    if cert.is_file() and key.is_file():
        return ServingPair(cert, key, generated=False)
    generate_self_signed(cert, key, node_name, address, now)
    return ServingPair(cert, key, generated=True)


def serving_context(pair: ServingPair, client_ca_file: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"cannot load the serving pair tlsCertFile={pair.cert} "
                       f"tlsPrivateKeyFile={pair.key}: {exc}") from None
    if client_ca_file:
        try:
            ctx.load_verify_locations(cafile=client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(f"cannot load authentication.x509.clientCAFile={client_ca_file}: "
                           f"{exc}") from None
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx
