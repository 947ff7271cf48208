"""The embedded runtime's content-addressed image store, under ``<runtime root>/images``:

    blobs/sha256/<hex>        manifests, configs and compressed layers, named by digest
    layers/<hex>/             a layer unpacked once (hex of its diff id), shared by every image
                              and container using it; whiteouts in overlayfs form
    layers/<hex>.size         its unpacked bytes
    images/<hex>.json         one record per image (hex of its config digest: the image id)

Each file lands by rename, so a kill -9 mid-pull leaves only ``tmp/`` to sweep. Concurrent pulls
of one reference share one download; concurrent pulls of different images sharing a layer
share that layer's download and unpack."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import stat
import tarfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from podvisor.services.runtime import registry as reg

LAYER_GZIP = ("application/vnd.oci.image.layer.v1.tar+gzip",
              "application/vnd.docker.image.rootfs.diff.tar.gzip",
              "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
              "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip")
LAYER_ZSTD = ("application/vnd.oci.image.layer.v1.tar+zstd",)
LAYER_TAR = ("application/vnd.oci.image.layer.v1.tar",)

Progress = Callable[[str, str, int, int], None]  # (layer digest, phase, done, total)


class ImageError(Exception):
    pass


@dataclass
class ImageRecord:
    id: str  # config digest
    repo_tags: list[str]
    repo_digests: list[str]
    layers: list[str]  # diff ids, bottom first
    size: int  # compressed bytes of config + layers (what `docker images` calls size)
    config: dict[str, Any]  # the image config's "config" (Env, Entrypoint, Cmd, User, ...)
    pulled_at: int  # ns
    manifest: str = ""  # manifest digest
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "repo_tags": self.repo_tags, "repo_digests": self.repo_digests,
                "layers": self.layers, "size": self.size, "config": self.config,
                "pulled_at": self.pulled_at, "manifest": self.manifest}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ImageRecord:
        return cls(str(d["id"]), list(d.get("repo_tags") or []),
                   list(d.get("repo_digests") or []), list(d["layers"]), int(d.get("size", 0)),
                   dict(d.get("config") or {}), int(d.get("pulled_at", 0)),
                   str(d.get("manifest", "")))


class ImageStore:
    def __init__(self, root: Path, settings: reg.RegistrySettings | None = None,
                 wall: Callable[[], int] = time.time_ns, sweep: bool = True) -> None:
        """``sweep``: clear ``tmp/`` (the runtime at start; not ``podvisorctl images load``,
        which writes into the store of a running runtime)."""
        self.root = root
        self.settings = settings or reg.RegistrySettings()
        self.wall = wall
        self._lock = threading.Lock()
        self._images: dict[str, ImageRecord] = {}
        self._pulls: dict[str, Future[ImageRecord]] = {}  # by reference string
        self._layer_jobs: dict[str, Future[None]] = {}  # by diff id
        for sub in ("blobs/sha256", "layers", "images", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        if sweep:
            shutil.rmtree(root / "tmp", ignore_errors=True)  # what a killed pull left
            (root / "tmp").mkdir(exist_ok=True)
        self._seen = -1
        with self._lock:
            self._reload_locked()

    def _reload_locked(self) -> None:
        """Read the records again when ``images/`` changed (another process loaded one)."""
        try:
            mtime = (self.root / "images").stat().st_mtime_ns
        except OSError:
            return
        if mtime == self._seen:
            return
        self._seen = mtime
        loaded: dict[str, ImageRecord] = {}
        for p in (self.root / "images").glob("*.json"):
            try:
                rec = ImageRecord.from_json(json.loads(p.read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            loaded[rec.id] = rec
        self._images = loaded

    # --- lookups ---
    def images(self) -> list[ImageRecord]:
        with self._lock:
            self._reload_locked()
            return list(self._images.values())

    def resolve(self, ref: str) -> ImageRecord | None:
        """By id (full or ``sha256:`` prefix of 12+), by tag, or by repo digest."""
        with self._lock:
            return self._resolve_locked(ref)

    def _resolve_locked(self, ref: str) -> ImageRecord | None:
        self._reload_locked()
        if ref in self._images:
            return self._images[ref]
        bare = ref.removeprefix("sha256:")
        if len(bare) >= 12 and all(c in "0123456789abcdef" for c in bare):
            hits = [r for i, r in self._images.items() if i[7:].startswith(bare)]
            if len(hits) == 1:
                return hits[0]
        try:
            parsed = reg.parse_reference(ref)
        except reg.InvalidReference:
            return None
        for r in self._images.values():
            if parsed.digest and f"{parsed.name}@{parsed.digest}" in r.repo_digests:
                return r
            if not parsed.digest and str(parsed) in r.repo_tags:
                return r
        return None

    def layer_dir(self, diff_id: str) -> Path:
        return self.root / "layers" / diff_id.removeprefix("sha256:")

    # --- pulls ---
    def pull(self, ref: str, creds: reg.Credentials | None = None,
             progress: Progress | None = None) -> ImageRecord:
        parsed = reg.parse_reference(ref)
        key = str(parsed)
        with self._lock:
            fut = self._pulls.get(key)
            owner = fut is None
            if fut is None:
                fut = Future()
                self._pulls[key] = fut
        if not owner:
            return fut.result()
        try:
            rec = self._pull(parsed, creds, progress)
        except BaseException as exc:
            fut.set_exception(exc)
            with self._lock:
                self._pulls.pop(key, None)
            raise
        fut.set_result(rec)
        with self._lock:
            self._pulls.pop(key, None)
        return rec

    def _pull(self, ref: reg.Reference, creds: reg.Credentials | None,
              progress: Progress | None) -> ImageRecord:
        client = reg.Client(ref, self.settings, creds)
        try:
            mdigest, manifest, repo_digest = client.resolve()
            cdesc = manifest["config"]
            config_bytes = self._fetch_blob(client, str(cdesc["digest"]), None)
            layer_descs = [d for d in manifest["layers"] if isinstance(d, dict)]
            config = json.loads(config_bytes)
            diff_ids = _diff_ids(config)
            if len(diff_ids) != len(layer_descs):
                raise ImageError(f"{ref}: the config names {len(diff_ids)} layers, the "
                                 f"manifest {len(layer_descs)}")
            for desc, diff_id in zip(layer_descs, diff_ids, strict=True):
                self._ensure_layer(client, desc, diff_id, progress)
            size = len(config_bytes) + sum(int(d.get("size", 0)) for d in layer_descs)
            return self._record(str(cdesc["digest"]), config, diff_ids, size, mdigest,
                                ref.tagged(), f"{ref.name}@{repo_digest}")
        finally:
            client.close()

    def _record(self, image_id: str, config: dict[str, Any], diff_ids: list[str], size: int,
                manifest: str, tag: str | None, repo_digest: str | None) -> ImageRecord:
        with self._lock:
            rec = self._images.get(image_id)
            if rec is None:
                rec = ImageRecord(image_id, [], [], diff_ids, size,
                                  dict(config.get("config") or {}), self.wall(), manifest)
            # A tag names one image: move it off any other one.
            for other in self._images.values():
                if tag and other.id != image_id and tag in other.repo_tags:
                    other.repo_tags.remove(tag)
                    self._save(other)
            if tag and tag not in rec.repo_tags:
                rec.repo_tags.append(tag)
            if repo_digest and repo_digest not in rec.repo_digests:
                rec.repo_digests.append(repo_digest)
            self._images[image_id] = rec
            self._save(rec)
            with contextlib.suppress(OSError):
                self._seen = (self.root / "images").stat().st_mtime_ns
            return rec

    def _save(self, rec: ImageRecord) -> None:
        path = self.root / "images" / (rec.id.removeprefix("sha256:") + ".json")
        tmp = self.root / "tmp" / (path.name + f".{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(rec.to_json()))
        os.replace(tmp, path)

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest.removeprefix("sha256:")

    def _fetch_blob(self, client: reg.Client, digest: str,
                    progress: Callable[[int], None] | None) -> bytes:
        path = self.blob_path(digest)
        if not path.exists():
            tmp = self._tmp()
            client.blob(digest, tmp, progress)
            os.replace(tmp, path)
        return path.read_bytes()

    def _tmp(self) -> Path:
        return self.root / "tmp" / f"{os.getpid()}.{threading.get_ident()}.{time.monotonic_ns()}"

    def _ensure_layer(self, client: reg.Client | None, desc: dict[str, Any], diff_id: str,
                      progress: Progress | None, source: Path | None = None) -> None:
        """Download (unless ``source`` holds the blob) and unpack one layer, once."""
        dest = self.layer_dir(diff_id)
        digest = str(desc.get("digest", ""))
        total = int(desc.get("size", 0))
        with self._lock:
            if dest.is_dir():
                if progress:
                    progress(digest, "exists", total, total)
                return
            fut = self._layer_jobs.get(diff_id)
            owner = fut is None
            if fut is None:
                fut = Future()
                self._layer_jobs[diff_id] = fut
        if not owner:
            fut.result()
            if progress:
                progress(digest, "exists", total, total)
            return
        try:
            blob = source or self.blob_path(digest)
            if source is None and not blob.exists():
                assert client is not None
                done = [0]

                def step(n: int) -> None:
                    done[0] += n
                    if progress:
                        progress(digest, "downloading", done[0], total)

                tmp = self._tmp()
                client.blob(digest, tmp, step)
                os.replace(tmp, blob)
            if progress:
                progress(digest, "extracting", total, total)
            self._unpack(blob, str(desc.get("mediaType", "")), diff_id, dest)
            if source is None:  # the unpacked layer is what is kept: drop the download
                blob.unlink(missing_ok=True)
            if progress:
                progress(digest, "complete", total, total)
            fut.set_result(None)
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._layer_jobs.pop(diff_id, None)

    def _unpack(self, blob: Path, media: str, diff_id: str, dest: Path) -> None:
        work = self._tmp()
        work.mkdir()
        h = hashlib.sha256()
        with open(blob, "rb") as raw:
            stream: IO[bytes] = _decompressor(raw, media)
            hashing = _HashingReader(stream, h)
            with tarfile.open(fileobj=hashing, mode="r|") as tar:  # type: ignore[call-overload]
                size, inodes = unpack_layer(tar, work)
            while hashing.read(1 << 16):  # the tar's trailing padding counts in the diff id
                pass
        got = "sha256:" + h.hexdigest()
        if got != diff_id:
            shutil.rmtree(work, ignore_errors=True)
            raise ImageError(f"layer {diff_id}: the unpacked content has digest {got}")
        (self.root / "layers" / (dest.name + ".size")).write_text(f"{size} {inodes}")
        try:
            os.replace(work, dest)
        except OSError:
            if not dest.is_dir():
                raise
            shutil.rmtree(work, ignore_errors=True)  # another process unpacked it meanwhile

    # --- archives (podvisorctl images load) ---
    def load_archive(self, archive: Path) -> list[str]:
        """Import an OCI image layout tarball (``index.json``; names from the
        ``io.containerd.image.name`` or ``org.opencontainers.image.ref.name`` annotation) or a
        docker-archive (``manifest.json``: Config, RepoTags, Layers); returns the names (or ids)
        loaded. Every blob is checked against its digest."""
        work = self._tmp()
        work.mkdir()
        try:
            try:
                with tarfile.open(archive) as tar:
                    tar.extractall(work, filter="data")
            except tarfile.TarError as exc:
                raise ImageError(f"{archive}: not a tar archive ({exc})") from None
            if (work / "index.json").exists():
                return self._load_oci(work)
            if (work / "manifest.json").exists():
                return self._load_docker(work)
            raise ImageError(f"{archive}: neither an OCI archive (index.json) nor a "
                             "docker-archive (manifest.json)")
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _oci_blob(self, layout: Path, digest: str) -> Path:
        path = layout / "blobs" / "sha256" / digest.removeprefix("sha256:")
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        if "sha256:" + h.hexdigest() != digest:
            raise ImageError(f"blob {digest}: the archive holds content with another digest")
        return path

    def _load_oci(self, layout: Path) -> list[str]:
        index = json.loads((layout / "index.json").read_text())
        names: list[str] = []
        for entry in index.get("manifests") or []:
            ann = entry.get("annotations") or {}
            desc = entry
            doc = json.loads(self._oci_blob(layout, desc["digest"]).read_bytes())
            if "manifests" in doc:  # a nested index: this platform's image
                chosen = reg.select_platform(doc["manifests"])
                if chosen is None:
                    continue
                doc = json.loads(self._oci_blob(layout, chosen).read_bytes())
                manifest_digest = chosen
            else:
                manifest_digest = str(desc["digest"])
            name = ann.get("io.containerd.image.name") or ann.get(
                "org.opencontainers.image.ref.name", "")
            config_path = self._oci_blob(layout, doc["config"]["digest"])
            layers = [(d, self._oci_blob(layout, d["digest"])) for d in doc["layers"]]
            names.append(self._import(config_path, layers, manifest_digest, name))
        return names

    def _load_docker(self, root: Path) -> list[str]:
        names: list[str] = []
        for entry in json.loads((root / "manifest.json").read_text()):
            config_path = root / entry["Config"]
            layers = []
            for rel in entry["Layers"]:
                path = root / rel
                layers.append(({"digest": "", "mediaType": "", "size": path.stat().st_size},
                               path))
            tags = entry.get("RepoTags") or [""]
            for i, tag in enumerate(tags):
                name = self._import(config_path, layers if i == 0 else [], "", tag)
                names.append(name)
        return names

    def _import(self, config_path: Path, layers: list[tuple[dict[str, Any], Path]],
                manifest: str, name: str) -> str:
        config_bytes = config_path.read_bytes()
        image_id = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
        config = json.loads(config_bytes)
        diff_ids = _diff_ids(config)
        if layers and len(diff_ids) != len(layers):
            raise ImageError(f"{name or image_id}: the config names {len(diff_ids)} layers, "
                             f"the archive {len(layers)}")
        for (desc, path), diff_id in zip(layers, diff_ids, strict=False):
            self._ensure_layer(None, desc, diff_id, None, source=path)
        missing = [d for d in diff_ids if not self.layer_dir(d).is_dir()]
        if missing:
            raise ImageError(f"{name or image_id}: layers {missing} are missing")
        blob = self.blob_path(image_id)
        if not blob.exists():
            tmp = self._tmp()
            tmp.write_bytes(config_bytes)
            os.replace(tmp, blob)
        tag = None
        if name:
            try:
                tag = str(reg.parse_reference(name))
            except reg.InvalidReference as exc:
                raise ImageError(str(exc)) from None
        size = len(config_bytes) + sum(int(d.get("size", 0)) for d, _ in layers)
        self._record(image_id, config, diff_ids, size, manifest, tag, None)
        return tag or image_id

    # --- removal and space ---
    def remove(self, ref: str, layers_in_use: Iterable[str] = ()) -> ImageRecord | None:
        """Drop the image and every blob and layer no other image (nor a container, by
        ``layers_in_use``) still needs; None when unknown."""
        with self._lock:
            rec = self._resolve_locked(ref)
            if rec is None:
                return None
            del self._images[rec.id]
            with contextlib.suppress(FileNotFoundError):
                (self.root / "images" / (rec.id.removeprefix("sha256:") + ".json")).unlink()
            kept = {d for r in self._images.values() for d in r.layers} | set(layers_in_use)
            doomed = [d for d in rec.layers if d not in kept]
        for d in doomed:
            dest = self.layer_dir(d)
            gone = self._tmp()
            with contextlib.suppress(FileNotFoundError):
                os.replace(dest, gone)  # atomically out of sight, then deleted
            shutil.rmtree(gone, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                (self.root / "layers" / (dest.name + ".size")).unlink()
        self._sweep_blobs()
        return rec

    def _sweep_blobs(self) -> None:
        """Config blobs of no image (layer blobs are dropped once unpacked)."""
        with self._lock:
            keep = {r.id.removeprefix("sha256:") for r in self._images.values()}
            if self._pulls or self._layer_jobs:
                return  # a pull in flight may need a blob that looks orphaned
        for p in (self.root / "blobs" / "sha256").iterdir():
            if p.name not in keep:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()

    def used_bytes(self) -> tuple[int, int]:
        """(bytes, inodes) the store occupies."""
        total, inodes = 0, 0
        for p in (self.root / "layers").glob("*.size"):
            with contextlib.suppress(OSError, ValueError):
                n, i = p.read_text().split() if " " in p.read_text() else (p.read_text(), "0")
                total += int(n)
                inodes += int(i)
        for sub in ("blobs/sha256", "images"):
            for p in (self.root / sub).iterdir():
                with contextlib.suppress(OSError):
                    total += p.stat().st_size
                    inodes += 1
        return total, inodes


class _HashingReader:
    """A read-only stream that hashes what passes through (the layer's diff id)."""

    def __init__(self, inner: IO[bytes], h: Any) -> None:
        self.inner = inner
        self.h = h

    def read(self, n: int = -1) -> bytes:
        data = self.inner.read(n)
        self.h.update(data)
        return data


def _diff_ids(config: Any) -> list[Any]:
    """An OCI image config's ``rootfs.diff_ids`` (empty when it has none)."""
    rootfs = config.get("rootfs") if isinstance(config, dict) else None
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    return list(diff_ids) if isinstance(diff_ids, list) else []


def _decompressor(raw: IO[bytes], media: str) -> IO[bytes]:
    head = raw.read(4)
    raw.seek(0)
    if media in LAYER_ZSTD or head == b"\x28\xb5\x2f\xfd":
        try:
            import zstandard
        except ImportError:
            raise ImageError("zstd layers need the zstandard package, which is not "
                             "installed") from None
        return zstandard.ZstdDecompressor().stream_reader(raw)  # type: ignore[no-any-return]
    if media in LAYER_GZIP or head[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def unpack_layer(tar: tarfile.TarFile, dest: Path) -> tuple[int, int]:
    """Extract one layer into ``dest`` in overlayfs form: ``.wh.NAME`` becomes a 0/0 character
    device NAME, ``.wh..wh..opq`` the ``trusted.overlay.opaque`` xattr on its directory.
    Entries escaping ``dest`` (``..``, through a symlink) are refused. Returns (bytes, entries)."""
    total, entries = 0, 0
    root = str(dest)
    for member in tar:
        name = os.path.normpath(member.name.lstrip("/"))
        if name in (".", "") or name.startswith("../") or name == "..":
            if name in (".", ""):
                continue
            raise ImageError(f"layer entry {member.name!r} escapes the layer")
        parent, base = os.path.split(name)
        _check_parents(root, parent, member.name)
        if base == OPAQUE:
            target = os.path.join(root, parent)
            os.makedirs(target, exist_ok=True)
            os.setxattr(target, "trusted.overlay.opaque", b"y")
            continue
        if base.startswith(WHITEOUT):
            target = os.path.join(root, parent, base[len(WHITEOUT):])
            _clear(target)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.mknod(target, 0o600 | stat.S_IFCHR, os.makedev(0, 0))
            continue
        target = os.path.join(root, name)
        if member.isdir() and os.path.isdir(target) and not os.path.islink(target):
            os.chmod(target, member.mode & 0o7777)
            continue
        _clear(target)
        if member.islnk():
            link = os.path.normpath(member.linkname.lstrip("/"))
            if link.startswith(".."):
                raise ImageError(f"layer hard link {member.name!r} escapes the layer")
            _check_parents(root, os.path.dirname(link), member.linkname)
        member.name = name
        tar.extract(member, root, set_attrs=True, numeric_owner=True,
                    filter="fully_trusted")
        entries += 1
        if member.isfile():
            total += member.size
        _restore_xattrs(member, target)
    return total, entries


def _check_parents(root: str, parent: str, what: str) -> None:
    cur = root
    for part in parent.split("/") if parent else []:
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            raise ImageError(f"layer entry {what!r} goes through the symlink {part!r}")


def _clear(target: str) -> None:
    if os.path.lexists(target):
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        else:
            os.unlink(target)


def _restore_xattrs(member: tarfile.TarInfo, target: str) -> None:
    for key, value in (member.pax_headers or {}).items():
        if key.startswith("SCHILY.xattr."):
            with contextlib.suppress(OSError):
                os.setxattr(target, key[len("SCHILY.xattr."):], value.encode("latin-1"),
                            follow_symlinks=False)
