"""[issue 24] The embedded runtime without root cannot mount the kubelet's termination-log file
(no mount namespace): it drops only that mount (``Engine._mountable``) and its ContainerStatus
says so (``without_termination_log``): the mount is not listed, and an exited container's
message names why there is no file's text, so ``state.terminated.message`` (PLEG's
``termination_message``) shows it; FallbackToLogsOnError still gives the log's tail."""

from __future__ import annotations

from pathlib import Path

from cri_api.v1 import api_pb2 as pb

from podvisor.common import labels
from podvisor.services.pleg.termination import termination_message
from podvisor.services.runtime.engine import TERMINATION_LOG_NOT_MOUNTED, without_termination_log


def status(tmp: Path, state: int, exit_code: int = 0,
           policy: str = "File") -> tuple[pb.ContainerStatus, dict[str, str]]:
    log = tmp / "0.log"
    log.write_text("2026-01-01T00:00:00.000000000Z stderr F panic: boom\n")
    notes = {labels.TERMINATION_MESSAGE_PATH: "/dev/termination-log",
             labels.TERMINATION_MESSAGE_POLICY: policy}
    st = pb.ContainerStatus(
        id="c1", state=state, exit_code=exit_code, log_path=str(log), annotations=notes,
        mounts=[pb.Mount(container_path="/data", host_path=str(tmp)),
                pb.Mount(container_path="/dev/termination-log",
                         host_path=str(tmp / "termination-log"))])
    return st, notes


def test_the_status_says_the_message_was_not_collected(tmp_path: Path) -> None:
    running, _ = status(tmp_path, pb.CONTAINER_RUNNING)
    out = without_termination_log(running)
    assert [m.container_path for m in out.mounts] == ["/data"] and out.message == ""
    assert len(running.mounts) == 2  # the cached status is not changed in place
    exited, notes = status(tmp_path, pb.CONTAINER_EXITED)
    assert termination_message(without_termination_log(exited), notes) == \
        TERMINATION_LOG_NOT_MOUNTED
    failed, notes = status(tmp_path, pb.CONTAINER_EXITED, 2, "FallbackToLogsOnError")
    assert termination_message(without_termination_log(failed), notes) == \
        f"{TERMINATION_LOG_NOT_MOUNTED}: panic: boom\n"
    plain = pb.ContainerStatus(id="c2", state=pb.CONTAINER_EXITED)  # no termination log
    assert without_termination_log(plain) is plain
