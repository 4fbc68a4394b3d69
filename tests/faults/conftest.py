"""The fault-injection suite: real brokers the tests stop, restart and reconfigure.

Every test here is marked ``faults`` (run them alone with ``pytest -m faults``) and
records its figures with the ``reliability`` fixture. With
``DELAYQ_RELIABILITY_REPORT=docs/RELIABILITY.md`` the session writes that report
from what it measured (see ``tests/faults/report.py``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.local.node import LocalNode, LocalNodeError, server_installed
from delayq.pytest_plugin import _in_ci
from tests.faults.report import RESULTS, Result, write_report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "faults" in item.path.parts:
            item.add_marker(pytest.mark.faults)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("DELAYQ_RELIABILITY_REPORT")
    if target and RESULTS:
        write_report(Path(target))


@pytest.fixture
def fault_node(tmp_path: Path) -> Iterator[Callable[..., LocalNode]]:
    """Start a node of this test's own (it may stop, restart and reconfigure it)."""
    nodes: list[LocalNode] = []

    def start(**config: str) -> LocalNode:
        if not server_installed():
            message = "fault tests need rabbitmq-server installed (apt-get install rabbitmq-server)"
            if _in_ci():
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        node = LocalNode(tmp_path / f"node{len(nodes)}", config=config)
        nodes.append(node)
        try:
            return node.start()
        except LocalNodeError as exc:
            pytest.fail(f"could not start a RabbitMQ node: {exc}", pytrace=False)
            raise

    yield start
    for node in nodes:
        node.cleanup()


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Callable[..., Result]:
    """Record one scenario's figures (also printed, so ``-s`` shows them)."""

    def record(scenario: str, **figures: Any) -> Result:
        result = Result(scenario=scenario, test=request.node.nodeid, figures=figures)
        RESULTS.append(result)
        print(f"\n{scenario}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))
        return result

    return record
