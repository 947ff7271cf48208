"""``supervisor.*`` log methods: the main log (readLog, clearLog) and the processes' logs
(read, tail, clear) with supervisord's offsets and faults (``logfiles``)."""

from __future__ import annotations

import os
from typing import Any

from podvisor.ipc.control import Fault
from podvisor.services.ops.logfiles import BadRead, read_file, tail_file, truncate
from podvisor.services.ops.rpc_base import RpcBase, rpc_fault

__all__ = ["LogMethods"]


class LogMethods(RpcBase):
    """readLog, clearLog and the process log methods."""

    def readLog(self, offset: int, length: int) -> str:
        """ Read length bytes from the main log starting at offset

        @param int offset         offset to start reading from.
        @param int length         number of bytes to read from the log.
        @return string result     Bytes of log
        """
        return self._read(str(self.d.logs_dir / "supervisor.log"), offset, length)

    readMainLog = readLog

    def clearLog(self) -> bool:
        """ Clear the main log.

        @return boolean result always returns True unless error
        """
        self._truncate(str(self.d.logs_dir / "supervisor.log"), "supervisor")
        return True

    # -- logs -----------------------------------------------------------------------------
    def _read(self, path: str, offset: int, length: int) -> str:
        if not path or not os.path.exists(path):
            raise rpc_fault(Fault.NO_FILE, path)
        try:
            return read_file(path, int(offset), int(length))
        except BadRead as err:
            raise rpc_fault(Fault[err.args[0]]) from None

    def _truncate(self, path: str, name: str) -> None:
        if not path or not os.path.exists(path):
            raise rpc_fault(Fault.NO_FILE, path)
        try:
            truncate(path)
        except OSError:
            raise rpc_fault(Fault.FAILED, name) from None

    def readProcessStdoutLog(self, name: str, offset: int, length: int) -> str:
        """ Read length bytes from name's stdout log starting at offset

        @param string name        the name of the process (or 'group:name')
        @param int offset         offset to start reading from.
        @param int length         number of bytes to read from the log.
        @return string result     Bytes of log
        """
        return self._read(self._one(name).logfile, offset, length)

    readProcessLog = readProcessStdoutLog

    def readProcessStderrLog(self, name: str, offset: int, length: int) -> str:
        """ Read length bytes from name's stderr log starting at offset (stderr goes to the
        same file as stdout: subsystems log to one file, CRI logs interleave both streams)

        @param string name        the name of the process (or 'group:name')
        @param int offset         offset to start reading from.
        @param int length         number of bytes to read from the log.
        @return string result     Bytes of log
        """
        return self._read(self._one(name).logfile, offset, length)

    def tailProcessStdoutLog(self, name: str, offset: int, length: int) -> list[object]:
        """ Tail the (stdout) log: up to length bytes from offset; when the log grew past
        offset + length, the read moves to its end and overflow is set.

        @param string name         the name of the process (or 'group:name')
        @param int offset          offset to start reading from
        @param int length          maximum number of bytes to return
        @return array result       [string bytes, int offset, bool overflow]
        """
        path = self._one(name).logfile
        if not path or not os.path.exists(path):
            return ["", 0, False]
        return tail_file(path, int(offset), int(length))

    tailProcessLog = tailProcessStdoutLog

    def tailProcessStderrLog(self, name: str, offset: int, length: int) -> list[object]:
        """ Tail the (stderr) log (the same file as stdout).

        @param string name         the name of the process (or 'group:name')
        @param int offset          offset to start reading from
        @param int length          maximum number of bytes to return
        @return array result       [string bytes, int offset, bool overflow]
        """
        return self.tailProcessStdoutLog(name, offset, length)

    def clearProcessLogs(self, name: str) -> bool:
        """ Clear the stdout and stderr logs for the named process

        @param string name   The name of the process (or 'group:name')
        @return boolean result      Always True unless error
        """
        proc = self._one(name)
        self._truncate(proc.logfile, proc.namespec)
        return True

    clearProcessLog = clearProcessLogs

    def clearAllProcessLogs(self) -> list[dict[str, Any]]:
        """ Clear all process log files

        @return array result   An array of process status info structs
        """
        return self._each(self._all(), lambda p: self._truncate(p.logfile, p.namespec))
