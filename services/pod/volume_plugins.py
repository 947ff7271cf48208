"""The network and driver volume sources the kubelet's volume plugins mount (issue 24): ``nfs``,
``iscsi``, ``fc`` and ``flexVolume``, as frozen values with their wire form (the API's field
names; defaults left out). The ``volumes`` process mounts them (services/volumes/netplugins.py,
flexvolume.py); static pods may use them, but for a ``secretRef`` (an API object)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NFSVolume:
    server: str
    path: str
    read_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"server": self.server, "path": self.path}
        if self.read_only:
            out["readOnly"] = True
        return {"nfs": out}


@dataclass(frozen=True)
class ISCSIVolume:
    target_portal: str
    iqn: str
    lun: int
    iscsi_interface: str = "default"
    fs_type: str = ""
    read_only: bool = False
    portals: tuple[str, ...] = ()
    chap_auth_discovery: bool = False
    chap_auth_session: bool = False
    secret_ref: str = ""
    initiator_name: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"targetPortal": self.target_portal, "iqn": self.iqn,
                               "lun": self.lun, "iscsiInterface": self.iscsi_interface}
        for key, value in (("fsType", self.fs_type), ("readOnly", self.read_only),
                           ("portals", list(self.portals)),
                           ("chapAuthDiscovery", self.chap_auth_discovery),
                           ("chapAuthSession", self.chap_auth_session),
                           ("initiatorName", self.initiator_name)):
            if value:
                out[key] = value
        if self.secret_ref:
            out["secretRef"] = {"name": self.secret_ref}
        return {"iscsi": out}


@dataclass(frozen=True)
class FCVolume:
    target_wwns: tuple[str, ...] = ()
    lun: int | None = None
    wwids: tuple[str, ...] = ()
    fs_type: str = ""
    read_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.target_wwns:
            out["targetWWNs"] = list(self.target_wwns)
        if self.lun is not None:
            out["lun"] = self.lun
        if self.wwids:
            out["wwids"] = list(self.wwids)
        if self.fs_type:
            out["fsType"] = self.fs_type
        if self.read_only:
            out["readOnly"] = True
        return {"fc": out}


@dataclass(frozen=True)
class FlexVolume:
    driver: str
    fs_type: str = ""
    secret_ref: str = ""
    read_only: bool = False
    options: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": self.driver}
        if self.fs_type:
            out["fsType"] = self.fs_type
        if self.secret_ref:
            out["secretRef"] = {"name": self.secret_ref}
        if self.read_only:
            out["readOnly"] = True
        if self.options:
            out["options"] = dict(self.options)
        return {"flexVolume": out}


PluginVolume = NFSVolume | ISCSIVolume | FCVolume | FlexVolume
PLUGIN_KINDS = ("nfs", "iscsi", "fc", "flexVolume")


def _secret_name(source: Mapping[str, Any]) -> str:
    ref = source.get("secretRef")
    return str(ref["name"]) if isinstance(ref, Mapping) and "name" in ref else ""


def plugin_volume_from_wire(v: Mapping[str, Any]) -> PluginVolume | None:
    """The source of a validated volume's wire form, None when it is none of these."""
    if (n := v.get("nfs")) is not None:
        return NFSVolume(n["server"], n["path"], n.get("readOnly", False))
    if (i := v.get("iscsi")) is not None:
        return ISCSIVolume(i["targetPortal"], i["iqn"], i["lun"],
                           i.get("iscsiInterface", "default"), i.get("fsType", ""),
                           i.get("readOnly", False), tuple(i.get("portals", ())),
                           i.get("chapAuthDiscovery", False), i.get("chapAuthSession", False),
                           _secret_name(i),
                           i.get("initiatorName", ""))
    if (c := v.get("fc")) is not None:
        return FCVolume(tuple(c.get("targetWWNs", ())), c.get("lun"), tuple(c.get("wwids", ())),
                        c.get("fsType", ""), c.get("readOnly", False))
    if (x := v.get("flexVolume")) is not None:
        return FlexVolume(x["driver"], x.get("fsType", ""),
                          _secret_name(x), x.get("readOnly", False),
                          dict(x.get("options", {})))
    return None
