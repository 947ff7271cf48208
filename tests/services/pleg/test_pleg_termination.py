"""An exited container's message as the kubelet makes it (issue 24): the termination-log file
mounted on terminationMessagePath, its last 4096 bytes, else with FallbackToLogsOnError and a
failure the tail of the CRI log (80 lines, 2048 bytes), after the runtime's own message."""

from __future__ import annotations

from pathlib import Path

from cri_api.v1 import api_pb2 as pb

from podvisor.common import labels
from podvisor.services.pleg.records import container_record_of_status
from podvisor.services.pleg.termination import termination_message


def status(tmp: Path, *, exit_code: int = 1, text: bytes | None = b"", message: str = "",
           policy: str = "File", log: list[str] | None = None,
           state: int = pb.CONTAINER_EXITED) -> tuple[pb.ContainerStatus, dict[str, str]]:
    host = tmp / "termination-log"
    if text is not None:
        host.write_bytes(text)
    log_path = tmp / "0.log"
    log_path.write_text("".join(f"2026-01-01T00:00:00.000000000Z stdout {line}\n"
                                for line in log or []))
    st = pb.ContainerStatus(id="c1", metadata=pb.ContainerMetadata(name="app"), state=state,
                            exit_code=exit_code, message=message, log_path=str(log_path),
                            mounts=[pb.Mount(container_path="/dev/termination-log",
                                             host_path=str(host))])
    notes = {labels.TERMINATION_MESSAGE_PATH: "/dev/termination-log",
             labels.TERMINATION_MESSAGE_POLICY: policy}
    return st, notes


def test_the_file_is_the_message(tmp_path: Path) -> None:
    st, notes = status(tmp_path, text=b"config missing: /etc/app.yaml\n")
    assert termination_message(st, notes) == "config missing: /etc/app.yaml\n"
    st.message = "OOMKilled"
    assert termination_message(st, notes) == "OOMKilled: config missing: /etc/app.yaml\n"
    big, notes = status(tmp_path, text=b"x" * 5000 + b"END")
    assert termination_message(big, notes) == "x" * 4093 + "END"  # its last 4096 bytes
    running, notes = status(tmp_path, text=b"early", state=pb.CONTAINER_RUNNING)
    assert termination_message(running, notes) == ""  # only once it exited


def test_fallback_to_logs_on_error_only(tmp_path: Path) -> None:
    lines = [f"F line {i}" for i in range(100)] + ["P part", "F ial"]
    st, notes = status(tmp_path, text=b"", policy="FallbackToLogsOnError", log=lines)
    got = termination_message(st, notes)
    assert got.endswith("line 99\npartial\n") and "line 19\n" not in got  # 80 entries
    assert len(got.encode()) <= 2048
    ok, notes = status(tmp_path, exit_code=0, text=b"", policy="FallbackToLogsOnError",
                       log=["F done"])
    assert termination_message(ok, notes) == ""  # success: no log tail
    plain, notes = status(tmp_path, text=b"", log=["F boom"])
    assert termination_message(plain, notes) == ""  # policy File: the file or nothing
    (tmp_path / "termination-log").unlink()
    missing, notes = status(tmp_path, text=None, policy="FallbackToLogsOnError",
                            log=["F boom"])
    assert termination_message(missing, notes) == "boom\n"


def test_the_pleg_record_carries_it(tmp_path: Path) -> None:
    st, notes = status(tmp_path, text=b"bye")
    st.annotations.update(notes)
    assert container_record_of_status(st, "s1")["message"] == "bye"
