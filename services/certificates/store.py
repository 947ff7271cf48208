"""The pairs on disk, as client-go's ``certificate.FileStore`` keeps them in ``certDir`` (issue 26):
``<prefix>-<YYYY-MM-DD-HH-MM-SS>.pem`` (certificate chain, then the key; mode 0600), and the
symlink ``<prefix>-current.pem`` to the one in use (``kubelet-client-current.pem``,
``kubelet-server-current.pem``). Every reader opens the symlink, so a new pair is one rename.

Crash safety (kill -9 at any step leaves a usable pair):
1. the new key waits in ``<prefix>.key.tmp`` (written tmp + fsync + rename) while its CSR is
   pending, so a restarted process asks for the same certificate again (bootstrap: the same
   CSR name) instead of losing the request;
2. the pair file is written under a temporary name, fsynced, checked (it must load as a pair)
   and renamed to its timestamped name: a half-written pair never has a final name;
3. ``<prefix>-updated.pem`` (a symlink to it) is made, then renamed over ``-current.pem``:
   rename(2) replaces the old symlink in one step, so ``-current.pem`` always names a complete
   pair, the old one until the rename and the new one after; the directory is fsynced;
4. the pending key is removed last (``recover()`` removes one the current pair already holds;
   any other is used for the next request).
``recover()`` finishes a step 3 cut short (an ``-updated.pem`` with no ``-current.pem``, as
client-go's store does) and removes temporary files. Old pairs are removed once expired.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Pair", "PairStore", "load_pair"]

CLIENT_PREFIX = "kubelet-client"
SERVER_PREFIX = "kubelet-server"


@dataclass(frozen=True)
class Pair:
    path: Path  # the file read (the timestamped one behind the symlink)
    cert_pem: bytes  # the chain
    key_pem: bytes
    not_before: float
    not_after: float
    common_name: str
    organizations: tuple[str, ...]
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    serial: int

    def valid_at(self, now: float) -> bool:
        return self.not_before <= now < self.not_after


def _split_pem(data: bytes) -> tuple[bytes, bytes]:
    certs: list[bytes] = []
    key: list[bytes] = []
    block: list[bytes] = []
    for line in data.splitlines(keepends=True):
        block.append(line)
        if line.startswith(b"-----END "):
            text = b"".join(block)
            (certs if b"CERTIFICATE-----" in line else key).append(text)
            block = []
    return b"".join(certs), b"".join(key)


def describe(cert_pem: bytes, key_pem: bytes, path: Path) -> Pair:
    """A pair from PEM (raises ``ValueError`` when it is not a certificate and its key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import NameOID

    certs = x509.load_pem_x509_certificates(cert_pem)
    leaf = certs[0]
    key = serialization.load_pem_private_key(key_pem, None)
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, pub) != \
            leaf.public_key().public_bytes(serialization.Encoding.DER, pub):
        raise ValueError("the key does not belong to the certificate")
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(str(v) for v in san.get_values_for_type(x509.DNSName))
        ips = tuple(str(v) for v in san.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        dns, ips = (), ()
    cn = leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    orgs = leaf.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    return Pair(path, cert_pem, key_pem, leaf.not_valid_before_utc.timestamp(),
                leaf.not_valid_after_utc.timestamp(), str(cn[0].value) if cn else "",
                tuple(str(o.value) for o in orgs), dns, ips, leaf.serial_number)


def load_pair(cert_path: Path, key_path: Path | None = None) -> Pair:
    """Read a pair (one file holding both, or two files); ``ValueError``/``OSError``."""
    data = cert_path.read_bytes()
    cert_pem, key_pem = _split_pem(data)
    if key_path is not None and key_path != cert_path:
        key_pem = key_path.read_bytes()
    real = Path(os.path.realpath(cert_path))
    return describe(cert_pem, key_pem, real)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class PairStore:
    """One prefix's pairs in ``directory``. Not thread-safe: one writer (the process that owns
    the prefix); readers only follow ``current_path``."""

    def __init__(self, directory: Path, prefix: str, crash: Any = None) -> None:
        self.dir = directory
        self.prefix = prefix
        self._crash = crash or (lambda point: None)  # tests: common.crashpoints

    @property
    def current_path(self) -> Path:
        return self.dir / f"{self.prefix}-current.pem"

    @property
    def pending_key_path(self) -> Path:
        return self.dir / f"{self.prefix}.key.tmp"

    def recover(self) -> None:
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        updated = self.dir / f"{self.prefix}-updated.pem"
        if not os.path.lexists(self.current_path) and updated.is_symlink():
            os.replace(updated, self.current_path)
        elif updated.is_symlink():
            updated.unlink()
        for tmp in self.dir.glob(f".{self.prefix}*.tmp"):
            with contextlib.suppress(OSError):
                tmp.unlink()
        current = self.current()  # a crash after the swap: the pending key is in use
        if current is not None and self.pending_key() is not None and \
                self.pending_key() == current.key_pem:
            self.discard_pending_key()

    def current(self) -> Pair | None:
        """The pair in use, or None (missing or unreadable: a broken one is logged by the
        caller and replaced)."""
        try:
            return load_pair(self.current_path)
        except (OSError, ValueError):
            return None

    def pending_key(self) -> bytes | None:
        try:
            data = self.pending_key_path.read_bytes()
        except OSError:
            return None
        from cryptography.hazmat.primitives import serialization

        try:
            serialization.load_pem_private_key(data, None)
        except ValueError:
            return None
        return data

    def save_pending_key(self, key_pem: bytes) -> None:
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        write_atomic(self.pending_key_path, key_pem)

    def discard_pending_key(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pending_key_path.unlink()

    def update(self, cert_pem: bytes, key_pem: bytes, now: float) -> Pair:
        """Make ``cert_pem`` + ``key_pem`` the current pair (the steps of the module doc)."""
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        stamp = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%d-%H-%M-%S")
        path = self.dir / f"{self.prefix}-{stamp}.pem"
        n = 1
        while path.exists() and path.read_bytes() != cert_pem + key_pem:
            path = self.dir / f"{self.prefix}-{stamp}-{n}.pem"
            n += 1
        pair = describe(cert_pem, key_pem, path)  # refuses a key of another certificate
        self._crash("pair.before_file")
        write_atomic(path, cert_pem + key_pem)
        self._crash("pair.before_symlink")
        updated = self.dir / f"{self.prefix}-updated.pem"
        with contextlib.suppress(FileNotFoundError):
            updated.unlink()
        os.symlink(path.name, updated)  # relative: the directory may move
        self._crash("pair.before_swap")
        os.replace(updated, self.current_path)
        _fsync_dir(self.dir)
        self._crash("pair.after_swap")
        with contextlib.suppress(FileNotFoundError):
            self.pending_key_path.unlink()
        return pair

    def prune(self, now: float) -> list[Path]:
        """Remove the expired pairs this prefix wrote, never the current one."""
        keep = os.path.realpath(self.current_path)
        removed = []
        for path in sorted(self.dir.glob(f"{self.prefix}-*.pem")):
            if path.is_symlink() or os.path.realpath(path) == keep:
                continue
            try:
                pair = load_pair(path)
            except (OSError, ValueError):
                continue
            if pair.not_after <= now:
                path.unlink()
                removed.append(path)
        return removed


def serving_context_for(pair_path: Path, client_ca_file: str) -> ssl.SSLContext:
    """A server context on one pair file (for the main port's dynamic serving certificate)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(pair_path), str(pair_path))
    if client_ca_file:
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx
