"""Image benchmark (not a test): the embedded runtime vs containerd, same run, same registry.

  - pull + unpack: PullImage of the busybox image (built offline, pushed with skopeo to a
    Debian docker-registry on 127.0.0.1), RemoveImage between runs, p50/p99 over N;
  - to running (image container): RunPodSandbox -> CreateContainer -> StartContainer of a
    container of that image (not `host`: overlay + pivot_root on the embedded runtime),
    p50/p99 over N; target embedded <= 0.25 x containerd;
  - GC pass over 200 images: one image GC pass (ListContainers, ListImages, plan, RemoveImage
    of the planned ones) over 200 images and 200 containers, the CRI being the in-process fake
    (the planner's own cost), wall time and CPU time.
containerd is measured when tests/support/containerd.py can provide one; otherwise its column
says why not. containerd keeps a removed image's layers in its content store until its own GC
runs, so its repeated pulls may download less than the embedded runtime's.

    .venv/bin/python bench/images.py [-n 10] [--no-containerd]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from cri_api.v1 import api_pb2 as pb  # noqa: E402

from podvisor.services.cri import RuntimeClient  # noqa: E402
from podvisor.services.cri.fake import FakeRuntimeClient  # noqa: E402
from podvisor.services.imagegc import ImageTracker, Usage, image_gc_pass  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def pulls(client: RuntimeClient, ref: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        client.remove_image(ref)
        start = time.perf_counter()
        client.pull_image(ref)
        out.append(time.perf_counter() - start)
    return out


def gc_pass(images: int = 200) -> tuple[float, float]:
    cri = FakeRuntimeClient()
    for i in range(images):
        cri.images[f"sha256:{i:064x}"] = pb.Image(id=f"sha256:{i:064x}",
                                                  repo_tags=[f"r/img{i}:1"], size=1 << 20)
    sid = cri.run_pod_sandbox(pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(
        name="p", namespace="b", uid="u")))
    for i in range(0, images, 2):  # half the images in use
        cri.create_container(sid, pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=f"c{i}"),
            image=pb.ImageSpec(image=f"r/img{i}:1")), pb.PodSandboxConfig())
    capacity = 200 << 20
    tracker = ImageTracker()

    class Quiet:
        def info(self, event: str, **fields: Any) -> None:
            pass

        def warning(self, event: str, **fields: Any) -> None:
            pass

    wall, cpu = time.perf_counter(), time.process_time()
    image_gc_pass(cri, tracker, {}, lambda: Usage(capacity, capacity), 85, 50, 0.0, 1.0,
                  Quiet())
    return time.perf_counter() - wall, time.process_time() - cpu


def row(label: str, emb: list[float] | None, ctr: list[float] | str | None) -> None:
    def cell(v: list[float] | str | None) -> str:
        if v is None or isinstance(v, str):
            return (v or "-")[:40]
        return f"{pct(v, 0.5) * 1000:8.1f} / {pct(v, 0.99) * 1000:8.1f} ms"
    ratio = ""
    if isinstance(emb, list) and isinstance(ctr, list):
        ratio = f"{pct(emb, 0.5) / pct(ctr, 0.5):.2f} x"
    print(f"{label:<26} {cell(emb):^24}   {cell(ctr):^40}   {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description="image pulls, image containers, image GC")
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("--no-containerd", action="store_true")
    args = parser.parse_args()
    import runtime as rtb  # bench/runtime.py: its targets and embedded runtime starter

    from tests.support.registry import registries  # type: ignore[import-not-found]

    base = Path(tempfile.mkdtemp(prefix="pvbimg", dir="/tmp"))
    with registries(base / "reg") as (anon, _):
        ref = f"{anon.host}/podvisor/busybox:1"
        proc, client = rtb.start_embedded(base)
        results: dict[str, dict[str, Any]] = {"embedded": {}, "containerd": {}}
        try:
            emb = rtb.Target("embedded", client, ref)
            client.pull_image(ref)
            results["embedded"]["pull"] = pulls(client, ref, args.n)
            results["embedded"]["run"] = rtb.to_running(emb, args.n)
            ctr = "skipped (--no-containerd)" if args.no_containerd else rtb.containerd_target()
            if isinstance(ctr, str):
                results["containerd"] = {"pull": ctr, "run": ctr}
            else:
                ctr.image = ref
                ctr.client.pull_image(ref)
                results["containerd"]["pull"] = pulls(ctr.client, ref, args.n)
                results["containerd"]["run"] = rtb.to_running(ctr, args.n)
                ctr.client.remove_image(ref)
        finally:
            emb.clean()
            client.close()
            proc.terminate()
            proc.wait(10)
    wall, cpu = gc_pass()
    print(f"\n{'':<26} {'embedded p50 / p99':^24}   {'containerd p50 / p99':^40}   ratio p50")
    row("pull + unpack", results["embedded"]["pull"], results["containerd"]["pull"])
    row("to running (image)", results["embedded"]["run"], results["containerd"]["run"])
    print("  target: to running embedded <= 0.25 x containerd")
    print(f"GC pass over 200 images: {wall * 1000:.1f} ms wall, {cpu * 1000:.1f} ms CPU "
          "(fake CRI: the planner's own cost)")


if __name__ == "__main__":
    main()
