"""A bridge left idle keeps every connection it holds alive: none is dropped by the
broker for missed heartbeats (the connection that checked the apply marker at start was
left open with nobody to answer its heartbeats: an outside tester saw it dropped after 3
minutes idle, with an [error] line in the broker's log each time)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from delayq import Topology
from delayq.local.node import LocalNode
from delayq.sync import apply_topology
from delayq.sync.bridge import Bridge
from tests.waiting import wait_for


def test_an_idle_bridge_misses_no_heartbeat(
    local_rabbitmq_node: LocalNode, _delayq_nodes: Any, make_topology: Callable[..., Topology]
) -> None:
    node: LocalNode = _delayq_nodes.start(config={"heartbeat": "1"})  # dropped after ~2 s
    plain = make_topology(["1s"])
    intakes = [{"exchange": f"plugin-{plain.namespace}", "type": "topic"}]
    topology = Topology.model_validate({**plain.model_dump(), "intakes": intakes})
    apply_topology(topology, node.url)
    bridge = Bridge(node.url, topology)
    thread = threading.Thread(target=lambda: bridge.run(install_signal_handlers=False))
    thread.start()
    try:
        wait_for(bridge.started.is_set, 30, "the bridge up")
        time.sleep(6)  # idle: three heartbeat timeouts
    finally:
        bridge.request_stop()
        thread.join(30)
    log = node.log_file.read_text(errors="replace")
    assert "missed heartbeats" not in log, [x for x in log.splitlines() if "heartbeat" in x]
