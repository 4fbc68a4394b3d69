"""The asyncio adapters on uvloop, the loop ``uvicorn[standard]`` runs by default.

uvloop's transports are not ``asyncio.Transport`` subclasses: a type check in the frame
client's ``connection_made`` once failed there, the loop swallowed the error, and a
publish hung for 31 s before blaming the URL while a consumer received nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvloop

from delayq import Message, Topology
from delayq.aio import AsyncConsumer, AsyncPublisher, apply_topology_async
from delayq.errors import ConnectionFailed
from delayq.stores.memory import InMemoryStore


def on_uvloop(coro: Any) -> Any:
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, 60))
    finally:
        loop.close()


def test_publish_and_consume_through_a_tier_on_uvloop(make_topology, rabbitmq_url):
    topo: Topology = make_topology(["1s"])
    queue = f"{topo.namespace}.work"

    async def main() -> tuple[list[int], str]:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        await apply_topology_async(topo, rabbitmq_url)
        seen: list[int] = []
        all_in = asyncio.Event()

        async def handler(body: dict[str, int]) -> None:
            seen.append(body["n"])
            if len(seen) == 21:
                all_in.set()

        consumer = AsyncConsumer(rabbitmq_url, topo, queue, handler, store=InMemoryStore())
        await consumer.start()
        try:
            async with AsyncPublisher(rabbitmq_url, topo) as pub:
                receipt = await pub.publish({"n": 0}, "job.one", "1s")
                await pub.publish_many([Message({"n": n}, "job.many", "0s") for n in range(1, 21)])
            await asyncio.wait_for(all_in.wait(), 30)
        finally:
            await consumer.stop(10)
        return seen, receipt.tier

    seen, tier = on_uvloop(main())
    assert sorted(seen) == list(range(21))
    assert tier == "1s"


def test_a_dead_broker_fails_fast_on_uvloop(make_topology, rabbitmq_url):
    """No port answers: a clear ConnectionFailed at once, not a hang."""
    from delayq.local.ports import free_port

    url = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    topo: Topology = make_topology(["1s"])

    async def main() -> None:
        async with AsyncPublisher(url, topo) as pub:
            await pub.publish({"n": 0}, "job.one", "1s")

    with pytest.raises(ConnectionFailed):
        on_uvloop(main())
