"""Fixtures for the misuse tests: the integration suite's, on the same real broker."""

from __future__ import annotations

import pytest

from tests.integration.conftest import (  # noqa: F401 (fixtures)
    collect,
    driver,
    driver_for,
    driver_kind,
    make_topology,
    node_topology,
    start_consumer,
)
from tests.integration.test_grant import granted, make_user  # noqa: F401 (fixtures)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Those that reach a real broker count as integration tests (-m "not integration").
    for item in items:
        uses_broker = {"rabbitmq_url", "local_rabbitmq_management_node"} & set(
            getattr(item, "fixturenames", ())
        )
        if "misuse" in item.path.parts and uses_broker:
            item.add_marker(pytest.mark.integration)
