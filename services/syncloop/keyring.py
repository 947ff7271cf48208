"""Registry credentials for image pulls: the kubelet's ``credentialprovider`` keyring. Pure
parsing and matching; the files and Secrets are read by the caller.

- A pod's ``imagePullSecrets`` (the ServiceAccount admission plugin copies the account's into
  the pod's spec, so the kubelet reads only the pod's): a Secret of type
  ``kubernetes.io/dockerconfigjson`` gives the ``auths`` of its ``.dockerconfigjson``, one of
  type ``kubernetes.io/dockercfg`` its ``.dockercfg`` map; any other Secret gives nothing
  (``MakeDockerKeyring``).
- The node's own credentials (the kubelet's default keyring): the first ``config.json``
  (``{"auths": ...}``) found in the search paths (podvisor: ``<rootDir>``, the working
  directory, ``$HOME/.docker``, ``/.docker``, as the kubelet with ``--root-dir``), else the
  first legacy ``.dockercfg``.
- An entry's key is a registry location (``registry.local:5000``, ``https://host/v2/``,
  ``*.example.com/team``): the scheme and a ``/v1/``/``/v2/`` prefix are dropped; an image
  matches when its host has the same number of dot-separated parts each matching the key's
  (shell globs), the same port, and a path that starts with the key's (``URLsMatch``).
  Matches come most specific first (keys reverse-sorted); with none, an image of Docker Hub
  takes the ``index.docker.io`` entry. ``auth`` (base64 ``user:password``) overrides
  ``username``/``password``.
- ``lookup`` returns the pod's credentials first, then the node's; the pull tries each in turn
  until one works, and pulls anonymously only when there is none (``PullImage``).
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podvisor.services.pod import Pod

DOCKER_CONFIG_JSON = "kubernetes.io/dockerconfigjson"
DOCKER_CONFIG_JSON_KEY = ".dockerconfigjson"
DOCKERCFG = "kubernetes.io/dockercfg"
DOCKERCFG_KEY = ".dockercfg"
DEFAULT_REGISTRY_HOST = "index.docker.io"


@dataclass(frozen=True)
class Credential:
    """One registry login (CRI ``AuthConfig``'s fields the kubelet fills)."""

    username: str
    password: str
    where: str = ""  # where it came from (a Secret's name, a file), for logs only


class KeyringError(ValueError):
    """A credentials document that is not what it claims (bad JSON, a bad ``auth``)."""


def _entry(key: str, raw: Any, where: str) -> Credential:
    if not isinstance(raw, Mapping):
        raise KeyringError(f"{where}: entry {key!r} is not an object")
    user, password = str(raw.get("username") or ""), str(raw.get("password") or "")
    auth = raw.get("auth")
    if auth:
        try:
            user, sep, password = base64.b64decode(str(auth), validate=True).decode().partition(
                ":")
        except (binascii.Error, UnicodeDecodeError):
            sep = ""
        if not sep:
            raise KeyringError(f"{where}: unable to parse auth field, must be formatted as "
                               "base64(username:password)")
    return Credential(user, password, where)


def parse_config(data: bytes, where: str, auths: bool) -> dict[str, Credential]:
    """A docker ``config.json`` (``auths``: the ``auths`` map of it) or a legacy
    ``.dockercfg`` (the map itself): registry location -> credential."""
    try:
        doc = json.loads(data)
    except ValueError as err:
        raise KeyringError(f"{where}: not JSON: {err}") from None
    if auths:
        doc = doc.get("auths") if isinstance(doc, Mapping) else None
        if doc is None:
            return {}
    if not isinstance(doc, Mapping):
        raise KeyringError(f"{where}: not a map of registries")
    return {str(k): _entry(str(k), v, where) for k, v in doc.items()}


def secret_config(name: str, secret_type: str,
                  data: Mapping[str, bytes]) -> dict[str, Credential]:
    """What one pull Secret gives (nothing unless its type and key say it holds one)."""
    if secret_type == DOCKER_CONFIG_JSON and data.get(DOCKER_CONFIG_JSON_KEY):
        return parse_config(data[DOCKER_CONFIG_JSON_KEY], f"secret {name}", auths=True)
    if secret_type == DOCKERCFG and data.get(DOCKERCFG_KEY):
        return parse_config(data[DOCKERCFG_KEY], f"secret {name}", auths=False)
    return {}


def node_config(search: Iterable[Path]) -> dict[str, Credential]:
    """The node's credentials: the first readable ``config.json`` in ``search``, else the
    first ``.dockercfg`` (a file that does not parse is skipped, as the kubelet does)."""
    paths = list(search)
    for name, auths in (("config.json", True), (".dockercfg", False)):
        for folder in paths:
            path = folder / name
            try:
                return parse_config(path.read_bytes(), str(path), auths)
            except (OSError, KeyringError):
                continue
    return {}


def _key(location: str) -> str:
    """``BasicDockerKeyring.Add``: no scheme, ``/v1/`` and ``/v2/`` mean the host."""
    rest = location.split("://", 1)[1] if "://" in location else location
    host, slash, path = rest.partition("/")
    path = slash + path
    if path.startswith(("/v2/", "/v1/")):
        path = path[3:]
    return host + path if path not in ("", "/") else host


def _split(url: str) -> tuple[list[str], str, str]:
    host, slash, path = url.partition("/")
    name, colon, port = host.rpartition(":")
    if not colon or not port.isdigit():
        name, port = host, ""
    return name.split("."), port, slash + path


def urls_match(glob: str, target: str) -> bool:
    """``URLsMatch``: same port, same number of host parts each matching (globs), and the
    key's path a prefix of the image's."""
    g_parts, g_port, g_path = _split(glob)
    t_parts, t_port, t_path = _split(target)
    if g_port != t_port or len(g_parts) != len(t_parts) or not t_path.startswith(g_path):
        return False
    return all(fnmatch.fnmatchcase(t, g) for g, t in zip(g_parts, t_parts, strict=True))


def _default_registry(image: str) -> bool:
    first, _, rest = image.partition("/")
    if not first:
        return False
    if not rest or first in ("docker.io", "index.docker.io"):
        return True
    return not any(ch in first for ch in ".:")


class Keyring:
    """Credentials from several sources, each consulted in turn (``UnionDockerKeyring``)."""

    def __init__(self, *layers: Iterable[tuple[str, Credential]]) -> None:
        """Each layer: (registry location, credential) pairs (a location may repeat)."""
        self._layers: list[dict[str, list[Credential]]] = []
        for pairs in layers:
            layer: dict[str, list[Credential]] = {}
            for location, cred in pairs:
                layer.setdefault(_key(location), []).append(cred)
            self._layers.append(layer)

    def lookup(self, repo: str) -> list[Credential]:
        """The credentials for ``repo`` (an image name without tag or digest, its registry
        host first), most specific first, pod's before node's."""
        out: list[Credential] = []
        for layer in self._layers:
            found = [c for k in sorted(layer, reverse=True) if urls_match(k, repo)
                     for c in layer[k]]
            if not found and _default_registry(repo):
                found = list(layer.get(DEFAULT_REGISTRY_HOST, ()))
            out.extend(found)
        return out


def repository(image: str) -> str:
    """The image name without its tag or digest (``127.0.0.1:5000/a/b:1`` ->
    ``127.0.0.1:5000/a/b``); a Docker Hub name gets its ``docker.io/library/`` form."""
    name = image.split("@", 1)[0]
    head, slash, last = name.rpartition("/")
    if ":" in last:
        last = last.split(":", 1)[0]
    name = head + slash + last
    first, _, rest = name.partition("/")
    if not rest:
        return f"docker.io/library/{name}"
    if not any(ch in first for ch in ".:") and first != "localhost":
        return f"docker.io/{name}"
    return name


SecretReader = Callable[[str, str], "tuple[str, Mapping[str, bytes]] | None"]


def pod_keyring(pod: Pod, read: SecretReader | None,
                search: Iterable[Path]) -> tuple[Keyring, list[str]]:
    """The keyring for ``pod``'s pulls (its pull Secrets, then the node's files) and the
    names of the Secrets that could not be read (``getPullSecretsForPod``: the pull goes on
    without them; with no API connection, ``read`` is None and every named one is missing).
    An empty name is skipped, a Secret that does not parse counts as missing."""
    pairs: list[tuple[str, Credential]] = []  # one layer for the pod's (``MakeDockerKeyring``)
    missing: list[str] = []
    for name in pod.spec.image_pull_secrets:
        if not name:
            continue
        try:
            found = read(pod.namespace, name) if read is not None else None
            if found is None:
                raise OSError(f'secret "{name}" not found')
            pairs.extend(secret_config(name, *found).items())
        except (OSError, KeyringError):
            missing.append(name)
    return Keyring(pairs, node_config(search).items()), missing
