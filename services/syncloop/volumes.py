"""A pod's volumes on the node, set up before its sandbox (the kubelet's volume manager, for
the two volume types podvisor supports).

emptyDir: a directory under ``<rootDir>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>``,
mode 0777 (the kubelet's). hostPath: the kubelet's type check (pkg/volume/hostpath), before any
container may see the path: ``DirectoryOrCreate`` makes a missing directory (0755, parents
too), ``FileOrCreate`` a missing empty file (0644; its directory must exist), and ``Directory``,
``File``, ``Socket``, ``CharDevice``, ``BlockDevice`` need that kind of object at the path;
no type means no check. A failure names the volume, as the kubelet's FailedMount event does:
``MountVolume.SetUp failed for volume "data" : hostPath type check failed: /srv is not a
directory``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from podvisor.services.pod import EmptyDirVolume, HostPathType, HostPathVolume, Pod
from podvisor.services.syncloop import cri_config

_KINDS = {
    HostPathType.DIRECTORY: (stat.S_ISDIR, "a directory"),
    HostPathType.FILE: (stat.S_ISREG, "a file"),
    HostPathType.SOCKET: (stat.S_ISSOCK, "a socket file"),
    HostPathType.CHAR_DEVICE: (stat.S_ISCHR, "a character device"),
    HostPathType.BLOCK_DEVICE: (stat.S_ISBLK, "a block device"),
}
_OR_CREATE = {HostPathType.DIRECTORY_OR_CREATE: HostPathType.DIRECTORY,
              HostPathType.FILE_OR_CREATE: HostPathType.FILE}


def check_host_path(source: HostPathVolume) -> str | None:
    """The kubelet's hostPath type check (creating what an ``...OrCreate`` type asks for);
    None when it passes, else why not."""
    path, kind = source.path, source.type
    if kind is HostPathType.UNSET:
        return None
    try:
        if kind in _OR_CREATE and not os.path.lexists(path):
            if kind is HostPathType.DIRECTORY_OR_CREATE:
                os.makedirs(path, 0o755, exist_ok=True)
            else:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
            return None
        mode = os.stat(path).st_mode
    except OSError as err:
        if kind in _OR_CREATE:
            return f"hostPath type check failed: creating {path}: {err.strerror}"
        mode = 0  # missing: "is not a ..." as the kubelet says
    test, what = _KINDS[_OR_CREATE.get(kind, kind)]
    return None if test(mode) else f"hostPath type check failed: {path} is not {what}"


def setup_volumes(pod: Pod, pods_dir: Path) -> dict[str, str]:
    """Make the pod's emptyDirs and check its hostPaths; volume name -> error (empty: all
    set up)."""
    errors: dict[str, str] = {}
    for v in pod.spec.volumes:
        if isinstance(v.source, EmptyDirVolume):
            path = cri_config.empty_dir_path(pods_dir, pod.uid, v.name)
            try:
                path.mkdir(parents=True, exist_ok=True)
                os.chmod(path, 0o777)
            except OSError as err:
                errors[v.name] = f"creating {path}: {err.strerror}"
        elif isinstance(v.source, HostPathVolume):
            why = check_host_path(v.source)
            if why is not None:
                errors[v.name] = why
    return errors
