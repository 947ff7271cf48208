"""The API objects the volume manager reads, typed: PersistentVolumeClaim, PersistentVolume,
CSIDriver (storage.k8s.io/v1) and a Node's labels, from their JSON (kube-apiserver's shapes).
Anything missing or of the wrong type reads as absent (a malformed object fails the volume
with a message, never the process)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from podvisor.services.apiserver import ApiMeta
from podvisor.services.pod import PLUGIN_KINDS, PluginVolume, plugin_volume_from_wire


def dig(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]...``, None where a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _str(obj: Any, *keys: str) -> str:
    value = dig(obj, *keys)
    return value if isinstance(value, str) else ""


def _strs(obj: Any, *keys: str) -> tuple[str, ...]:
    value = dig(obj, *keys)
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _str_map(obj: Any, *keys: str) -> dict[str, str]:
    value = dig(obj, *keys)
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


def _bool(obj: Any, *keys: str, default: bool) -> bool:
    value = dig(obj, *keys)
    return value if isinstance(value, bool) else default


@dataclass(frozen=True)
class OwnerRef:
    uid: str
    kind: str
    name: str
    controller: bool


@dataclass(frozen=True)
class Claim:
    """A PersistentVolumeClaim: ``volume_name`` (spec.volumeName), ``phase``."""

    meta: ApiMeta
    volume_name: str
    phase: str
    owners: tuple[OwnerRef, ...] = ()

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Claim:
        refs = dig(obj, "metadata", "ownerReferences")
        owners = tuple(OwnerRef(_str(r, "uid"), _str(r, "kind"), _str(r, "name"),
                                _bool(r, "controller", default=False))
                       for r in (refs if isinstance(refs, list) else ()))
        return cls(ApiMeta.of(obj), _str(obj, "spec", "volumeName"), _str(obj, "status", "phase"),
                   owners)

    def controlled_by(self, uid: str) -> bool:
        return any(o.controller and o.uid == uid for o in self.owners)


@dataclass(frozen=True)
class SelectorRequirement:
    key: str
    operator: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class SelectorTerm:
    expressions: tuple[SelectorRequirement, ...] = ()
    fields: tuple[SelectorRequirement, ...] = ()


def _requirements(raw: Any) -> tuple[SelectorRequirement, ...]:
    return tuple(SelectorRequirement(_str(r, "key"), _str(r, "operator"), _strs(r, "values"))
                 for r in (raw if isinstance(raw, list) else ()))


@dataclass(frozen=True)
class CSISource:
    """A PersistentVolume's ``csi`` source."""

    driver: str
    handle: str
    fs_type: str = ""
    read_only: bool = False
    attributes: Mapping[str, str] = field(default_factory=dict)
    stage_secret: tuple[str, str] | None = None  # (namespace, name)
    publish_secret: tuple[str, str] | None = None


def _secret_ref(obj: Any, key: str) -> tuple[str, str] | None:
    name = _str(obj, key, "name")
    return (_str(obj, key, "namespace"), name) if name else None


@dataclass(frozen=True)
class Volume:
    """A PersistentVolume: which source (``kind``: ``hostPath``, ``local``, ``csi`` or the
    unsupported one found), its claim reference and node affinity."""

    meta: ApiMeta
    kind: str
    path: str = ""  # hostPath.path / local.path
    host_path_type: str = ""
    csi: CSISource | None = None
    claim_uid: str = ""
    bound: bool = False  # spec.claimRef is set
    access_modes: tuple[str, ...] = ()
    affinity: tuple[SelectorTerm, ...] | None = None  # None: no nodeAffinity
    source: PluginVolume | None = None  # [issue 24] nfs, iscsi, fc, flexVolume
    mount_options: tuple[str, ...] = ()  # spec.mountOptions
    secret_namespace: str = ""  # iscsi/flexVolume secretRef.namespace

    SOURCES = ("hostPath", "local", "csi", "nfs", "iscsi", "fc", "rbd", "cephfs", "cinder",
               "awsElasticBlockStore", "gcePersistentDisk", "azureDisk", "azureFile",
               "flexVolume", "glusterfs", "vsphereVolume", "portworxVolume", "quobyte",
               "scaleIO", "storageos", "photonPersistentDisk", "flocker")

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Volume:
        spec = dig(obj, "spec")
        kind = next((k for k in cls.SOURCES if isinstance(dig(spec, k), Mapping)), "")
        csi = None
        if kind == "csi":
            src = dig(spec, "csi")
            csi = CSISource(_str(src, "driver"), _str(src, "volumeHandle"), _str(src, "fsType"),
                            _bool(src, "readOnly", default=False),
                            _str_map(src, "volumeAttributes"),
                            _secret_ref(src, "nodeStageSecretRef"),
                            _secret_ref(src, "nodePublishSecretRef"))
        terms = dig(spec, "nodeAffinity", "required", "nodeSelectorTerms")
        affinity = None
        if isinstance(terms, list):
            affinity = tuple(SelectorTerm(_requirements(dig(t, "matchExpressions")),
                                          _requirements(dig(t, "matchFields")))
                             for t in terms)
        path = _str(spec, kind, "path") if kind in ("hostPath", "local") else ""
        source = None
        if kind in PLUGIN_KINDS:
            try:
                source = plugin_volume_from_wire({kind: dig(spec, kind)})
            except (KeyError, TypeError, ValueError, AttributeError):
                source = None  # malformed: resolving it fails the volume
        return cls(ApiMeta.of(obj), kind, path, _str(spec, "hostPath", "type"), csi,
                   _str(spec, "claimRef", "uid"), isinstance(dig(spec, "claimRef"), Mapping),
                   _strs(spec, "accessModes"), affinity, source, _strs(spec, "mountOptions"),
                   _str(spec, kind, "secretRef", "namespace"))


@dataclass(frozen=True)
class Driver:
    """A CSIDriver's spec, with the API's defaults when the object is missing."""

    name: str
    found: bool = False
    attach_required: bool = True
    pod_info_on_mount: bool = False
    fs_group_policy: str = "ReadWriteOnceWithFSType"
    lifecycle_modes: tuple[str, ...] = ("Persistent",)

    @classmethod
    def of(cls, name: str, obj: Mapping[str, Any] | None) -> Driver:
        if obj is None:
            return cls(name)
        spec = dig(obj, "spec")
        return cls(name, True, _bool(spec, "attachRequired", default=True),
                   _bool(spec, "podInfoOnMount", default=False),
                   _str(spec, "fsGroupPolicy") or "ReadWriteOnceWithFSType",
                   _strs(spec, "volumeLifecycleModes") or ("Persistent",))


def _requirement_holds(req: SelectorRequirement, value: str | None) -> bool:
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        try:
            have, bound = int(value), int(req.values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def affinity_matches(terms: Sequence[SelectorTerm], node: str,
                     labels: Mapping[str, str]) -> bool:
    """A NodeSelector (``nodeSelectorTerms``, ORed; each term's requirements ANDed; an empty
    term matches nothing) against the Node's labels and name (``matchFields``:
    ``metadata.name``)."""
    for term in terms:
        if not term.expressions and not term.fields:
            continue
        if all(_requirement_holds(r, labels.get(r.key)) for r in term.expressions) and all(
                _requirement_holds(r, node if r.key == "metadata.name" else None)
                for r in term.fields):
            return True
    return False
