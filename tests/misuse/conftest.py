"""User-error scenarios against a real broker, with the integration suite's fixtures."""

from __future__ import annotations

import pytest

from tests.integration.conftest import (  # noqa: F401 (fixtures)
    collect,
    driver,
    driver_for,
    driver_kind,
    make_topology,
    start_consumer,
)
from tests.integration.test_grant import make_user  # noqa: F401 (a fixture)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "misuse" in item.path.parts:
            item.add_marker(pytest.mark.integration)
