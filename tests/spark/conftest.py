"""One local Spark session for the whole test run (``local[2]``, few shuffle partitions)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from delayq import Topology
from tests.topologies import throwaway_topologies


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "spark" in item.path.parts:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from delayq.spark import local_session

    session = local_session("local[2]", app_name="delayq-tests", shuffle_partitions=4)
    yield session
    session.stop()


@pytest.fixture
def make_topology(rabbitmq_url: str) -> Iterator[Callable[..., Topology]]:
    """Topologies under unique namespaces, deleted afterwards."""
    with throwaway_topologies(rabbitmq_url, prefix="s", ladder=("1s", "2s", "4s")) as make:
        yield make
