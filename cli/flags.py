"""Command-line flags for every config key, generated from the key tables in `config.py`.

`nodeName` -> `--node-name`; `supervision.heartbeatInterval` -> `--supervision-heartbeat-interval`;
`syncloop.crashLoopBackOffMax` -> `--syncloop-crash-loop-back-off-max` (see `SECTIONS`);
a per-process spec key -> `--process NAME.KEY=VALUE` (repeatable, e.g.
`--process pleg.heartbeatTimeout=30s`). `staticPodURLHeader` takes `--static-pod-url-header
NAME:VALUE` (repeatable). Flags are parsed with the same parsers as the file and win over it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any

from podvisor.common.config import (
    AUTHN_KEYS,
    AUTHN_SUB_KEYS,
    AUTHZ_KEYS,
    AUTHZ_SUB_KEYS,
    BOOL,
    HEADERS,
    SUPERVISION_KEYS,
    SYNCLOOP_KEYS,
    TOP_KEYS,
    ConfigError,
    Key,
)

# Plain sections (a map of keys): `<section>.<key>` -> `--<section>-<kebab key>`.
SECTIONS: tuple[tuple[str, tuple[Key, ...]], ...] = (("syncloop", SYNCLOOP_KEYS),)

# Extra spellings of a key's flag (the kubelet's own flag name where it differs).
ALIASES: dict[str, tuple[str, ...]] = {"runOnce": ("--runonce",)}

# [main port] Nested keys, under the kubelet's own flag names (kube-apiserver's for the token
# file): flag -> the key's path in the file.
NESTED: tuple[tuple[str, tuple[str, ...], Key], ...] = (
    ("--anonymous-auth", ("authentication", "anonymous", "enabled"),
     AUTHN_SUB_KEYS["anonymous"][0]),
    ("--client-ca-file", ("authentication", "x509", "clientCAFile"), AUTHN_SUB_KEYS["x509"][0]),
    ("--token-auth-file", ("authentication", "tokenFile"), AUTHN_KEYS[0]),
    ("--authorization-mode", ("authorization", "mode"), AUTHZ_KEYS[0]),
    # [issue 15] the webhook modes, under the kubelet's flag names
    ("--authentication-token-webhook", ("authentication", "webhook", "enabled"),
     AUTHN_SUB_KEYS["webhook"][0]),
    ("--authentication-token-webhook-cache-ttl", ("authentication", "webhook", "cacheTTL"),
     AUTHN_SUB_KEYS["webhook"][1]),
    ("--authorization-webhook-cache-authorized-ttl",
     ("authorization", "webhook", "cacheAuthorizedTTL"), AUTHZ_SUB_KEYS["webhook"][0]),
    ("--authorization-webhook-cache-unauthorized-ttl",
     ("authorization", "webhook", "cacheUnauthorizedTTL"), AUTHZ_SUB_KEYS["webhook"][1]),
)

__all__ = ["add_config_flags", "flag_name", "overrides_from_args"]


def flag_name(key: str) -> str:
    """camelCase -> kebab-case (`staticPodURL` -> `static-pod-url`)."""
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", key)
    return "-".join(w.lower() for w in words)


def _add(group: argparse._ArgumentGroup, flag: str, dest: str, key: Key) -> None:
    flags = (flag, *ALIASES.get(key.name, ()))
    if key.kind is BOOL:
        group.add_argument(*flags, dest=dest, nargs="?", const="true", default=None,
                           metavar="BOOL", help=key.help)
    elif key.kind is HEADERS:
        group.add_argument(*flags, dest=dest, action="append", default=None,
                           metavar=key.kind.metavar, help=key.help)
    else:
        group.add_argument(*flags, dest=dest, default=None, metavar=key.kind.metavar,
                           help=key.help)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    top = parser.add_argument_group("config keys (override the file)")
    for key in TOP_KEYS:
        _add(top, f"--{flag_name(key.name)}", f"cfg__{key.name}", key)
    for section, keys in SECTIONS:
        group = parser.add_argument_group(f"{section} keys (override the file)")
        for key in keys:
            _add(group, f"--{section}-{flag_name(key.name)}", f"sec__{section}__{key.name}", key)
    auth = parser.add_argument_group("authentication/authorization keys (override the file)")
    for flag, path, key in NESTED:
        _add(auth, flag, "nest__" + "__".join(path), key)
    sup = parser.add_argument_group("supervision keys (override the file)")
    for key in SUPERVISION_KEYS:
        _add(sup, f"--supervision-{flag_name(key.name)}", f"sup__{key.name}", key)
    sup.add_argument("--process", dest="process_overrides", action="append", default=[],
                     metavar="NAME.KEY=VALUE",
                     help="a restart spec key of one process, e.g. pleg.heartbeatTimeout=30s")


def _headers(values: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in values:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise ConfigError("staticPodURLHeader", f"expected NAME:VALUE, got {item!r}")
        out.setdefault(name.strip(), []).append(value.strip())
    return out


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given, as a nested camelCase mapping to merge over the file."""
    out: dict[str, Any] = {}
    ns: Mapping[str, Any] = vars(args)
    for key in TOP_KEYS:
        value = ns.get(f"cfg__{key.name}")
        if value is not None:
            out[key.name] = _headers(value) if key.kind is HEADERS else value
    for section, keys in SECTIONS:
        values = {k.name: ns[f"sec__{section}__{k.name}"] for k in keys
                  if ns.get(f"sec__{section}__{k.name}") is not None}
        if values:
            out[section] = values
    for _flag, path, _key in NESTED:
        value = ns.get("nest__" + "__".join(path))
        if value is not None:
            holder = out
            for part in path[:-1]:
                holder = holder.setdefault(part, {})
            holder[path[-1]] = value
    sup: dict[str, Any] = {}
    for key in SUPERVISION_KEYS:
        value = ns.get(f"sup__{key.name}")
        if value is not None:
            sup[key.name] = value
    procs: dict[str, dict[str, Any]] = {}
    for item in ns.get("process_overrides") or []:
        target, sep, value = item.partition("=")
        name, dot, key_name = target.partition(".")
        if not sep or not dot or not name or not key_name:
            raise ConfigError("--process", f"expected NAME.KEY=VALUE, got {item!r}")
        procs.setdefault(name, {})[key_name] = value
    if procs:
        sup["processes"] = procs
    if sup:
        out["supervision"] = sup
    return out
