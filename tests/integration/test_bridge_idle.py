"""A bridge left idle keeps every connection it holds alive: none is dropped by the
broker for missed heartbeats (the connection that checked the apply marker at start was
left open with nobody to answer its heartbeats: an outside tester saw it dropped after 3
minutes idle, with an [error] line in the broker's log each time)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from delayq import Topology
from delayq.local.node import LocalNode
from delayq.sync import apply_topology
from delayq.sync.bridge import Bridge
from tests.integration.intake_support import Running, with_intake


def test_an_idle_bridge_misses_no_heartbeat(
    local_rabbitmq_node: LocalNode, _delayq_nodes: Any, make_topology: Callable[..., Topology]
) -> None:
    node: LocalNode = _delayq_nodes.start(config={"heartbeat": "1"})  # dropped after ~2 s
    topology = with_intake(make_topology(["1s"]))
    apply_topology(topology, node.url)
    running = Running(Bridge(node.url, topology))  # up once it returns
    try:
        time.sleep(6)  # idle: three heartbeat timeouts
    finally:
        running.stop()
    log = node.log_file.read_text(errors="replace")
    assert "missed heartbeats" not in log, [x for x in log.splitlines() if "heartbeat" in x]
