"""A worker module for the consume misuse tests (``delayq worker tests.misuse.consume_app``)."""

from __future__ import annotations

from typing import Any

from delayq import Topology, Worker

worker = Worker(
    Topology(namespace="misuseapp", destinations=[{"queue": "misuseapp.work", "bindings": ["x"]}])
)


@worker.handler("misuseapp.work")
def handle(body: Any) -> None:
    """Never reached: the options are refused before anything connects."""
