"""One local Spark session for the whole test run (``local[2]``, few shuffle partitions).

Without PySpark (a ``[test]`` install without the ``spark`` extra) these modules
cannot be imported, and an import error stops the whole session, whatever ``-m``
selects: so they are left out of collection, said at the end of the run, unless
the run asks for them (``-m spark``) or runs in CI (``CI`` set), where a missing
extra must fail loudly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from delayq import Topology
from tests.topologies import throwaway_topologies


def _left_out(config: pytest.Config) -> bool:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        pass
    else:
        return False
    asked = "spark" in (config.getoption("markexpr", "") or "").replace("not spark", "")
    return not asked and not os.environ.get("CI")


collect_ignore_glob: list[str] = []
LEFT_OUT = "tests/spark left out: PySpark is not installed (pip install 'delayq[spark]')"


def pytest_configure(config: pytest.Config) -> None:
    if _left_out(config):
        collect_ignore_glob.append("test_*.py")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if collect_ignore_glob:
        terminalreporter.write_line(LEFT_OUT)


def _uses_spark(item: pytest.Item) -> bool:
    return "spark" in item.path.parts or "spark.md" in item.nodeid


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the Spark tests, and keep them together at the front of the run: under
    ``--dist loadgroup`` (scripts/test.sh) one worker runs them all in one JVM, starting
    first so that its long share is not the run's tail, while the other workers share
    the rest; each worker of a split would start a JVM of its own on two cores."""
    for item in items:
        if "spark" in item.path.parts:
            item.add_marker(pytest.mark.spark)
        if _uses_spark(item):
            item.add_marker(pytest.mark.xdist_group("spark"))
    items[:] = sorted(items, key=lambda item: not _uses_spark(item))  # stable


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from delayq.spark import local_session

    session = local_session(
        "local[2]", app_name="delayq-tests", shuffle_partitions=4, ui=False
    )
    yield session
    session.stop()


@pytest.fixture
def make_topology(rabbitmq_url: str) -> Iterator[Callable[..., Topology]]:
    """Topologies under unique namespaces, deleted afterwards."""
    with throwaway_topologies(rabbitmq_url, prefix="s", ladder=("1s", "2s", "4s")) as make:
        yield make
