"""Fixtures for the misuse tests: the integration suite's, on the same real broker."""

from __future__ import annotations

from tests.integration.conftest import collect, make_topology  # noqa: F401
