"""The fresh-boot guard of tests/conftest.py is on in every default run (`make test`, CI): the
pytest process's monotonic clock reads like a machine booted seconds ago, through
``time.monotonic`` and through the one system clock alike."""

from __future__ import annotations

import time

import pytest

from podvisor.common import SYSTEM_CLOCK
from tests import conftest


def test_monotonic_reads_as_on_a_machine_just_booted(request: pytest.FixtureRequest) -> None:
    if request.config.getoption("--uptime") == "real":
        pytest.skip("the guard is off (--uptime real)")
    assert conftest.MONOTONIC_OFFSET > 0 or conftest.REAL_MONOTONIC() < 60
    shifted = time.monotonic()
    assert abs(conftest.REAL_MONOTONIC() - conftest.MONOTONIC_OFFSET - shifted) < 1.0
    assert abs(SYSTEM_CLOCK.monotonic() - shifted) < 1.0  # the clock module sees the shift
    # a session is minutes long: far from the ~1000 s a test's fake clock typically starts at
    assert shifted < 3 + 3600
