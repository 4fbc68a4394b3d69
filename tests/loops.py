"""The event loops every async test runs on: asyncio's own and uvloop, the one
``uvicorn[standard]`` runs by default.

``DELAYQ_TEST_LOOP`` picks one for a whole run (scripts/test.sh runs the suites on each):
the conftest then sets the loop policy, so every ``asyncio.run``,
``asyncio.new_event_loop`` and ``asyncio.Runner`` of the tests, and of the delayq code they
drive in the test process (a ``Worker``, a ``Bridge``), makes a loop of that kind.
"""

from __future__ import annotations

import os

import pytest

LOOPS = ("asyncio", "uvloop")


def loop_under_test() -> str:
    name = os.environ.get("DELAYQ_TEST_LOOP", "asyncio")
    if name not in LOOPS:
        raise pytest.UsageError(f"DELAYQ_TEST_LOOP={name!r}: use one of {', '.join(LOOPS)}")
    return name
