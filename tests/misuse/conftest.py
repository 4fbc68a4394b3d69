"""Fixtures for the misuse tests: the integration suite's, on the same real broker."""

from __future__ import annotations

import pytest

from tests.integration.conftest import collect, make_topology  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "misuse" in item.path.parts:
            item.add_marker(pytest.mark.integration)
