"""The kubelet's nfs, iscsi and fc volume plugins (pkg/volume/{nfs,iscsi,fc}), as commands and
device lookups on the node (issue 24). Every command goes through a ``Runner`` and every device
lookup through ``Devices``, so unit tests check the exact argv and paths the kubelet uses.

- nfs (``SetUpAt``): ``mount -t nfs [-o ro,<PV mountOptions>] <server>:<path> <folder>``; on
  failure the folder is removed unless it became a mount point. Teardown: ``umount``, rmdir.
- iscsi (``AttachDisk``): the iface's transport from ``iscsiadm -m iface -I <iface> -o show``;
  per portal (``host`` -> ``host:3260``): the device ``/dev/disk/by-path/ip-<portal>-iscsi-
  <iqn>-lun-<lun>`` used when present, else ``iscsiadm -m discoverydb -t sendtargets -p
  <portal> -I <iface> -o new`` (CHAP keys updated with ``-o update -n <key> -v <value>``),
  ``... --discover``, ``iscsiadm -m node -p <portal> -T <iqn> -I <iface> --login`` and the
  device waited for (10 s). The device formatted when it has no file system (not read-only,
  ``blkid``, ``mkfs.<fsType>``) and mounted ``-t <fsType> -o ro|rw`` at the pod's folder.
  Teardown: ``umount``; once no other pod's volume uses the target, ``--logout`` and ``-o
  delete`` per portal. What the logout needs is kept in ``plugins/kubernetes.io/iscsi/
  <pod uid>~<volume>.json``.
- fc (``searchDisk``): ``/dev/disk/by-path/*-fc-0x<wwn>-lun-<lun>`` per target WWN, or
  ``/dev/disk/by-id/scsi-<wwid>`` (spaces as ``_``); none: every SCSI host rescanned (``- - -``
  to ``/sys/class/scsi_host/host*/scan``) and searched once more; a multipath ``dm-N`` holding
  the disk is used instead. Formatted when needed and mounted as iscsi. Teardown: ``umount``.
A difference: the kubelet mounts iscsi and fc disks once per node at a global path and binds
that into each pod; podvisor mounts the disk at each pod's folder.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from podvisor.services.pod import FCVolume, ISCSIVolume, NFSVolume
from podvisor.services.volumes.hostexec import Runner, RunnerError, mount

__all__ = ["Devices", "FakeDevices", "HostDevices", "IscsiDisk", "fc_setup", "format_and_mount",
           "iscsi_logout", "iscsi_setup", "nfs_setup", "portal"]

_TRANSPORT = re.compile(r"iface.transport_name = (.*)\n")


class Devices(Protocol):
    def listdir(self, path: str) -> list[str]: ...

    def realpath(self, path: str) -> str: ...

    def exists(self, path: str) -> bool: ...

    def glob(self, pattern: str) -> list[str]: ...

    def rescan_scsi_hosts(self) -> None: ...

    def wait_for(self, path: str, seconds: float) -> bool:
        """Whether ``path`` (a glob for non-tcp iscsi) exists within ``seconds``."""
        ...


class HostDevices:
    def __init__(self, sleep: Callable[[float], bool]) -> None:
        self._sleep = sleep  # the process's stop-aware sleep (False: stopping)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def glob(self, pattern: str) -> list[str]:
        return sorted(glob.glob(pattern))

    def rescan_scsi_hosts(self) -> None:
        for scan in glob.glob("/sys/class/scsi_host/host*/scan"):
            try:
                Path(scan).write_text("- - -")
            except OSError:
                continue

    def wait_for(self, path: str, seconds: float) -> bool:
        for _ in range(int(seconds) + 1):
            if self.glob(path) if "*" in path else self.exists(path):
                return True
            if not self._sleep(1.0):
                return False
        return False


class FakeDevices:
    """A /dev in memory: ``links`` maps a path to what it resolves to."""

    def __init__(self, links: Mapping[str, str] | None = None) -> None:
        self.links = dict(links or {})
        self.rescans = 0

    def listdir(self, path: str) -> list[str]:
        base = path.rstrip("/") + "/"
        return sorted({p[len(base):].split("/", 1)[0] for p in self.links
                       if p.startswith(base)})

    def realpath(self, path: str) -> str:
        return self.links.get(path, path)

    def exists(self, path: str) -> bool:
        return path in self.links

    def glob(self, pattern: str) -> list[str]:
        rx = re.compile(re.escape(pattern).replace(r"\*", "[^/]*") + "$")
        return sorted(p for p in self.links if rx.match(p))

    def rescan_scsi_hosts(self) -> None:
        self.rescans += 1

    def wait_for(self, path: str, seconds: float) -> bool:
        return bool(self.glob(path)) if "*" in path else self.exists(path)


def nfs_setup(runner: Runner, source: NFSVolume, folder: str, read_only: bool,
              mount_options: Sequence[str]) -> None:
    options = (["ro"] if read_only else []) + list(mount_options)
    mount(runner, f"{source.server}:{source.path}", folder, "nfs", options)


def format_and_mount(runner: Runner, device: str, folder: str, fs_type: str, read_only: bool,
                     mount_options: Sequence[str] = ()) -> None:
    """mount-utils' ``SafeFormatAndMount``: a disk with no file system (``blkid`` exits 2) is
    formatted first (never a read-only one); then mounted."""
    fs_type = fs_type or "ext4"
    options = ["ro" if read_only else "rw", *mount_options]
    if not read_only:
        probe = runner.run(["blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", device])
        if probe.error == "exit status 2":  # no file system, no partition table
            args = [device] if fs_type not in ("ext3", "ext4") else ["-F", "-m0", device]
            made = runner.run([f"mkfs.{fs_type}", *args])
            if not made.ok:
                raise RunnerError(f"format of disk {device!r} failed: type:({fs_type!r}) "
                                  f"target:({folder!r}) options:({','.join(options)!r}) "
                                  f"errcode:({made.error}) output:({made.output})")
    mount(runner, device, folder, fs_type, options)


def portal(value: str) -> str:
    """``portalMounter``: a portal without a port is on 3260."""
    return value if ":" in value else f"{value}:3260"


@dataclass(frozen=True)
class IscsiDisk:
    """What a logout needs (kept beside the plugin's folder until the teardown)."""

    portals: tuple[str, ...]
    iqn: str
    lun: int
    iface: str

    def to_json(self) -> str:
        return json.dumps({"portals": list(self.portals), "iqn": self.iqn, "lun": self.lun,
                           "iface": self.iface})

    @classmethod
    def from_json(cls, text: str) -> IscsiDisk:
        raw = json.loads(text)
        return cls(tuple(raw["portals"]), raw["iqn"], int(raw["lun"]), raw["iface"])


_CHAP_DISCOVERY = ("discovery.sendtargets.auth.username", "discovery.sendtargets.auth.password",
                   "discovery.sendtargets.auth.username_in",
                   "discovery.sendtargets.auth.password_in")
_CHAP_SESSION = ("node.session.auth.username", "node.session.auth.password",
                 "node.session.auth.username_in", "node.session.auth.password_in")


def _iscsiadm(runner: Runner, *args: str) -> tuple[bool, str, str]:
    ran = runner.run(["iscsiadm", *args])
    return ran.ok, ran.output, ran.error


def _chap(runner: Runner, base: list[str], keys: Sequence[str], method_key: str,
          secret: Mapping[str, str]) -> str:
    ok, out, _ = _iscsiadm(runner, *base, "-o", "update", "-n", method_key, "-v", "CHAP")
    if not ok:
        return f"iscsi: failed to update with CHAP, output: {out}"
    for key in keys:
        if secret.get(key):
            ok, out, _ = _iscsiadm(runner, *base, "-o", "update", "-n", key, "-v", secret[key])
            if not ok:
                return f"iscsi: failed to update key {key!r} error: {out}"
    return ""


def iscsi_setup(runner: Runner, devices: Devices, source: ISCSIVolume, volume: str,
                secret: Mapping[str, str]) -> tuple[str, IscsiDisk]:
    """Log in to the target (``AttachDisk``); the device path and what a logout needs.
    Raises RunnerError with the kubelet's message."""
    portals = tuple(dict.fromkeys(portal(p) for p in (source.target_portal, *source.portals)))
    iface = source.iscsi_interface or "default"
    if source.initiator_name:  # an iface of its own: <portal>:<volume>
        new = f"{portals[0]}:{volume}"
        if not _iscsiadm(runner, "-m", "iface", "-I", new, "-o", "show")[0]:
            for args in (("-o", "new"), ("-o", "update", "-n", "iface.initiatorname", "-v",
                                         source.initiator_name)):
                ok, out, _ = _iscsiadm(runner, "-m", "iface", "-I", new, *args)
                if not ok:
                    raise RunnerError(f"iscsi: failed to clone iface: {iface} error: {out}")
        iface = new
    ok, out, err = _iscsiadm(runner, "-m", "iface", "-I", iface, "-o", "show")
    if not ok:
        raise RunnerError(f"iscsi: could not read iface {iface} error: {out or err}")
    found = _TRANSPORT.search(out)
    transport = found.group(1).strip() if found else ""
    if not transport:
        raise RunnerError(f"Could not parse iface file for {iface}")
    paths: list[str] = []
    last = ""
    for tp in portals:
        path = (f"/dev/disk/by-path/ip-{tp}-iscsi-{source.iqn}-lun-{source.lun}"
                if transport == "tcp" else
                f"/dev/disk/by-path/pci-*-ip-{tp}-iscsi-{source.iqn}-lun-{source.lun}")
        if devices.wait_for(path, 1):
            paths.append(path)
            continue
        discovery = ["-m", "discoverydb", "-t", "sendtargets", "-p", tp, "-I", iface]
        _iscsiadm(runner, *discovery, "-o", "new")
        if source.chap_auth_discovery and (why := _chap(
                runner, discovery, _CHAP_DISCOVERY, "discovery.sendtargets.auth.authmethod",
                secret)):
            last = f"iscsi: failed to update discoverydb to portal {tp} error: {why}"
            continue
        ok, out, err = _iscsiadm(runner, *discovery, "--discover")
        if not ok:
            _iscsiadm(runner, *discovery, "-o", "delete")
            last = f"iscsi: failed to sendtargets to portal {tp} output: {out}, err {err}"
            continue
        node = ["-m", "node", "-p", tp, "-T", source.iqn, "-I", iface]
        if source.chap_auth_session and (why := _chap(
                runner, node, _CHAP_SESSION, "node.session.auth.authmethod", secret)):
            last = f"iscsi: failed to update iscsi node to portal {tp} error: {why}"
            continue
        ok, out, err = _iscsiadm(runner, *node, "--login")
        if not ok:
            _iscsiadm(runner, *node, "-o", "delete")
            last = f"iscsi: failed to attach disk: Error: {out} ({err})"
            continue
        if not devices.wait_for(path, 10):
            last = "Could not attach disk: Timeout after 10s"
            continue
        paths.append(path)
    if not paths:
        raise RunnerError(f"failed to get any path for iscsi disk, last err seen:\n{last}")
    device = paths[0]
    if "*" in device:
        device = devices.glob(device)[0]
    return _multipath(devices, devices.realpath(device)), IscsiDisk(portals, source.iqn,
                                                                   source.lun, iface)


def iscsi_logout(runner: Runner, disk: IscsiDisk) -> None:
    for tp in disk.portals:
        for args in (("--logout",), ("-o", "delete")):
            _iscsiadm(runner, "-m", "node", "-p", tp, "-T", disk.iqn, *args, "-I", disk.iface)


def _multipath(devices: Devices, disk: str) -> str:
    """The ``dm-N`` holding ``disk``, else ``disk`` (``FindMultipathDeviceForDevice``)."""
    name = os.path.basename(disk)
    for entry in devices.listdir("/sys/block"):
        if entry.startswith("dm-") and devices.exists(f"/sys/block/{entry}/slaves/{name}"):
            return f"/dev/{entry}"
    return disk


def _fc_find(devices: Devices, source: FCVolume) -> str:
    if source.wwids:
        for wwid in source.wwids:
            name = "scsi-" + wwid.replace(" ", "_")
            if name in devices.listdir("/dev/disk/by-id"):
                return devices.realpath(f"/dev/disk/by-id/{name}")
        return ""
    for wwn in source.target_wwns:
        mark = f"-fc-0x{wwn}-lun-{source.lun}"
        for name in devices.listdir("/dev/disk/by-path"):
            if mark in name:
                return devices.realpath(f"/dev/disk/by-path/{name}")
    return ""


def fc_setup(devices: Devices, source: FCVolume) -> str:
    """The fc disk's device (``searchDisk``); raises RunnerError("no fc disk found")."""
    disk = _fc_find(devices, source)
    if not disk:
        devices.rescan_scsi_hosts()
        disk = _fc_find(devices, source)
    if not disk:
        raise RunnerError("no fc disk found")
    return _multipath(devices, disk)
