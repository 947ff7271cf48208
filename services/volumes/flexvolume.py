"""FlexVolume (issue 24): the kubelet's out-of-tree driver protocol (pkg/volume/flexvolume).

Drivers live in ``volumePluginDir`` (default ``/usr/libexec/kubernetes/kubelet-plugins/volume/
exec/``): each folder not starting with ``.`` is one, ``vendor~driver`` for the driver
``vendor/driver``, its executable ``<folder>/<driver>``. The folder is probed every pass (the
kubelet watches it); a new driver, or one whose executable changed, is asked ``init`` once and
keeps the ``capabilities`` it answers (absent ones default as the kubelet's: ``attach`` true,
``fsGroup`` true). A call is ``<exe> <command> <args...>``; it answers JSON on stdout
``{"status": "Success"|"Failure"|"Not supported", "message": ..., "capabilities": {...}}``
(stdout and stderr are read together, as Go's ``CombinedOutput``). A command a driver answered
"Not supported" is remembered and not called again (the kubelet's ``unsupportedCommands``).

Mount (``SetUpAt``) of a non-attachable driver (``attach: false``): the pod's volume folder
``pods/<uid>/volumes/<vendor~driver>/<volume>`` made (0750; already a mount point: done), then
``mount <folder> <json options>``: ``kubernetes.io/fsType``, ``kubernetes.io/readwrite``
(``ro``/``rw``), ``kubernetes.io/pvOrVolumeName``, ``kubernetes.io/pod.{name,namespace,uid}``,
``kubernetes.io/serviceAccount.name``, ``kubernetes.io/mounterArgs.FsGroup`` (with a pod
``fsGroup``), ``kubernetes.io/secret/<key>`` (base64, from ``secretRef``) and the volume's own
``options``. A failure removes the folder. "Not supported": the kubelet's default, a bind of
the device mount path (``plugins/kubernetes.io/flexvolume/<driver>/mounts/<volume>``, which only
an attaching driver makes). Then, not read-only and with the ``fsGroup`` capability, the pod's
fsGroup on the folder. Unmount (``TearDownAt``): a missing folder is done; ``unmount
<folder>`` ("Not supported": umount(2) of the folder); then the folder is removed.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podvisor.services.volumes.hostexec import Runner

__all__ = ["NOT_SUPPORTED", "Capabilities", "FlexDriver", "FlexDrivers", "FlexError",
           "driver_folder", "options_for_driver"]

NOT_SUPPORTED = "Not supported"
CALL_TIMEOUT = 120.0  # below the volumes worker's stall limit (300 s)


class FlexError(Exception):
    """A driver call that did not succeed, with the kubelet's message."""

    def __init__(self, message: str, not_supported: bool = False,
                 uncertain: bool = False) -> None:
        super().__init__(message)
        self.not_supported = not_supported
        self.uncertain = uncertain


def driver_folder(driver: str) -> str:
    """``vendor/driver`` -> ``vendor~driver`` (the kubelet's ``EscapeQualifiedName``)."""
    return driver.replace("/", "~")


@dataclass(frozen=True)
class Capabilities:
    attach: bool = True
    selinux_relabel: bool = True
    supports_metrics: bool = False
    fs_group: bool = True
    requires_fs_resize: bool = True

    @classmethod
    def of(cls, raw: Any) -> Capabilities:
        m = raw if isinstance(raw, Mapping) else {}

        def flag(key: str, default: bool) -> bool:
            value = m.get(key)
            return value if isinstance(value, bool) else default
        return cls(flag("attach", True), flag("selinuxRelabel", True),
                   flag("supportsMetrics", False), flag("fsGroup", True),
                   flag("requiresFSResize", True))


@dataclass
class FlexDriver:
    name: str  # vendor/driver
    folder: str  # vendor~driver
    executable: Path
    capabilities: Capabilities
    unsupported: set[str] = field(default_factory=set)


def _status(command: str, output: str) -> dict[str, Any]:
    """The driver's answer (``handleCmdResponse``): raises FlexError unless Success."""
    try:
        status = json.loads(output)
    except ValueError as err:
        raise FlexError(f"failed to unmarshal output for command: {command}, output: "
                        f"{output!r}, error: {err}") from None
    if not isinstance(status, dict):
        raise FlexError(f"failed to unmarshal output for command: {command}, output: "
                        f"{output!r}, error: not a JSON object")
    state = status.get("status")
    if state == NOT_SUPPORTED:
        raise FlexError(NOT_SUPPORTED, not_supported=True)
    if state != "Success":
        raise FlexError(f"{command} command failed, status: {state}, reason: "
                        f"{status.get('message', '')}")
    return status


class FlexDrivers:
    """The drivers found in ``plugin_dir``. Used from the volumes worker's thread only."""

    def __init__(self, plugin_dir: Path, runner: Runner,
                 log: Callable[..., None] = lambda event, **fields: None) -> None:
        self.plugin_dir = plugin_dir
        self.runner = runner
        self.log = log
        self._drivers: dict[str, FlexDriver] = {}  # by name
        self._seen: dict[str, tuple[float, float]] = {}  # folder -> (dir, exe) mtimes probed

    def probe(self) -> bool:
        """Scan the folder; ``init`` new or changed drivers. True when the set changed."""
        try:
            entries = sorted(e for e in os.listdir(self.plugin_dir) if not e.startswith("."))
        except OSError:
            entries = []
        folders = {e for e in entries if (self.plugin_dir / e).is_dir()}
        changed = False
        for name in [n for n, d in self._drivers.items() if d.folder not in folders]:
            del self._drivers[name]
            self.log("volumes.flexvolume.removed", driver=name)
            changed = True
        self._seen = {f: m for f, m in self._seen.items() if f in folders}
        for folder in sorted(folders):
            exe = self.plugin_dir / folder / folder.rsplit("~", 1)[-1]
            marks = (_mtime(self.plugin_dir / folder), _mtime(exe))
            if self._seen.get(folder) == marks:
                continue
            self._seen[folder] = marks
            changed = self._init(folder, exe) or changed
        return changed

    def _init(self, folder: str, exe: Path) -> bool:
        name = folder.replace("~", "/")
        try:
            status = self._call(exe, "init", ())
        except FlexError as err:
            had = self._drivers.pop(name, None) is not None
            self.log("volumes.flexvolume.init_failed", driver=name, path=str(exe),
                     message=f"error creating Flexvolume plugin from directory {folder}, "
                             f"skipping. Error: {err}")
            return had
        caps = Capabilities.of(status.get("capabilities"))
        self._drivers[name] = FlexDriver(name, folder, exe, caps)
        self.log("volumes.flexvolume.probed", driver=name, path=str(exe),
                 attach=caps.attach, fs_group=caps.fs_group)
        return True

    def folders(self) -> dict[str, str]:
        """folder -> driver name, of the drivers known."""
        return {d.folder: d.name for d in self._drivers.values()}

    def get(self, name: str) -> FlexDriver:
        """Raises LookupError when no probed driver has that name."""
        return self._drivers[name]

    def call(self, driver: FlexDriver, command: str, *args: str) -> dict[str, Any]:
        if command in driver.unsupported:
            raise FlexError(NOT_SUPPORTED, not_supported=True)
        try:
            return self._call(driver.executable, command, args)
        except FlexError as err:
            if err.not_supported:
                driver.unsupported.add(command)
            raise

    def _call(self, exe: Path, command: str, args: tuple[str, ...]) -> dict[str, Any]:
        ran = self.runner.run([str(exe), command, *args], timeout=CALL_TIMEOUT)
        if ran.timed_out:
            raise FlexError("timeout", uncertain=True)
        if not ran.ok:
            _status(command, ran.output)  # raises the driver's own failure
            raise FlexError(ran.error)  # a driver bug: an exec error, yet Success
        return _status(command, ran.output)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return -1.0


def options_for_driver(*, fs_type: str, read_only: bool, spec_name: str,
                       pod: Mapping[str, str], fs_group: int | None,
                       secrets: Mapping[str, bytes], options: Mapping[str, str]) -> str:
    """The JSON options of a ``mount`` call (``NewOptionsForDriver`` with SetUpAt's extra
    options; the volume's own options last, as the kubelet merges them)."""
    out: dict[str, str] = {"kubernetes.io/fsType": fs_type,
                           "kubernetes.io/readwrite": "ro" if read_only else "rw",
                           "kubernetes.io/pvOrVolumeName": spec_name}
    out.update({f"kubernetes.io/{k}": v for k, v in pod.items()})
    for key, data in secrets.items():
        out[f"kubernetes.io/secret/{key}"] = base64.b64encode(data).decode()
    if fs_group is not None:
        out["kubernetes.io/mounterArgs.FsGroup"] = str(fs_group)
    out.update(options)
    return json.dumps(out, sort_keys=True)
