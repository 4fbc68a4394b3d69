"""Fixtures for the misuse tests: the integration suite's, on the same real broker."""

from __future__ import annotations

from tests.integration.conftest import (  # noqa: F401
    collect,
    driver_kind,
    make_topology,
    start_consumer,
)
