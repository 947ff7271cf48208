"""Readers for the volume plugins' sources (issue 24): ``nfs``, ``iscsi``, ``fc`` and
``flexVolume``, validated as the API server's ``validateVolumeSource`` does (its messages).
A ``secretRef`` (iscsi CHAP, flexVolume) is an API object: static pods are refused it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from podvisor.services.pod import policy
from podvisor.services.pod.fields import (
    Findings,
    as_map,
    check_fields,
    get_bool,
    get_opt_int,
    get_str,
    get_str_list,
    get_str_map,
    join,
)
from podvisor.services.pod.volume_plugins import (
    FCVolume,
    FlexVolume,
    ISCSIVolume,
    NFSVolume,
    PluginVolume,
)

_IQN = re.compile(r"^iqn\.\d{4}-\d{2}\.(?:[A-Za-z0-9-]+\.)*[A-Za-z0-9-]+(?::.*)?$")
_EUI = re.compile(r"^eui\.[0-9A-Fa-f]{16}$")
_NAA = re.compile(r"^naa\.(?:[0-9A-Fa-f]{16}|[0-9A-Fa-f]{32})$")


def parse_plugin_volume(f: Findings, kind: str, body: Mapping[str, Any],
                        where: str) -> PluginVolume | None:
    errors = len(f.errors)
    secret_rule = {} if f.api_objects else policy.PLUGIN_SECRET_UNSUPPORTED
    out: PluginVolume | None
    if kind == "nfs":
        out = _nfs(f, body, where)
    elif kind == "iscsi":
        check_fields(f, body, where, policy.ISCSI_KNOWN | ({policy.SECRET_REF}
                     if f.api_objects else set()), secret_rule)
        out = _iscsi(f, body, where)
    elif kind == "fc":
        out = _fc(f, body, where)
    else:
        check_fields(f, body, where, policy.FLEX_VOLUME_KNOWN | ({policy.SECRET_REF}
                     if f.api_objects else set()), secret_rule)
        out = _flex(f, body, where)
    return out if len(f.errors) == errors else None


def _nfs(f: Findings, body: Mapping[str, Any], where: str) -> NFSVolume:
    check_fields(f, body, where, policy.NFS_KNOWN, {})
    server = get_str(f, body, "server", where, required=True)
    path = get_str(f, body, "path", where, required=True)
    if path and not path.startswith("/"):
        f.error(join(where, "path"), "must be an absolute path")
    return NFSVolume(server, path, get_bool(f, body, "readOnly", where))


def _valid_iqn(value: str) -> str:
    if value.startswith("iqn."):
        return "" if _IQN.match(value) else "must be valid format"
    if value.startswith("eui."):
        return "" if _EUI.match(value) else "must be valid format"
    if value.startswith("naa."):
        return "" if _NAA.match(value) else "must be valid format"
    return "must be valid format starting with iqn, eui, or naa"


def _secret_name(f: Findings, body: Mapping[str, Any], where: str) -> str:
    if body.get(policy.SECRET_REF) is None:
        return ""
    ref = as_map(f, body[policy.SECRET_REF], join(where, policy.SECRET_REF))
    return get_str(f, ref or {}, "name", join(where, policy.SECRET_REF), required=True)


def _iscsi(f: Findings, body: Mapping[str, Any], where: str) -> ISCSIVolume:
    portal = get_str(f, body, "targetPortal", where, required=True)
    iqn = get_str(f, body, "iqn", where, required=True)
    if iqn and (why := _valid_iqn(iqn)):
        f.error(join(where, "iqn"), why)
    lun = get_opt_int(f, body, "lun", where, minimum=0, maximum=255)
    initiator = get_str(f, body, "initiatorName", where)
    if initiator and (why := _valid_iqn(initiator)):
        f.error(join(where, "initiatorName"), why)
    discovery = get_bool(f, body, "chapAuthDiscovery", where)
    session = get_bool(f, body, "chapAuthSession", where)
    secret = _secret_name(f, body, where)
    if (discovery or session) and not secret and policy.SECRET_REF not in body:
        f.error(join(where, "secretRef"), "Required value: CHAP secret required")
    return ISCSIVolume(portal, iqn, lun or 0,
                       get_str(f, body, "iscsiInterface", where) or "default",
                       get_str(f, body, "fsType", where), get_bool(f, body, "readOnly", where),
                       get_str_list(f, body, "portals", where), discovery, session, secret,
                       initiator)


def _fc(f: Findings, body: Mapping[str, Any], where: str) -> FCVolume:
    check_fields(f, body, where, policy.FC_KNOWN, {})
    wwns = get_str_list(f, body, "targetWWNs", where)
    wwids = get_str_list(f, body, "wwids", where)
    lun = get_opt_int(f, body, "lun", where, minimum=0, maximum=255)
    if bool(wwns) == bool(wwids):
        f.error(join(where, "targetWWNs"), "must specify either targetWWNs or wwids, but not "
                                           "both")
    elif wwns and lun is None:
        f.error(join(where, "lun"), "lun is required if targetWWNs is specified")
    return FCVolume(wwns, lun, wwids, get_str(f, body, "fsType", where),
                    get_bool(f, body, "readOnly", where))


def _flex(f: Findings, body: Mapping[str, Any], where: str) -> FlexVolume:
    driver = get_str(f, body, "driver", where, required=True)
    options = get_str_map(f, body, "options", where)
    for key in options:
        if key.lower().startswith("kubernetes.io/"):
            f.error(join(where, f"options[{key}]"), "kubernetes.io and subdomains are reserved")
    return FlexVolume(driver, get_str(f, body, "fsType", where), _secret_name(f, body, where),
                      get_bool(f, body, "readOnly", where), options)
