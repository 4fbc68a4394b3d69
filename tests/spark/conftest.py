"""The Spark tests: one xdist group, run first, in one local Spark session per worker
(the ``spark`` fixture of tests/conftest.py, which the docs' Spark blocks share).

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
    return any(mark.args == ("spark",) for mark in item.iter_markers("xdist_group"))


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark the Spark tests: ``spark``, and one xdist group. Under ``--dist loadgroup``
    (scripts/test.sh) one worker runs them all in one JVM, while the other workers share
    the rest; split, each worker would start a JVM of its own on two cores. (Marked as
    each is collected: xdist reads the groups in its own collection hook. This hook sees
    the items of tests/spark only: the docs' Spark blocks get the group from
    tests/integration/test_readme_examples.py.)"""
    if "spark" in item.path.parts:
        item.add_marker(pytest.mark.spark)
        item.add_marker(pytest.mark.xdist_group("spark"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Spark group first: its long share starts at once, not as the tail."""
    items[:] = sorted(items, key=lambda item: not _uses_spark(item))  # stable
    if getattr(config.option, "loadgroup", False):  # an xdist worker under loadgroup
        _group_ids(items)


def _group_ids(items: list[pytest.Item]) -> None:
    """Give each grouped test the ``@group`` id suffix that xdist's scheduler reads.

    xdist 3.8 writes it to ``Node._nodeid``, which pytest 9 no longer reads (a node's id
    is ``Node._id``), so its loadgroup would silently schedule like ``load``; under
    pytest 8 the suffix is there already and nothing changes here.
    """
    try:
        from _pytest.nodeid import coerce_node_id  # pytest 9
    except ImportError:
        return
    for item in items:
        marks = list(item.iter_markers("xdist_group"))
        if marks and "@" not in item.nodeid.rsplit("]", 1)[-1]:
            item._id = coerce_node_id(f"{item.nodeid}@{marks[0].args[0]}")  # type: ignore[attr-defined]


@pytest.fixture
def make_topology(rabbitmq_url: str) -> Iterator[Callable[..., Topology]]:
    """Topologies under unique namespaces, deleted afterwards."""
    with throwaway_topologies(rabbitmq_url, prefix="s", ladder=("1s", "2s", "4s")) as make:
        yield make
