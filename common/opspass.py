"""The ops port's password file (issue 14): written once, at random, by the agent at start.

`ensure_ops_password(path)` creates `path` (mode 0600, `O_EXCL`: an existing file, the operator's
or an earlier agent's, is never rewritten) holding a random URL-safe password and a newline.
`read_ops_password(path)` returns its first line (what `podvisorctl ops-password` prints and the
`ops` process checks HTTP Basic credentials against). `read_credentials(path)`: a credentials
file as `podvisorctl --credentials` and the fleet read it: one line `user:password`, or a bare
password (user `admin`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["ensure_ops_password", "read_credentials", "read_ops_password"]


def ensure_ops_password(path: Path) -> bool:
    """Create the password file when it does not exist; True when this call wrote it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(secrets.token_urlsafe(18) + "\n")
    return True


def read_ops_password(path: Path) -> str:
    """The password (first line, stripped); ValueError when the file is empty."""
    lines = path.read_text(encoding="utf-8").splitlines()
    password = lines[0].strip() if lines else ""
    if not password:
        raise ValueError(f"{path} holds no password")
    return password


def read_credentials(path: Path) -> tuple[str, str]:
    """(user, password) from a credentials file; ValueError when it is empty."""
    lines = path.read_text(encoding="utf-8").splitlines()
    line = lines[0].strip() if lines else ""
    if not line:
        raise ValueError(f"{path} is empty")
    user, sep, password = line.partition(":")
    return (user, password) if sep else ("admin", line)
