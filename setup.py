"""Build step: the CSI and plugin-registration gRPC stubs, generated from their .proto files.

``services/volumes/proto/csi.proto`` is the CSI spec's (v1.12.0, container-storage-interface/
spec), ``pluginregistration.proto`` the kubelet's plugin-registration API; no maintained PyPI
package ships Python stubs for either (README, "Dependencies"). Every build (``pip install .``,
``pip install -e .``, so ``make venv``) runs grpcio-tools' protoc (a build requirement in
pyproject.toml) into ``services/volumes/stubs/`` (not committed): ``*_pb2.py`` + ``.pyi`` and
``*_pb2_grpc.py``, imported as ``podvisor.services.volumes.stubs.<name>_pb2``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROTOS = HERE / "services" / "volumes" / "proto"
STUBS = HERE / "services" / "volumes" / "stubs"
PACKAGE = ("podvisor", "services", "volumes", "stubs")


def generate_stubs() -> None:
    from grpc_tools import protoc  # the build requirement

    include = str(Path(protoc.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "src", *PACKAGE)
        out = Path(tmp, "out")
        src.mkdir(parents=True)
        out.mkdir()
        protos = sorted(PROTOS.glob("*.proto"))
        for proto in protos:
            shutil.copy(proto, src / proto.name)
        for proto in protos:
            rel = "/".join((*PACKAGE, proto.name))
            code = protoc.main(["grpc_tools.protoc", f"-I{tmp}/src", f"-I{include}",
                                f"--python_out={out}", f"--pyi_out={out}",
                                f"--grpc_python_out={out}", rel])
            if code != 0:
                raise RuntimeError(f"protoc failed on {proto}")
        STUBS.mkdir(exist_ok=True)
        for made in Path(out, *PACKAGE).iterdir():
            shutil.copy(made, STUBS / made.name)


class BuildPy(build_py):
    def run(self) -> None:
        generate_stubs()
        super().run()


if __name__ == "__main__":  # also under setuptools' build backend, which runs it as __main__
    setup(cmdclass={"build_py": BuildPy})
