"""Headers are checked against the ``frame_max`` the broker negotiated before sending.

A broker configured with ``frame_max = 8192`` (the smallest RabbitMQ 4.1+ accepts; 3.x and
4.0 take 4,096) takes a topology that assumes the default 131,072. A message whose headers
pass the topology's limits but not one 8,192-byte frame is refused by the publisher with
``HeaderFrameTooLarge``, nothing sent; before, the broker closed the shared connection
over it and everything in flight on it was sent again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from delayq import HeaderFrameTooLarge, HeadersTooLarge, Message, Publisher, PublishError
from delayq.aio import AsyncPublisher
from delayq.errors import PublishBatchError
from delayq.local.node import LocalNode
from delayq.sync import apply_topology
from delayq.topology.model import Topology
from tests.amqp import depth

BIG = {"note": "x" * 10_000}  # 10 KB: inside the default limits (16 KiB), over one 8 KiB frame


@pytest.fixture(scope="module")
def small_frames(local_rabbitmq_node: LocalNode, _delayq_nodes: Any) -> LocalNode:
    """A node of its own that negotiates 8,192-byte frames (the session's node first: it
    skips or fails, as the session says, without rabbitmq-server). RabbitMQ 4.1+ resets a
    connection to a node configured below 8,192."""
    node: LocalNode = _delayq_nodes.start(config={"frame_max": "8192"})
    return node


@pytest.fixture
def applied(small_frames: LocalNode, make_topology: Callable[..., Topology]) -> Topology:
    topo = make_topology(["1h"])
    apply_topology(topo, small_frames.url)
    return topo


def _messages(tag: str) -> list[Message]:
    return [
        Message({"n": n}, "job.frame", "1h", message_id=f"{tag}-{n}", headers=BIG if n == 3 else {})
        for n in range(10)
    ]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_oversized_header_is_refused_and_the_connection_kept(
    kind: str, small_frames: LocalNode, applied: Topology
) -> None:
    url, tier = small_frames.url, applied.tier_name(applied.ladder.tiers[0])
    batch = _messages(f"{kind}-batch")

    def check_batch(error: BaseException) -> None:
        assert isinstance(error, PublishBatchError), repr(error)
        assert set(error.failures) == {3}
        failure = error.failures[3]
        assert isinstance(failure, HeaderFrameTooLarge)
        assert isinstance(failure, HeadersTooLarge) and isinstance(failure, PublishError)
        assert "frame_max (8,192 bytes, negotiated" in str(failure)
        assert "limits: {frame_max: 8192}" in str(failure)
        assert [r is None for r in error.receipts] == [n == 3 for n in range(10)]

    if kind == "sync":
        with Publisher(url, applied) as pub:
            pub.publish({"n": 0}, "job.frame", "1h", message_id="first")
            connection = pub.link._connection  # type: ignore[attr-defined]
            with pytest.raises(HeaderFrameTooLarge, match="was not sent"):
                pub.publish({"n": 1}, "job.frame", "1h", headers=BIG)
            pub.publish({"n": 2}, "job.frame", "1h", message_id="after")
            assert pub.link._connection is connection  # type: ignore[attr-defined]
            with pytest.raises(PublishBatchError) as caught:
                pub.publish_many(batch)
            check_batch(caught.value)
    else:

        async def run() -> None:
            async with AsyncPublisher(url, applied) as pub:
                await pub.publish({"n": 0}, "job.frame", "1h", message_id="first")
                wire = await pub.link.wire()  # type: ignore[attr-defined]
                # An oversized publish among concurrent ones: the others are confirmed
                # on the same connection, none of them sent twice.
                results = await asyncio.gather(
                    pub.publish({"n": 1}, "job.frame", "1h", headers=BIG),
                    pub.publish_many(batch),
                    return_exceptions=True,
                )
                assert isinstance(results[0], HeaderFrameTooLarge), repr(results[0])
                check_batch(results[1])
                await pub.publish({"n": 2}, "job.frame", "1h", message_id="after")
                assert await pub.link.wire() is wire  # type: ignore[attr-defined]

        asyncio.run(run())
    assert depth(url, tier) == 2 + 9  # first, after and the batch's 9: nothing twice


@pytest.mark.parametrize("size", [7_980, 8_100])
def test_the_bridge_settles_a_message_its_forward_cannot_fit_at_once(
    size: int, small_frames: LocalNode, make_topology: Callable[..., Topology]
) -> None:
    """A plugin-style message whose headers fit the negotiated frame as it came, but not
    with delayq's envelope added (about 220 bytes), nor with a park's reason (about 570):
    the bridge rejects it to the intake's DLQ as it came, at once, where it was sent
    back to the intake queue until the broker's delivery limit. The messages around it
    are forwarded."""
    import pika

    from delayq.sync.bridge import Bridge
    from tests.integration.intake_support import Running, with_intake
    from tests.waiting import wait_for

    url = small_frames.url
    plain = make_topology(["1s"])
    topology = with_intake(plain)
    apply_topology(topology, url)
    intake = topology.intakes[0]
    queue, dlq = intake.queue_name(topology.namespace), intake.dlq_name(topology.namespace)
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    for n in range(5):
        headers = {"x-delay": 100, "pad": "x" * size} if n == 2 else {"x-delay": 100}
        props = pika.BasicProperties(message_id=f"f{n}", headers=headers)
        channel.basic_publish(intake.exchange, "job.frame", b"{}", props, mandatory=True)
    connection.close()
    running = Running(Bridge(url, topology))
    bridge = running.bridge
    try:
        wait_for(lambda: depth(url, dlq) == 1, 30, lambda: f"{dlq}: {depth(url, dlq)}")
        wait_for(lambda: bridge.stats.forwarded == 4, 30, lambda: f"{bridge.stats}")
        assert bridge.stats.returned == 0, bridge.stats  # never back to the intake queue
        assert (bridge.stats.parked, bridge.stats.rejected) == (0, 1), bridge.stats
        assert depth(url, queue) == 0
    finally:
        running.stop()
