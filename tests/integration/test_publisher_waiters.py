"""An ``AsyncPublisher`` shared by many tasks (a web app's requests) while its broker is
down, and one used again under a new event loop.

Found by an outside tester on the web-app guide: the publishes waiting for a dead broker
queued behind one another, each making its own ``reconnect_within`` attempt, so the k-th
of them answered after k times that long (a SIGTERM then waited for all of them); and a
publisher used in a second ``asyncio.run`` failed every publish, one traceback each.
"""

from __future__ import annotations

import asyncio
import uuid

from delayq import ConnectionFailed, Message, Topology
from delayq.aio import AsyncPublisher
from delayq.local.node import LocalNode
from delayq.sync import apply_topology


def _topology() -> Topology:
    return Topology(
        namespace=f"wait{uuid.uuid4().hex[:8]}", ladder=["1h"], external_bindings=("orders.#",)
    )


def test_publishes_waiting_for_a_dead_broker_share_one_attempt_and_the_next_one_reconnects():
    with LocalNode() as node:
        topo = _topology()
        apply_topology(topo, node.url)

        async def main() -> tuple[list[object], str]:
            async with AsyncPublisher(node.url, topo, reconnect_within="3s") as publisher:
                await publisher.connect()
                node.stop()
                outcomes = await asyncio.gather(
                    *(publisher.publish({"n": n}, "orders.reminder", "1h") for n in range(20)),
                    return_exceptions=True,
                )
                node.start()
                receipt = await publisher.publish({"n": 20}, "orders.reminder", "1h")
            return outcomes, receipt.tier or ""

        outcomes, tier = asyncio.run(asyncio.wait_for(main(), 240))
    assert all(isinstance(o, ConnectionFailed) for o in outcomes), outcomes
    # One attempt for all twenty (its error, shared), not twenty attempts in a row.
    assert len({id(o) for o in outcomes}) == 1
    assert tier == "1h"


def test_a_publisher_used_again_under_a_new_event_loop_opens_a_connection_there(rabbitmq_url):
    topo = _topology()
    apply_topology(topo, rabbitmq_url)
    publisher = AsyncPublisher(rabbitmq_url, topo)

    async def publish(count: int) -> int:
        single = [await publisher.publish({"n": n}, "orders.reminder", "1h") for n in range(count)]
        batch = await publisher.publish_many(
            [Message({"n": n}, "orders.reminder", "1h") for n in range(count)]
        )
        return len(single) + len(batch)

    assert asyncio.run(publish(1)) == 2  # the first loop ends; its connection with it
    assert asyncio.run(publish(50)) == 100
    asyncio.run(publisher.aclose())
