"""A bridge whose connection is closed under it, twice, while it streams: it reconnects,
and what it had not acked (published or not, confirmed or not) is delivered again and
sent again under the same ids. Every message arrives, none is lost, nothing is left in
the intake queue or its DLQ, and the bridge goes on. (One connection consumes and
publishes: the bridge's frame wire.)"""

from __future__ import annotations

from collections import Counter
from typing import Any

from delayq.aio._bridgewire import WireBridge
from delayq.consume.settings import RECONNECT_MIN_S
from delayq.local.node import LocalNode
from delayq.sync import apply_topology
from delayq.sync.bridge import Bridge
from tests.amqp import depth
from tests.integration.intake_support import Running, publish_plugin_style
from tests.waiting import wait_for

COUNT = 3000

NAME = "delayq-bridge "
"""The name the bridge's connection opens with (in its client properties)."""


def _close(node: LocalNode) -> int:
    """Close every connection of the bridge; how many were."""
    rows = node.ctl("list_connections", "pid", "client_properties", "--no-table-headers", "-q")
    pids = [row.split("\t", 1)[0] for row in rows.splitlines() if NAME in row]
    for pid in pids:
        node.ctl("close_connection", pid, "delayq bridge loss test", check=False)
    return len(pids)


def test_a_lost_connection_loses_no_message(
    local_rabbitmq_node: LocalNode, make_topology: Any, collect: Any
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
            closed += _close(local_rabbitmq_node)
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
    assert stats.reconnects >= 1


def test_each_new_outage_reconnects_after_the_shortest_pause(
    local_rabbitmq_node: LocalNode, make_topology: Any, monkeypatch: Any
) -> None:
    """The back-off between reconnects starts again once a connection got to consume: an
    outside tester's bridge, after five closes, waited 10 s after every later one, for
    the rest of its life (0.5, 1, 2, 4, 8, then 10 s each time)."""
    pauses: list[float] = []
    pause = WireBridge.pause

    async def recorded(self: WireBridge, seconds: float) -> None:
        pauses.append(seconds)
        await pause(self, seconds)

    monkeypatch.setattr(WireBridge, "pause", recorded)
    url = local_rabbitmq_node.url
    ns = make_topology().namespace
    topology = make_topology(
        destinations=[{"queue": f"{ns}x.work", "bindings": ["job.a"]}],
        intakes=[{"exchange": f"plugin-{ns}"}],
    )
    apply_topology(topology, url)
    running = Running(Bridge(url, topology))
    engine = running.bridge._engine
    try:
        for outage in range(1, 5):
            wait_for(lambda: engine.subscribed, 30, "the bridge consuming")
            assert _close(local_rabbitmq_node) >= 1
            wait_for(lambda n=outage: running.bridge.stats.reconnects >= n, 30,
                     lambda: f"{running.bridge.stats}")  # fmt: skip
    finally:
        running.stop()
    assert pauses == [RECONNECT_MIN_S] * 4
