"""Fixtures for the misuse tests: the integration suite's, on the same real broker."""

from __future__ import annotations

from tests.integration.conftest import (  # noqa: F401
    collect,
    driver_kind,
    make_topology,
    node_topology,
    start_consumer,
)
from tests.integration.test_grant import granted, make_user  # noqa: F401
