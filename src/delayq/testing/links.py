"""Links and feeds to a :class:`~delayq.testing.MemoryBroker`, for ``memory://NAME`` URLs.

``Publisher("memory://NAME", ...)``, ``Consumer("memory://NAME", ...)`` and their
asyncio twins are the real classes (message building, the delivery flow,
checks, observers) over these, which :mod:`delayq.links` names for the
``memory`` scheme. Given no clock, they run on the broker's virtual clock. The
feeds are *inline*: the broker delivers while it runs (``broker.advance``), in
the caller's thread, and the consumer runs the handler right there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from delayq.errors import InvalidInput, PublishError, TopologyMissing
from delayq.links import AsyncOnDelivery, LinkOptions, OnDelivery, Settle
from delayq.message.envelope import OutgoingMessage
from delayq.testing.broker import MemoryBroker, broker_for, send_batch
from delayq.testing.model import StoredMessage, delivery_of
from delayq.topology.marker import Gate
from delayq.topology.model import Topology
from delayq.topology.report import ApplyReport

__all__ = [
    "AsyncMemoryFeed",
    "AsyncMemoryLink",
    "BrokerHandle",
    "BrokerSettler",
    "MemoryFeed",
    "MemoryLink",
]


class MemoryLink:
    """A :class:`~delayq.links.Link` to a memory broker (it refuses, like RabbitMQ, a
    namespace whose apply did not complete, and a closed broker)."""

    def __init__(self, url: str, gate: Gate, options: LinkOptions | None = None) -> None:
        self.broker: MemoryBroker = broker_for(url)  # an unknown name fails here
        self._gate = gate
        self.clock_ms: Callable[[], int] | None = self.broker.clock_ms

    def __repr__(self) -> str:
        return f"MemoryLink({self.broker.url!r})"

    def connect(self) -> None:
        broker_for(self.broker.url)  # closed brokers fail like unreachable ones
        self.broker.check_applied(self._gate)

    def send(self, msg: OutgoingMessage) -> None:
        self.broker.check_applied(self._gate)
        self.broker.send(msg)

    def send_batch(self, msgs: list[OutgoingMessage], window: int) -> None:
        self.broker.check_applied(self._gate)
        send_batch(self.broker, msgs)

    def send_stream(self, msgs: Iterable[OutgoingMessage], settle: Settle, window: int) -> None:
        self.broker.check_applied(self._gate)
        for index, msg in enumerate(msgs):
            try:
                self.broker.send(msg)
            except TopologyMissing:
                raise
            except PublishError as exc:
                settle(index, msg, exc)
                continue
            settle(index, msg, None)

    def apply(self, topology: Topology, *, raise_on_conflict: bool = True) -> ApplyReport:
        return self.broker.apply(topology, raise_on_conflict=raise_on_conflict)

    def close(self) -> None:
        pass


class AsyncMemoryLink:
    """An :class:`~delayq.links.AsyncLink` to a memory broker."""

    def __init__(self, url: str, gate: Gate, options: LinkOptions | None = None) -> None:
        self._link = MemoryLink(url, gate, options)
        self.broker = self._link.broker
        self.clock_ms = self._link.clock_ms

    def __repr__(self) -> str:
        return f"AsyncMemoryLink({self.broker.url!r})"

    async def connect(self) -> None:
        self._link.connect()

    async def send(self, msg: OutgoingMessage) -> None:
        self._link.send(msg)

    async def send_batch(self, msgs: list[OutgoingMessage], window: int) -> None:
        self._link.send_batch(msgs, window)

    async def apply(self, topology: Topology, *, raise_on_conflict: bool = True) -> ApplyReport:
        return self._link.apply(topology, raise_on_conflict=raise_on_conflict)

    async def close(self) -> None:
        pass


class BrokerSettler:
    """Settles a delivery on the memory broker, while its feed is subscribed."""

    __slots__ = ("_feed", "_tag")

    def __init__(self, feed: MemoryFeed, tag: int) -> None:
        self._feed, self._tag = feed, tag

    @property
    def current(self) -> bool:
        return self._feed.consuming

    def ack(self) -> None:
        self._feed.broker.ack(self._tag)

    def requeue(self) -> None:
        self._feed.broker.nack(self._tag, requeue=True)


class MemoryFeed:
    """An inline :class:`~delayq.links.Feed` from a memory broker (the broker's
    ``Subscriber``): ``broker.advance`` hands it deliveries in the caller's thread."""

    inline = True
    is_async = False

    def __init__(self, url: str) -> None:
        self.broker: MemoryBroker = broker_for(url)
        self.clock_ms: Callable[[], int] | None = self.broker.clock_ms
        self.queue = ""
        self.consuming = False
        self._on_delivery: OnDelivery | None = None

    def __repr__(self) -> str:
        return f"MemoryFeed({self.broker.url!r}, queue={self.queue!r})"

    def open(self, topology: Topology, queue: str, prefetch: int, on_delivery: OnDelivery) -> None:
        self.broker.apply(topology)  # as a real consumer applies its topology
        self.queue, self._on_delivery = queue, on_delivery
        self.broker.subscribe(self)
        self.consuming = True

    def deliver(self, tag: int, message: StoredMessage) -> None:
        """Called by the broker as it runs."""
        assert self._on_delivery is not None
        self._on_delivery(BrokerSettler(self, tag), delivery_of(self.queue, message))

    async def adeliver(self, tag: int, message: StoredMessage) -> None:
        self.deliver(tag, message)

    def resubscribe(self, prefetch: int) -> None:
        pass  # one delivery at a time, whatever the prefetch

    def pump(self, time_limit_s: float) -> None:
        pass  # inline: the broker delivers while it runs

    def unsubscribe(self) -> None:
        if self.consuming:
            self.broker.unsubscribe(self)
            self.consuming = False

    def ready(self) -> int:
        return self.broker.depth(self.queue)

    def sleep(self, seconds: float) -> None:
        pass  # virtual time: nothing to wait for

    def wake(self) -> None:
        pass

    def close(self) -> None:
        self.unsubscribe()


class BrokerHandle:
    """A delivery's tag on the memory broker, settled there (a ``links.Settleable``)."""

    __slots__ = ("_broker", "delivery_tag")

    def __init__(self, broker: MemoryBroker, tag: int) -> None:
        self._broker = broker
        self.delivery_tag: int | None = tag

    async def ack(self, multiple: bool = False) -> None:
        assert self.delivery_tag is not None
        self._broker.ack(self.delivery_tag, multiple=multiple)

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        assert self.delivery_tag is not None
        self._broker.nack(self.delivery_tag, requeue=requeue)


class AsyncMemoryFeed:
    """An inline :class:`~delayq.links.AsyncFeed` from a memory broker:
    ``await broker.advance_async(...)`` awaits each delivery's flow."""

    inline = True
    is_async = True

    def __init__(self, url: str) -> None:
        self.broker: MemoryBroker = broker_for(url)
        self.clock_ms: Callable[[], int] | None = self.broker.clock_ms
        self.queue = ""
        self.consuming = False
        self._on_delivery: AsyncOnDelivery | None = None

    def __repr__(self) -> str:
        return f"AsyncMemoryFeed({self.broker.url!r}, queue={self.queue!r})"

    async def open(
        self,
        topology: Topology,
        queue: str,
        prefetch: int,
        on_delivery: AsyncOnDelivery,
        on_lost: Callable[[BaseException], None],
    ) -> None:
        self.broker.apply(topology)  # as a real consumer applies its topology
        self.queue, self._on_delivery = queue, on_delivery
        self.broker.subscribe(self)
        self.consuming = True

    def deliver(self, tag: int, message: StoredMessage) -> None:
        raise InvalidInput("an async consumer is delivered to with adeliver()")

    async def adeliver(self, tag: int, message: StoredMessage) -> None:
        """Called by the broker as it runs."""
        assert self._on_delivery is not None
        await self._on_delivery(BrokerHandle(self.broker, tag), delivery_of(self.queue, message))

    async def resubscribe(self, prefetch: int) -> None:
        pass

    async def unsubscribe(self) -> None:
        self.broker.unsubscribe(self)
        self.consuming = False

    async def ready(self) -> int:
        return self.broker.depth(self.queue)

    async def close(self) -> None:
        await self.unsubscribe()
