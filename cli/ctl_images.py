"""`podvisorctl images`: the node's images, through CRI on the agent's runtime (the embedded
runtime's socket while the agent runs, else `runtimeEndpoint` from `run/config.json`).

    images [--json]                 IMAGE  TAG  IMAGE ID  SIZE (crictl images)
    images pull REF [--creds U:P]   per-layer progress on a terminal (embedded runtime)
    images rm REF...
    images load FILE                an OCI archive or a docker-archive, into the embedded
                                    runtime's store (air-gapped nodes; the runtime need not run)

Exit codes: 0 success; 1 the runtime refused (its reason on stderr); 2 no runtime to talk to.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from pathlib import Path
from typing import Any

from podvisor.cli.ctl_stoppods import _serving
from podvisor.common.config import run_config
from podvisor.ipc.paths import RunPaths

__all__ = ["format_images", "human_size", "main_images"]


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.3g}{unit}"
        size /= 1000
    return f"{n}B"


def _split(tag: str) -> tuple[str, str]:
    slash = tag.rfind("/")
    colon = tag.rfind(":")
    return (tag[:colon], tag[colon + 1:]) if colon > slash else (tag, "<none>")


def format_images(images: list[dict[str, Any]]) -> str:
    rows = [("IMAGE", "TAG", "IMAGE ID", "SIZE")]
    for img in images:
        short = img["id"].removeprefix("sha256:")[:13]
        for tag in img["repoTags"] or ["<none>:<none>"]:
            repo, t = _split(tag)
            rows.append((repo, t, short, human_size(img["size"])))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True))
                     + "  " + r[3] for r in rows)


def _endpoint(root: str) -> tuple[str, Path | None]:
    """(CRI endpoint, the embedded runtime's progress folder or None)."""
    paths = RunPaths(Path(root))
    config = run_config(paths.config_json)
    endpoint = config.runtime_endpoint if config is not None else "embedded"
    if endpoint != "embedded":
        return endpoint, None
    if not _serving(paths):
        raise RuntimeError(f"the embedded runtime is not running under {root} (start the "
                           "agent: podvisor run)")
    return f"unix://{paths.cri_socket}", paths.runtime_dir / "images" / "progress"


def _image_json(img: Any) -> dict[str, Any]:
    return {"id": img.id, "repoTags": list(img.repo_tags), "repoDigests": list(img.repo_digests),
            "size": int(img.size), "pinned": bool(img.pinned)}


class _Progress:
    """Redraws one line per layer (docker pull's display) from the runtime's progress file."""

    def __init__(self, folder: Path, ref: str) -> None:
        self.path = folder / (hashlib.sha256(ref.encode()).hexdigest()[:24] + ".json")
        self.drawn = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            self.draw()

    def draw(self) -> None:
        try:
            layers = json.loads(self.path.read_text())["layers"]
        except (OSError, ValueError, KeyError):
            return
        lines = []
        for digest, st in layers.items():
            short = digest.removeprefix("sha256:")[:12]
            phase = {"downloading": "Downloading", "extracting": "Extracting",
                     "complete": "Pull complete", "exists": "Already exists"}.get(
                st["phase"], st["phase"])
            amount = (f" {human_size(st['done'])}/{human_size(st['total'])}"
                      if st["phase"] == "downloading" else "")
            lines.append(f"{short}: {phase}{amount}")
        out = ("\x1b[F" * self.drawn) + "".join(f"\x1b[2K{line}\n" for line in lines)
        sys.stdout.write(out)
        sys.stdout.flush()
        self.drawn = len(lines)


def main_images(root: str, action: str | None, refs: list[str], as_json: bool,
                creds: str | None, timeout: float | None) -> int:
    from cri_api.v1 import api_pb2 as pb

    from podvisor.services.cri import CriError, new_runtime_client

    if action == "load":
        return _load(root, refs[0])
    try:
        endpoint, progress_dir = _endpoint(root)
    except RuntimeError as exc:
        print(f"podvisorctl: {exc}", file=sys.stderr)
        return 2
    cri = new_runtime_client(endpoint, timeout=timeout or 10.0,
                             pull_timeout=timeout or 600.0)
    try:
        if action is None:
            images = [_image_json(i) for i in cri.list_images()]
            print(json.dumps(images, indent=2, sort_keys=True) if as_json
                  else format_images(images))
            return 0
        if action == "pull":
            auth = None
            if creds:
                user, _, password = creds.partition(":")
                auth = pb.AuthConfig(username=user, password=password)
            show = progress_dir is not None and sys.stdout.isatty() and not as_json
            bar = _Progress(progress_dir, refs[0]) if show and progress_dir else None
            if bar is not None:
                bar.thread.start()
            try:
                image_id = cri.pull_image(refs[0], auth=auth)
            finally:
                if bar is not None:
                    bar.stop.set()
                    bar.thread.join()
            print(json.dumps({"image": refs[0], "id": image_id}) if as_json
                  else f"{refs[0]}: pulled {image_id}")
            return 0
        for ref in refs:  # rm
            if cri.image_status(ref) is None:
                print(f"podvisorctl: no such image: {ref}", file=sys.stderr)
                return 1
            cri.remove_image(ref)
            print(f"Deleted: {ref}")
        return 0
    except CriError as exc:
        print(f"podvisorctl: {exc.message}", file=sys.stderr)
        return 1
    finally:
        cri.close()


def _load(root: str, archive: str) -> int:
    """Straight into the embedded runtime's store (CRI has no import call); the runtime reads
    the new record at its next lookup."""
    from podvisor.services.runtime import ImageError, ImageStore

    paths = RunPaths(Path(root))
    config = run_config(paths.config_json)
    if config is not None and config.runtime_endpoint != "embedded":
        print(f"podvisorctl: images load imports into the embedded runtime only; this agent "
              f"uses {config.runtime_endpoint}", file=sys.stderr)
        return 2
    try:
        store = ImageStore(paths.runtime_dir / "images", sweep=False)
        names = store.load_archive(Path(archive))
    except (ImageError, OSError, ValueError, KeyError, TypeError) as exc:
        print(f"podvisorctl: images load {archive}: {exc}", file=sys.stderr)
        return 1
    for name in names:
        print(f"Loaded image: {name}")
    return 0
