"""What every test gets back after it: the root logger as it found it; and what a run
leaves behind: no Erlang port mapper (epmd) it started.

``delayq run`` / ``delayq worker --heal`` run in-process by some tests call
``configure_logging``, which replaces the root logger's handlers with one on the
stderr of that moment (pytest's capture, closed after the test) and sets INFO. Left
so, every later INFO record of the worker process (py4j's among them) is written to
a closed stream and prints a "Logging error" traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from delayq.local.probes import epmd_answers, stop_epmd
from tests.loops import loop_under_test

# Hypothesis' per-example deadline (200 ms) times the machine, not the code: on a
# 2-core machine running brokers and a JVM beside the tests one example of a pure
# function can take longer, and the test would fail for it. Speed is measured by the
# scripts in bench/, never by a test.
settings.register_profile("delayq", deadline=None)
settings.load_profile("delayq")


_EPMD_BEFORE = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    if loop_under_test() == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def pytest_report_header(config: pytest.Config) -> str:
    return f"delayq: async tests on the {loop_under_test()} event loop (DELAYQ_TEST_LOOP)"


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_EPMD_BEFORE] = epmd_answers()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The first node of the installed server (3.10.8) on port 4369 starts an ``epmd
    -daemon`` that outlives it: the session's own nodes stop theirs (the plugin's
    ``_Nodes``), but a cluster fixture's and the docs' LocalCluster block's were left
    running after every run. It is stopped here by the process that ran the session (not
    by each xdist worker), if it was not running before; ``epmd -kill`` refuses while a
    node is still registered, so nobody's live node loses it."""
    if hasattr(session.config, "workerinput") or session.config.stash.get(_EPMD_BEFORE, True):
        return
    if epmd_answers():
        stop_epmd()


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session per test process (``local[2]``, few shuffle partitions),
    for tests/spark and the docs' Spark blocks (one xdist group: one worker, one JVM)."""
    from delayq.spark import local_session

    session = local_session("local[2]", app_name="delayq-tests", shuffle_partitions=4, ui=False)
    yield session
    session.stop()
