"""A pod's volumes on the node, set up before its sandbox (the kubelet's volume manager, for
the volume types podvisor supports).

downwardAPI: the files of its items (``downward.volume_files``) written atomically under
``<rootDir>/pods/<uid>/volumes/kubernetes.io~downward-api/<name>`` (``atomic_writer``: a
timestamped folder and a ``..data`` link swapped by rename), folder mode 0777.

emptyDir: a directory under ``<rootDir>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>``,
mode 0777 (the kubelet's). hostPath: the kubelet's type check (pkg/volume/hostpath), before any
container may see the path: ``DirectoryOrCreate`` makes a missing directory (0755, parents
too), ``FileOrCreate`` a missing empty file (0644; its directory must exist), and ``Directory``,
``File``, ``Socket``, ``CharDevice``, ``BlockDevice`` need that kind of object at the path;
no type means no check. With the pod's ``fsGroup``, emptyDirs get the kubelet's
``SetVolumeOwnership``: every file and directory in them group-owned by fsGroup, ``rw`` for the
group (directories also ``x`` and setgid, so new files inherit the group); with
``fsGroupChangePolicy: OnRootMismatch`` only when the volume's root is not already so. hostPath
volumes are never changed (as in the kubelet). A failure names the volume, as the kubelet's
FailedMount event does:
``MountVolume.SetUp failed for volume "data" : hostPath type check failed: /srv is not a
directory``.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from podvisor.services.pod import (
    ApiVolume,
    DownwardAPIVolume,
    EmptyDirVolume,
    FSGroupChangePolicy,
    HostPathType,
    HostPathVolume,
    NodeFacts,
    Pod,
    volume_files,
)
from podvisor.services.syncloop import cri_config
from podvisor.services.syncloop.apiobjects import ApiObjects
from podvisor.services.syncloop.apiobjects import volume_files as api_volume_files
from podvisor.services.syncloop.atomic_writer import write_atomic

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


_RW, _EXEC = 0o660, 0o110


def _wanted(mode: int, is_dir: bool) -> int:
    return mode | _RW | ((_EXEC | stat.S_ISGID) if is_dir else 0)


def set_volume_ownership(root: Path, fs_group: int, on_root_mismatch: bool) -> None:
    """The kubelet's ``SetVolumeOwnership`` (pkg/volume/volume_linux.go) for a writable volume:
    lchown to group ``fs_group``, mode |= 0660 (directories |= 0770 and setgid; symlinks
    untouched). ``on_root_mismatch``: skip when the root already has the group and mode."""
    st = os.lstat(root)
    if on_root_mismatch and st.st_gid == fs_group and (
            st.st_mode & 0o7777 == _wanted(st.st_mode & 0o7777, True)):
        return
    def change(path: str) -> None:
        info = os.lstat(path)
        os.lchown(path, -1, fs_group)
        if not stat.S_ISLNK(info.st_mode):
            os.chmod(path, _wanted(info.st_mode & 0o7777, stat.S_ISDIR(info.st_mode)))

    def fail(err: OSError) -> None:
        raise err

    for base, dirs, files in os.walk(root, onerror=fail):  # symlinks are not followed
        change(base)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            change(os.path.join(base, name))


def refresh_api_volumes(pod: Pod, pods_dir: Path, node: NodeFacts, now: float,
                        objects: ApiObjects) -> dict[str, str]:
    """Rewrite the pod's configMap/secret/projected volumes from their API objects (an
    unchanged volume is left alone; a changed one swaps its ``..data`` link); name -> error."""
    errors: dict[str, str] = {}
    for v in pod.spec.volumes:
        if isinstance(v.source, ApiVolume):
            why = _write_api_volume(pod, v.name, v.source, pods_dir, node, now, objects)
            if why:
                errors[v.name] = why
    return errors


def _write_api_volume(pod: Pod, name: str, source: ApiVolume, pods_dir: Path, node: NodeFacts,
                      now: float, objects: ApiObjects | None) -> str:
    target = cri_config.api_volume_path(pods_dir, pod.uid, source.kind, name)
    if objects is None:
        return "this pod may not reference API objects"
    try:
        files = api_volume_files(pod, source, objects, node)
        target.mkdir(parents=True, exist_ok=True)
        os.chmod(target, 0o777 if source.kind == "projected" else 0o755)
        write_atomic(target, files, now)
    except (OSError, ValueError) as err:
        return str(err)
    return ""


def release_empty_dirs(pod: Pod, pods_dir: Path) -> None:
    """A pod failed for good, its containers all stopped: its emptyDir volumes' contents go,
    as the kubelet's volume manager tears down a terminal pod's volumes (an evicted pod's
    space is freed; issue 27). Cheap once done (the folders are gone)."""
    for v in pod.spec.volumes:
        if isinstance(v.source, EmptyDirVolume):
            path = cri_config.empty_dir_path(pods_dir, pod.uid, v.name)
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)


def setup_volumes(pod: Pod, pods_dir: Path, node: NodeFacts | None = None,
                  now: float = 0.0, objects: ApiObjects | None = None) -> dict[str, str]:
    """Make the pod's emptyDirs, check its hostPaths and write its downwardAPI volumes
    (``atomic_writer``; ``node`` gives the defaults of unset limits, ``now`` the wall clock
    that names the data folder); volume name -> error (empty: all set up)."""
    errors: dict[str, str] = {}
    for v in pod.spec.volumes:
        if isinstance(v.source, ApiVolume):
            failure = _write_api_volume(pod, v.name, v.source, pods_dir,
                                        node or NodeFacts(0, 0), now, objects)
            if failure:
                errors[v.name] = failure
            continue
        if isinstance(v.source, DownwardAPIVolume):
            target = cri_config.downward_api_path(pods_dir, pod.uid, v.name)
            try:
                files = volume_files(pod, v.source.items, v.source.default_mode,
                                     node or NodeFacts(0, 0))
                target.mkdir(parents=True, exist_ok=True)
                os.chmod(target, 0o777)
                write_atomic(target, files, now)
            except (OSError, ValueError) as err:
                errors[v.name] = f"writing {target}: {err}"
            continue
        if isinstance(v.source, EmptyDirVolume):
            path = cri_config.empty_dir_path(pods_dir, pod.uid, v.name)
            try:
                path.mkdir(parents=True, exist_ok=True)
                os.chmod(path, 0o777)
            except OSError as err:
                errors[v.name] = f"creating {path}: {err.strerror}"
                continue
            psc = pod.spec.security_context
            if psc is not None and psc.fs_group is not None:
                try:
                    set_volume_ownership(path, psc.fs_group, psc.fs_group_change_policy
                                         is FSGroupChangePolicy.ON_ROOT_MISMATCH)
                except OSError as err:
                    errors[v.name] = (f"applying fsGroup {psc.fs_group} to {err.filename}: "
                                      f"{err.strerror}")
        elif isinstance(v.source, HostPathVolume):
            why = check_host_path(v.source)
            if why is not None:
                errors[v.name] = why
    return errors
