"""Readers for the volumes the ``volumes`` process mounts (API pods only, issue 25):
``persistentVolumeClaim``, ``ephemeral`` and inline ``csi``. Validated as the API server's
``validateVolumeSource`` does (its messages); static pods never get here (``policy``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podvisor.services.pod import names, policy
from podvisor.services.pod.fields import Findings, as_map, check_fields, get_bool, get_str, join
from podvisor.services.pod.model import ClaimVolume, CSIVolume, EphemeralVolume

_ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


def parse_claim(f: Findings, body: Mapping[str, Any], where: str) -> ClaimVolume | None:
    check_fields(f, body, where, policy.CLAIM_KNOWN, {})
    claim = get_str(f, body, "claimName", where)
    if not claim:
        f.error(join(where, "claimName"), "Required value")
        return None
    return ClaimVolume(claim, get_bool(f, body, "readOnly", where))


def parse_ephemeral(f: Findings, body: Mapping[str, Any], where: str) -> EphemeralVolume | None:
    """``validateEphemeralVolumeSource``: a template with a claim spec (access modes, a
    storage request unless it names a data source)."""
    check_fields(f, body, where, policy.EPHEMERAL_KNOWN, {})
    errors = len(f.errors)
    tw = join(where, "volumeClaimTemplate")
    template = as_map(f, body.get("volumeClaimTemplate"), tw) \
        if body.get("volumeClaimTemplate") is not None else None
    if template is None:
        if len(f.errors) == errors:
            f.error(tw, "Required value")
        return None
    check_fields(f, template, tw, policy.CLAIM_TEMPLATE_KNOWN, {})
    spec = as_map(f, template.get("spec"), join(tw, "spec")) \
        if template.get("spec") is not None else None
    if spec is None:
        if len(f.errors) == errors:
            f.error(join(tw, "spec"), "Required value")
        return None
    modes = spec.get("accessModes")
    if not isinstance(modes, list) or not modes:
        f.error(join(tw, "spec.accessModes"), "Required value: at least 1 access mode is "
                                              "required")
    else:
        for mode in modes:
            if mode not in _ACCESS_MODES:
                f.error(join(tw, "spec.accessModes"), f'Unsupported value: "{mode}": supported '
                        f"values: {', '.join(repr(m) for m in _ACCESS_MODES)}")
    resources = spec.get("resources")
    requests = resources.get("requests") if isinstance(resources, Mapping) else None
    if not (isinstance(requests, Mapping) and "storage" in requests) \
            and spec.get("dataSource") is None and spec.get("dataSourceRef") is None:
        f.error(join(tw, "spec.resources[storage]"), "Required value")
    if len(f.errors) > errors:
        return None
    return EphemeralVolume(dict(template))


def parse_csi(f: Findings, body: Mapping[str, Any], where: str) -> CSIVolume | None:
    check_fields(f, body, where, policy.CSI_VOLUME_KNOWN, {})
    errors = len(f.errors)
    driver = get_str(f, body, "driver", where)
    if not driver:
        f.error(join(where, "driver"), "Required value")
    elif reason := names.dns1123_subdomain(driver.lower()):
        f.error(join(where, "driver"), f'Invalid value: "{driver}": {reason}')
    attrs: dict[str, str] = {}
    raw = body.get("volumeAttributes")
    if raw is not None:
        m = as_map(f, raw, join(where, "volumeAttributes"))
        for k, v in (m or {}).items():
            if not isinstance(v, str):
                f.error(join(where, f"volumeAttributes[{k}]"), "must be a string")
            else:
                attrs[k] = v
    secret = ""
    if body.get("nodePublishSecretRef") is not None:
        ref = as_map(f, body["nodePublishSecretRef"], join(where, "nodePublishSecretRef"))
        secret = get_str(f, ref or {}, "name", join(where, "nodePublishSecretRef"))
        if ref is not None and not secret:
            f.error(join(where, "nodePublishSecretRef.name"), "Required value")
    read_only = get_bool(f, body, "readOnly", where)
    fs_type = get_str(f, body, "fsType", where)
    if len(f.errors) > errors:
        return None
    return CSIVolume(driver, read_only, fs_type, attrs, secret)
