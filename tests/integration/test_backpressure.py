"""Backpressure against a real broker: what a publisher holds unconfirmed stays within its
``in_flight`` bound, across concurrent publishes, and in bytes for streams."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from delayq import InFlightLimit
from delayq.aio import AsyncPublisher
from delayq.errors import PublishError
from delayq.links import AsyncLink, LinkOptions, gate_for, open_async_link
from delayq.message.envelope import Message, OutgoingMessage
from delayq.message.inflight import size_of
from delayq.sync import Publisher, apply_topology

from .conftest import Collector


class CountingLink:
    """The real asyncio link, counting what is handed to it and not yet back."""

    def __init__(self, real: AsyncLink) -> None:
        self.real = real
        self.clock_ms = real.clock_ms
        self.held = 0
        self.most = 0
        self.windows: list[int] = []

    async def connect(self) -> None:
        await self.real.connect()

    async def send(self, msg: OutgoingMessage) -> None:
        self.held += 1
        self.most = max(self.most, self.held)
        try:
            await self.real.send(msg)
        finally:
            self.held -= 1

    async def send_batch(self, built: list[OutgoingMessage], window: int) -> None:
        self.windows.append(window)
        self.held += window
        self.most = max(self.most, self.held)
        try:
            await self.real.send_batch(built, window)
        finally:
            self.held -= window

    async def close(self) -> None:
        await self.real.close()

    async def apply(self, topology: Any, *, raise_on_conflict: bool = True) -> Any:
        return await self.real.apply(topology, raise_on_conflict=raise_on_conflict)


def counting_link(url: str, topo: Any) -> CountingLink:
    return CountingLink(open_async_link(url, gate_for(topo, url), LinkOptions()))


def test_concurrent_publishes_and_batches_share_one_bound(
    make_topology: Any, rabbitmq_url: str
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    collector = Collector(rabbitmq_url, [f"{topo.namespace}.work"]).start()
    link = counting_link(rabbitmq_url, topo)
    limit = InFlightLimit(messages=20, wait="30s")

    async def main() -> None:
        async with AsyncPublisher(rabbitmq_url, topo, link=link, in_flight=limit) as pub:
            singles = [pub.publish({"n": n}, "job.a", "0s", message_id=f"p{n}") for n in range(200)]
            batches = [
                pub.publish_many(
                    [Message({"n": n}, "job.a", "0s", message_id=f"b{n}") for n in chunk],
                    window=1_000,
                )
                for chunk in (range(k, k + 300) for k in range(0, 1_500, 300))
            ]
            await asyncio.gather(*singles, *batches)

    try:
        asyncio.run(main())
        assert link.most <= 20, link.most  # never more unconfirmed than the bound
        assert link.windows and all(w == 20 for w in link.windows)  # window lowered to fit
        arrivals = collector.wait(1_700, 60)
        assert len({a.message_id for a in arrivals}) == 1_700
    finally:
        collector.stop()


def test_a_batch_window_is_lowered_to_the_byte_bound(
    make_topology: Any, rabbitmq_url: str
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    link = counting_link(rabbitmq_url, topo)
    body = b"x" * 50_000
    limit = InFlightLimit(messages=1_000, bytes=4 * (len(body) + 256))

    async def main() -> None:
        async with AsyncPublisher(rabbitmq_url, topo, link=link, in_flight=limit) as pub:
            receipts = await pub.publish_many(
                [Message(body, "job.a", "0s") for _ in range(40)], window=1_000
            )
            assert len(receipts) == 40

    asyncio.run(main())
    assert link.windows == [4]


def test_a_sync_stream_keeps_no_more_bytes_unconfirmed_than_the_bound(
    make_topology: Any, rabbitmq_url: str
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    body = b"y" * 100_000
    limit = InFlightLimit(bytes=5 * (len(body) + 256))
    pulled: list[OutgoingMessage] = []
    settled: dict[int, PublishError | None] = {}
    most_bytes = 0
    with Publisher(rabbitmq_url, topo, in_flight=limit) as pub:

        def stream() -> Iterator[OutgoingMessage]:
            nonlocal most_bytes
            for n in range(200):
                held = sum(size_of(m) for i, m in enumerate(pulled) if i not in settled)
                most_bytes = max(most_bytes, held)
                msg = pub.factory.build(body, "job.a", "0s", message_id=f"y{n}")
                pulled.append(msg)
                yield msg

        def settle(index: int, _msg: OutgoingMessage, error: PublishError | None) -> None:
            settled[index] = error

        pub.send_many(stream(), settle=settle, window=1_000)
    assert len(settled) == 200 and all(e is None for e in settled.values())
    # What was unconfirmed when the next message was pulled: within the bound (one
    # message may pass it, since the bound is checked before each message goes out).
    assert most_bytes <= limit.bytes, (most_bytes, limit.bytes)
    assert most_bytes > 0
