"""A bridge whose connection is closed under it while it streams: its consuming
connection (it reconnects; what it had not acked is delivered again) or its publishing
one (the stream re-sends what was unconfirmed on a fresh connection; the deliveries wait
for their confirms). Either way every message arrives, none is lost, nothing is left in
the intake queue or its DLQ, and the bridge goes on."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from delayq.local.node import LocalNode
from delayq.sync import apply_topology
from delayq.sync.bridge import Bridge
from tests.amqp import depth
from tests.integration.intake_support import Running, publish_plugin_style
from tests.waiting import wait_for

COUNT = 3000

NAMES = {"consume": "delayq-bridge ", "publish": "delayq-publisher-shared"}
"""The connection names each side opens with (in its client properties)."""


def _close(node: LocalNode, side: str) -> int:
    """Close every connection of ``side`` of the bridge; how many were."""
    rows = node.ctl("list_connections", "pid", "client_properties", "--no-table-headers", "-q")
    pids = [row.split("\t", 1)[0] for row in rows.splitlines() if NAMES[side] in row]
    for pid in pids:
        node.ctl("close_connection", pid, "delayq bridge loss test", check=False)
    return len(pids)


@pytest.mark.parametrize("side", ["consume", "publish"])
def test_a_lost_connection_of_either_side_loses_no_message(
    local_rabbitmq_node: LocalNode, make_topology: Any, collect: Any, side: str
) -> None:
    url = local_rabbitmq_node.url
    probe = make_topology()
    ns = probe.namespace
    topology = make_topology(
        destinations=[{"queue": f"{ns}x.work", "bindings": ["job.a"]}],
        intakes=[{"exchange": f"plugin-{ns}"}],
    )
    apply_topology(topology, url)
    intake = topology.intakes[0]
    queue = intake.queue_name(topology.namespace)
    messages = [
        {"id": f"l-{n}", "routing_key": "job.a", "body": b"{}", "headers": {"x-delay": 0}}
        for n in range(COUNT)
    ]
    publish_plugin_style(url, intake.exchange, messages)
    running = Running(Bridge(url, topology, prefetch=100))
    stats = running.bridge.stats
    try:
        closed = 0
        for after in (300, 1500):
            wait_for(lambda n=after: stats.forwarded >= n, 60, lambda: f"{stats}")
            closed += _close(local_rabbitmq_node, side)
        assert closed >= 1
        wait_for(lambda: depth(url, queue) == 0 and stats.forwarded >= COUNT - 100, 120,
                 lambda: f"{depth(url, queue)} in the intake queue, {stats}")  # fmt: skip
    finally:
        running.stop()
    arrived = collect(topology.destinations[0].queue, url=url)
    got = arrived.wait(COUNT, 60)
    ids = Counter(a.message_id for a in got)
    assert set(ids) == {m["id"] for m in messages}  # each one, maybe twice, none lost
    assert depth(url, queue) == 0 and depth(url, intake.dlq_name(topology.namespace)) == 0
    assert stats.parked == 0 and stats.rejected == 0
    if side == "consume":
        assert stats.reconnects >= 1
    else:  # the stream rode it out: the consuming connection was never lost
        assert stats.reconnects == 0
