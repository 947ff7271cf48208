"""`podvisorctl shutdown --pods` with no agent, when the embedded runtime of a dead agent still
serves (an agent killed -9: its runtime process lives until its parent-death SIGTERM ends it):
that runtime is used, never doubled by a second one over the same state. The rootDir here has
no `run/config.json` either, so the embedded default applies. The full path (agent, SIGINT, the
printed command) is tests/supervisor/test_e2e_lifecycle_restart.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from podvisor.ipc.paths import RunPaths
from podvisor.services.cri import CriError, new_runtime_client
from podvisor.services.syncloop import labels as L
from tests.conftest import BIN, short_tmp_dir


@pytest.mark.timeout(120)
def test_a_runtime_still_serving_is_used(wait_for: Any) -> None:
    root = short_tmp_dir("pvsp")
    paths = RunPaths(root)
    paths.ensure()
    with (root / "runtime.stderr").open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "podvisor.services.runtime", "--root", str(paths.runtime_dir),
             "--socket", str(paths.cri_socket)], stdin=subprocess.DEVNULL, stdout=err,
            stderr=err)
    cri = new_runtime_client(f"unix://{paths.cri_socket}", timeout=10.0)
    try:
        def up() -> bool:
            try:
                cri.version()
            except CriError:
                return False
            return True
        wait_for(up, 30.0, 0.05, "the runtime to serve")
        logs = paths.pod_logs_dir / "default_p_u1"
        logs.mkdir(parents=True)
        ns = pb.NamespaceOption(network=pb.NODE, pid=pb.CONTAINER)
        box = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name="p", namespace="default", uid="u1"),
            hostname="", log_directory=str(logs), labels=L.pod_labels("p", "default", "u1"),
            linux=pb.LinuxPodSandboxConfig(
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns)))
        sid = cri.run_pod_sandbox(box)
        cid = cri.create_container(sid, pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="c"), image=pb.ImageSpec(image="host"),
            command=["sh", "-c", "exec sleep 600"], log_path="c/0.log",
            labels=L.container_labels("p", "default", "u1", "c"),
            annotations=L.container_annotations("h", 0, 3)), box)
        cri.start_container(cid)

        done = subprocess.run([str(BIN / "podvisorctl"), "--root-dir", str(root), "shutdown",
                               "--pods"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert "stopped pod default/p (uid u1): 1 running container, grace 3s" in done.stdout
        assert proc.poll() is None and cri.list_pod_sandbox() == [], "not through that runtime"
        assert cri.list_containers() == []
        assert "ctl.runtime_serving" in (paths.logs_dir / "podvisorctl.log").read_text()
    finally:
        cri.close()
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)
