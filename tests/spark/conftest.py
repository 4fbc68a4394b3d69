"""One local Spark session for the whole test run (``local[2]``, few shuffle partitions)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from delayq import Topology
from delayq.sync import delete_topology


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
    made: list[Topology] = []

    def make(ladder: tuple[str, ...] = ("1s", "2s", "4s")) -> Topology:
        ns = f"s{uuid.uuid4().hex[:10]}"
        topology = Topology(
            namespace=ns,
            ladder=list(ladder),
            destinations=[{"queue": f"{ns}.work", "bindings": ["job.#"]}],
        )
        made.append(topology)
        return topology

    yield make
    for topology in made:
        try:
            delete_topology(topology, rabbitmq_url)
        except Exception:
            pass
