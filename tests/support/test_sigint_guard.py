"""The suite's SIGINT guard (tests/conftest.py `_default_sigint`): however the suite was started
(in the background by a non-interactive shell, SIGINT comes ignored), a process a test starts
takes Ctrl-C as from a terminal."""

from __future__ import annotations

import subprocess
import sys


def test_a_child_of_the_suite_gets_keyboard_interrupt_on_sigint() -> None:
    probe = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "True"
