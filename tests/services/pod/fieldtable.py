"""The v1 Pod API's fields (the ``kubernetes`` client's models) and the table of what podvisor
does with each (docs/ARCHITECTURE.md, "Every field of the v1 Pod API"): shared by
test_field_coverage.py."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from kubernetes import client

from podvisor.services.pod import policy

DOC = Path(__file__).resolve().parents[3] / "docs" / "ARCHITECTURE.md"
HEADING = "#### Every field of the v1 Pod API"
DECISIONS = ("supported", "rejected", "ignored", "pending", "status")
COVERS_SUBTREE = ("rejected", "ignored", "pending", "status")
# The container model is one schema under three lists: init and ephemeral containers' rows are
# the containers' rows (but for the one field an ephemeral container adds).
SAME_AS = {"spec.initContainers[].": "spec.containers[].",
           "spec.ephemeralContainers[].": "spec.containers[]."}
OWN_ROW = frozenset({"spec.ephemeralContainers[].targetContainerName"})


def schema_paths() -> list[str]:
    """Every field of V1Pod, as ``spec.containers[].ports[].hostIP`` (``[]``: a list)."""
    out: list[str] = []

    def walk(cls: type, prefix: str, seen: frozenset[str]) -> None:
        for attr, typ in cls.openapi_types.items():  # type: ignore[attr-defined]
            name = cls.attribute_map[attr]  # type: ignore[attr-defined]
            listed = re.fullmatch(r"List\[(\w+)\]", typ)
            inner = listed.group(1) if listed else typ
            path = (f"{prefix}.{name}" if prefix else name) + ("[]" if listed else "")
            out.append(path)
            sub = getattr(client, inner, None)
            if sub is not None and hasattr(sub, "openapi_types") and inner not in seen:
                walk(sub, path, seen | {inner})

    walk(client.V1Pod, "", frozenset())
    return out


def expand(pattern: str) -> list[str]:
    """``a.{b,c}.d`` -> ``a.b.d``, ``a.c.d`` (every brace group, in turn)."""
    parts = re.split(r"\{([^{}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else [c.strip() for c in p.split(",")]
               for i, p in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def table_rows(text: str | None = None) -> dict[str, tuple[str, str]]:
    """path -> (decision, what podvisor does), from the doc's table."""
    text = DOC.read_text() if text is None else text
    start = text.index(HEADING)
    rows: dict[str, tuple[str, str]] = {}
    for line in text[start:].splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        decision = cells[1].strip("*")
        for pattern in re.findall(r"`([^`]+)`", cells[0]):
            for path in expand(pattern):
                if path in rows:
                    raise AssertionError(f"{path}: listed twice")
                rows[path] = (decision, cells[2])
    return rows


def lookup(path: str) -> str:
    if path in OWN_ROW:
        return path
    for prefix, same in SAME_AS.items():
        if path.startswith(prefix):
            return same + path.removeprefix(prefix)
    return path


# The policy's tables by the object they check (policy.py): the table must agree with them.
POLICY = {
    "metadata": (policy.METADATA_KNOWN, policy.METADATA_UNSUPPORTED),
    "spec": (policy.SPEC_KNOWN, policy.SPEC_UNSUPPORTED),
    "spec.containers[]": (policy.CONTAINER_KNOWN | {policy.CONTAINER_RESTART_POLICY},
                          policy.CONTAINER_UNSUPPORTED),
    "spec.containers[].lifecycle": (policy.LIFECYCLE_KNOWN, policy.LIFECYCLE_UNSUPPORTED),
    "spec.containers[].lifecycle.preStop": (policy.PRE_STOP_KNOWN, policy.PRE_STOP_UNSUPPORTED),
    "spec.containers[].lifecycle.postStart": (policy.PRE_STOP_KNOWN,
                                              policy.POST_START_UNSUPPORTED),
    "spec.containers[].ports[]": (policy.PORT_KNOWN, policy.PORT_UNSUPPORTED),
    "spec.containers[].volumeMounts[]": (policy.MOUNT_KNOWN, policy.MOUNT_UNSUPPORTED),
    "spec.containers[].securityContext": (policy.SECURITY_KNOWN, policy.SECURITY_UNSUPPORTED),
    "spec.containers[].resources": (policy.RESOURCES_KNOWN, policy.RESOURCES_UNSUPPORTED),
    "spec.securityContext": (policy.POD_SECURITY_KNOWN, policy.POD_SECURITY_UNSUPPORTED),
    "spec.volumes[]": (policy.VOLUME_KNOWN, policy.VOLUME_UNSUPPORTED),
    "spec.tolerations[]": (policy.TOLERATION_KNOWN, {}),
    "spec.containers[].env[]": (policy.ENV_KNOWN, {}),
    "spec.containers[].env[].valueFrom": (
        (*policy.VALUE_FROM_KNOWN, *policy.API_VALUE_FROM), {}),
    "spec.volumes[].emptyDir": (policy.EMPTY_DIR_KNOWN, {}),
    "spec.volumes[].hostPath": (policy.HOST_PATH_KNOWN, {}),
    "spec.volumes[].downwardAPI": (policy.DOWNWARD_API_KNOWN, {}),
    "spec.volumes[].downwardAPI.items[]": (policy.DOWNWARD_API_ITEM_KNOWN, {}),
    "spec.volumes[].configMap": (policy.CONFIG_MAP_VOLUME_KNOWN, {}),
    "spec.volumes[].secret": (policy.SECRET_VOLUME_KNOWN, {}),
    "spec.volumes[].projected": (policy.PROJECTED_KNOWN, {}),
    "spec.volumes[].persistentVolumeClaim": (policy.CLAIM_KNOWN, {}),
    "spec.volumes[].ephemeral": (policy.EPHEMERAL_KNOWN, {}),
    "spec.volumes[].ephemeral.volumeClaimTemplate": (policy.CLAIM_TEMPLATE_KNOWN, {}),
    "spec.volumes[].csi": (policy.CSI_VOLUME_KNOWN, {}),
    "spec.volumes[].nfs": (policy.NFS_KNOWN, {}),
    "spec.volumes[].iscsi": (policy.ISCSI_KNOWN, policy.PLUGIN_SECRET_UNSUPPORTED),
    "spec.volumes[].fc": (policy.FC_KNOWN, {}),
    "spec.volumes[].flexVolume": (policy.FLEX_VOLUME_KNOWN, policy.PLUGIN_SECRET_UNSUPPORTED),
    "spec.volumes[].projected.sources[]": (policy.PROJECTION_KINDS, {}),
    **{f"spec.volumes[].{at}.items[]": (policy.KEY_TO_PATH_KNOWN, {})
       for at in ("configMap", "secret", "projected.sources[].configMap",
                  "projected.sources[].secret")},
    **{f"spec.volumes[].projected.sources[].{kind}": (frozenset({"name", "items", "optional"}),
                                                      {})
       for kind in ("configMap", "secret")},
    "spec.volumes[].projected.sources[].downwardAPI": (frozenset({"items"}), {}),
    "spec.volumes[].projected.sources[].downwardAPI.items[]": (
        policy.DOWNWARD_API_ITEM_KNOWN, {}),
    "spec.volumes[].projected.sources[].serviceAccountToken": (policy.SA_TOKEN_KNOWN, {}),
    **{f"spec.containers[].{p}": (policy.PROBE_KNOWN, {})
       for p in ("livenessProbe", "readinessProbe", "startupProbe")},
    **{f"spec.containers[].{p}.{kind}": (known, {})
       for p in ("livenessProbe", "readinessProbe", "startupProbe", "lifecycle.preStop",
                 "lifecycle.postStart")
       for kind, known in policy.HANDLER_KNOWN.items()},
}
# Supported for API pods, rejected for static pods only (they may not reference API objects,
# as the kubelet's rule): policy.py lists them as rejected for the static case.
API_POD_FIELDS = {*(f"spec.volumes[].{k}"
                    for k in policy.API_VOLUME_KINDS + policy.MOUNTED_VOLUME_KINDS),
                  "spec.containers[].envFrom[]",
                  *(f"spec.volumes[].{k}.{policy.SECRET_REF}" for k in ("iscsi", "flexVolume"))}


def policy_decision(path: str) -> str | None:
    """What policy.py does with ``path`` (supported/rejected/ignored), or None when no table
    of it checks that object. A field no table names is an unknown field: ignored with a
    warning (a volume type: rejected)."""
    parent, _, name = path.rpartition(".")
    if path in API_POD_FIELDS:
        return "supported"
    if parent not in POLICY:
        return None
    known, unsupported = POLICY[parent]
    key = name.removesuffix("[]")
    if key in known:
        return "supported"
    if key in unsupported:
        return "rejected" if unsupported[key].reject else "ignored"
    return "rejected" if parent in REJECT_UNKNOWN else "ignored"


# Objects whose unknown keys reject the pod: an unknown volume type, a projection.
REJECT_UNKNOWN = ("spec.volumes[]", "spec.volumes[].projected.sources[]")
