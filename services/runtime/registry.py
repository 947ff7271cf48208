"""The OCI distribution API as the embedded runtime's client speaks it (over ``requests``):
references, registry settings (``imageRegistries``), the ``WWW-Authenticate`` challenge flow
(anonymous, basic, bearer token), manifests and indexes with platform selection, and blobs
streamed to disk with their digest checked.

Why not the ``oras`` package: see README ("OCI images"). In short, oras-py pulls *artifacts*
(files named by annotations), has no platform selection, no per-host CA/plain-HTTP/mirror
settings and no digest check while streaming; the parts it has (the challenge flow) are a few
dozen lines over ``requests``, which podvisor already uses."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import platform
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

DEFAULT_HOST = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join((OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST))

_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")


class InvalidReference(ValueError):
    """The image name is not a valid reference (the kubelet's InvalidImageName)."""


class RegistryError(Exception):
    """A pull failed; ``str()`` carries the registry's own reason when it gave one."""

    def __init__(self, message: str, status: int = 0, not_found: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.not_found = not_found


@dataclass(frozen=True)
class Reference:
    host: str  # as written (docker.io for Docker Hub)
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.host}/{self.repository}"

    @property
    def reference(self) -> str:
        """What to ask the manifests endpoint for: the digest when given, else the tag."""
        return self.digest or self.tag or "latest"

    def tagged(self) -> str | None:
        return f"{self.name}:{self.tag}" if self.tag else None

    def __str__(self) -> str:
        s = self.name
        if self.tag:
            s += f":{self.tag}"
        if self.digest:
            s += f"@{self.digest}"
        return s


def parse_reference(ref: str) -> Reference:
    """Docker's normalisation: no host means docker.io, a one-part Hub name gets ``library/``,
    no tag nor digest means ``latest``."""
    if not ref or ref != ref.strip() or any(c.isspace() for c in ref) or len(ref) > 4096:
        raise InvalidReference(f"invalid image name {ref!r}")
    rest, _, digest = ref.partition("@")
    if digest and not _DIGEST.match(digest):
        raise InvalidReference(f"invalid image name {ref!r}: bad digest {digest!r}")
    tag = ""
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _TAG.match(tag):
            raise InvalidReference(f"invalid image name {ref!r}: bad tag {tag!r}")
    parts = rest.split("/")
    first = parts[0]
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost"):
        host, path = first, parts[1:]
    else:
        host, path = DEFAULT_HOST, parts
    if host == DEFAULT_HOST and len(path) == 1:
        path = ["library", *path]
    if not path or not all(_COMPONENT.match(p) for p in path):
        raise InvalidReference(f"invalid image name {ref!r}: repository names are lowercase "
                               "letters, digits and separators")
    if not tag and not digest:
        tag = "latest"
    return Reference(host, "/".join(path), tag or None, digest or None)


# --- settings ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostSettings:
    ca_file: str | None = None
    plain_http: bool | None = None  # None: only loopback registries are plain HTTP
    mirrors: tuple[str, ...] = ()  # endpoints tried first, each "host[:port]" or a URL


@dataclass(frozen=True)
class RegistrySettings:
    hosts: dict[str, HostSettings] = field(default_factory=dict)

    @classmethod
    def from_config(cls, raw: Any) -> RegistrySettings:
        """``imageRegistries: {HOST: {caFile, plainHTTP, mirrors: [..]}}``; ValueError names the
        bad field."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ValueError("imageRegistries: must be a mapping of registry host to settings")
        hosts: dict[str, HostSettings] = {}
        for host, s in raw.items():
            where = f"imageRegistries.{host}"
            if not isinstance(s, dict):
                raise ValueError(f"{where}: must be a mapping")
            unknown = set(s) - {"caFile", "plainHTTP", "mirrors"}
            if unknown:
                raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} "
                                 "(caFile, plainHTTP, mirrors)")
            ca, plain, mirrors = s.get("caFile"), s.get("plainHTTP"), s.get("mirrors", [])
            if ca is not None and not isinstance(ca, str):
                raise ValueError(f"{where}.caFile: must be a path")
            if plain is not None and not isinstance(plain, bool):
                raise ValueError(f"{where}.plainHTTP: must be true or false")
            if not isinstance(mirrors, list) or not all(isinstance(m, str) for m in mirrors):
                raise ValueError(f"{where}.mirrors: must be a list of registry hosts")
            hosts[str(host)] = HostSettings(ca, plain, tuple(mirrors))
        return cls(hosts)

    def endpoints(self, host: str) -> list[tuple[str, HostSettings]]:
        """The base URLs to try for ``host``, mirrors first, with the settings of each."""
        own = self.hosts.get(host, HostSettings())
        out: list[tuple[str, HostSettings]] = []
        for m in own.mirrors:
            mhost = re.sub(r"^https?://", "", m).rstrip("/")
            ms = self.hosts.get(mhost, HostSettings())
            if m.startswith("http://"):
                ms = HostSettings(ms.ca_file, True, ())
            out.append((self._base(mhost, ms), ms))
        api = DOCKER_HUB_API if host == DEFAULT_HOST else host
        out.append((self._base(api, own), own))
        return out

    @staticmethod
    def _base(host: str, s: HostSettings) -> str:
        plain = s.plain_http if s.plain_http is not None else is_loopback(host)
        return ("http://" if plain else "https://") + host


def is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.endswith("]") else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Credentials:
    username: str = ""
    password: str = ""
    token: str = ""  # identity/registry token (CRI AuthConfig.identity_token/registry_token)

    @classmethod
    def from_auth(cls, username: str = "", password: str = "", auth: str = "",
                  identity_token: str = "", registry_token: str = "") -> Credentials:
        """CRI's AuthConfig: ``auth`` is base64("user:password")."""
        if auth and not username:
            import base64
            try:
                username, _, password = base64.b64decode(auth).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise RegistryError("auth config: 'auth' is not base64 of user:password")\
                    from None
        return cls(username, password, registry_token or identity_token)


# --- the client --------------------------------------------------------------------------------

def go_arch() -> str:
    m = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
            "armv7l": "arm", "i686": "386", "ppc64le": "ppc64le", "s390x": "s390x"}.get(m, m)


_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


class Client:
    """One registry client per pull (requests.Session is not shared across threads)."""

    def __init__(self, ref: Reference, settings: RegistrySettings,
                 creds: Credentials | None = None, timeout: float = 30.0) -> None:
        self.ref = ref
        self.creds = creds or Credentials()
        self.timeout = timeout
        self._endpoints = settings.endpoints(ref.host)
        self._session = requests.Session()
        self._auth_header: str | None = None
        self.base, self._settings = self._endpoints[-1]

    def close(self) -> None:
        self._session.close()

    def _verify(self, s: HostSettings) -> bool | str:
        return s.ca_file if s.ca_file else True

    def _request(self, path: str, accept: str | None = None,
                 stream: bool = False) -> requests.Response:
        """GET on the first endpoint that answers (mirrors first), following the
        ``WWW-Authenticate`` challenge once per endpoint."""
        errors: list[str] = []
        last: RegistryError | None = None
        for base, s in self._endpoints:
            try:
                resp = self._get(base, s, path, accept, stream)
            except requests.RequestException as exc:
                errors.append(f"{base}: {_short(exc)}")
                continue
            if resp.status_code == 200:
                self.base, self._settings = base, s
                return resp
            last = _error_of(resp, f"{base}{path}")
            resp.close()
            if len(self._endpoints) > 1 and base != self._endpoints[-1][0]:
                errors.append(f"{base}: {last}")
                continue
        if last is not None:
            raise last
        raise RegistryError("; ".join(errors) or "no registry endpoint")

    def _get(self, base: str, s: HostSettings, path: str, accept: str | None,
             stream: bool) -> requests.Response:
        headers = {"Accept": accept} if accept else {}
        if self._auth_header:
            headers["Authorization"] = self._auth_header
        url = base + path
        resp = self._session.get(url, headers=headers, stream=stream, timeout=self.timeout,
                                 verify=self._verify(s))
        if resp.status_code != 401:
            return resp
        challenge = resp.headers.get("WWW-Authenticate", "")
        resp.close()
        self._auth_header = self._answer(challenge, s)
        if self._auth_header is None:
            raise RegistryError(f"{url}: unauthorized and the registry sent no usable "
                                f"challenge ({challenge!r})", 401)
        headers["Authorization"] = self._auth_header
        return self._session.get(url, headers=headers, stream=stream, timeout=self.timeout,
                                 verify=self._verify(s))

    def _answer(self, challenge: str, s: HostSettings) -> str | None:
        scheme, _, params_text = challenge.strip().partition(" ")
        params = dict(_CHALLENGE.findall(params_text))
        if scheme.lower() == "basic":
            if not self.creds.username:
                raise RegistryError("unauthorized: the registry asks for a user name and "
                                    "password, and none was given", 401)
            import base64
            pair = f"{self.creds.username}:{self.creds.password}".encode()
            return "Basic " + base64.b64encode(pair).decode()
        if scheme.lower() != "bearer" or "realm" not in params:
            return None
        if self.creds.token and not self.creds.username:
            return "Bearer " + self.creds.token
        query = {"service": params.get("service", "")} if params.get("service") else {}
        query["scope"] = params.get("scope") or f"repository:{self.ref.repository}:pull"
        auth = (self.creds.username, self.creds.password) if self.creds.username else None
        try:
            resp = self._session.get(params["realm"], params=query, auth=auth,
                                     timeout=self.timeout, verify=self._verify(s))
        except requests.RequestException as exc:
            raise RegistryError(f"token from {params['realm']}: {_short(exc)}") from None
        if resp.status_code != 200:
            raise _error_of(resp, f"token from {params['realm']}")
        try:
            body = resp.json()
            token = body.get("token") or body.get("access_token")
        except ValueError:
            token = None
        if not token:
            raise RegistryError(f"token from {params['realm']}: no token in the answer")
        return "Bearer " + str(token)

    # --- manifests ---
    def manifest(self, reference: str) -> tuple[str, str, bytes]:
        """(media type, digest, body) of a manifest or index; a digest reference is checked."""
        resp = self._request(f"/v2/{self.ref.repository}/manifests/{reference}", ACCEPT)
        body = resp.content
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(f"manifest {reference}: the registry sent content with digest "
                                f"{digest}")
        media = resp.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            doc = _json(body)
        except ValueError:
            raise RegistryError(f"manifest {reference}: not JSON") from None
        media = str(doc.get("mediaType") or media)
        if media not in INDEX_TYPES + MANIFEST_TYPES:
            media = INDEX_TYPES[0] if "manifests" in doc else MANIFEST_TYPES[0]
        return media, digest, body

    def resolve(self) -> tuple[str, dict[str, Any], str]:
        """The image manifest for this platform: (manifest digest, manifest, repo digest). The
        repo digest is the digest of what the reference named (the index when there is one)."""
        media, digest, body = self.manifest(self.ref.reference)
        repo_digest = digest
        doc = _json(body)
        if media in INDEX_TYPES:
            chosen = select_platform(doc.get("manifests") or [])
            if chosen is None:
                raise RegistryError(f"{self.ref}: no image for linux/{go_arch()} in the index",
                                    not_found=True)
            _, digest, body = self.manifest(chosen)
            doc = _json(body)
        if not isinstance(doc.get("config"), dict) or not isinstance(doc.get("layers"), list):
            raise RegistryError(f"{self.ref}: the manifest has no config or layers")
        return digest, doc, repo_digest

    def blob(self, digest: str, dest: Path, progress: Callable[[int], None] | None = None
             ) -> int:
        """Stream blob ``digest`` into ``dest`` (a temp file the caller renames), checking the
        digest; returns the byte count."""
        if not _DIGEST.match(digest):
            raise RegistryError(f"unsupported digest {digest!r} (sha256 only)")
        resp = self._request(f"/v2/{self.ref.repository}/blobs/{digest}", stream=True)
        h = hashlib.sha256()
        n = 0
        try:
            with open(dest, "wb") as f:
                for chunk in _chunks(resp):
                    h.update(chunk)
                    f.write(chunk)
                    n += len(chunk)
                    if progress:
                        progress(len(chunk))
                f.flush()
                os.fsync(f.fileno())
        except requests.RequestException as exc:
            raise RegistryError(f"blob {digest}: {_short(exc)}") from None
        finally:
            resp.close()
        got = "sha256:" + h.hexdigest()
        if got != digest:
            raise RegistryError(f"blob {digest}: the registry sent content with digest {got}")
        return n


def select_platform(manifests: list[dict[str, Any]], os_name: str = "linux",
                    arch: str | None = None) -> str | None:
    arch = arch or go_arch()
    best: str | None = None
    for m in manifests:
        p = m.get("platform") or {}
        if p.get("os") == os_name and p.get("architecture") == arch:
            variant = p.get("variant")
            if arch == "arm64" and variant not in (None, "v8"):
                continue
            return str(m.get("digest"))
        if best is None and not p:
            best = str(m.get("digest"))
    return best


def _chunks(resp: requests.Response) -> Iterator[bytes]:
    yield from resp.iter_content(1 << 20)


def _json(body: bytes) -> dict[str, Any]:
    import json
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    return doc


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) < 300 else text[:300] + "..."


def _error_of(resp: requests.Response, what: str) -> RegistryError:
    """The registry's reason: its JSON ``errors`` (code + message) when present."""
    reason = ""
    try:
        errs = resp.json().get("errors") or []
        reason = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}".strip(": ")
                           for e in errs if isinstance(e, dict))
    except (ValueError, AttributeError):
        reason = resp.text[:200].strip()
    status = resp.status_code
    not_found = status == 404
    text = f"{what}: {status} {resp.reason}" + (f" ({reason})" if reason else "")
    return RegistryError(text, status, not_found)


