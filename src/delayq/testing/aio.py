"""The asyncio adapters on a :class:`~delayq.testing.MemoryBroker`.

``AsyncConsumer("memory://NAME", ...)`` builds this: the real class with the
broker I/O swapped for the memory broker's. Drive it with
``await broker.advance_async("15m")``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from delayq.aio._acks import AckCoalescer
from delayq.aio.consumer import AsyncConsumer
from delayq.testing.broker import MemoryBroker, broker_for
from delayq.testing.clock import PruneSchedule
from delayq.testing.model import StoredMessage, delivery_of
from delayq.testing.sync import _virtual_clock
from delayq.topology import Topology
from delayq.urls import resolve_url

__all__ = ["AsyncMemoryConsumer", "BrokerHandle"]


class BrokerHandle:
    """A delivery's tag on the memory broker, settled there (see ``aio._acks.Settleable``)."""

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


class AsyncMemoryConsumer(AsyncConsumer):
    """An :class:`~delayq.aio.AsyncConsumer` attached to a memory broker.

    ``await consumer.start()`` attaches it; ``await broker.advance_async("15m")``
    runs its handler for what falls due. ``handler_timeout`` is not enforced.
    """

    is_async = True

    def __init__(
        self,
        url: str | None,
        topology: Topology,
        queue: str,
        handler: Callable[..., Any],
        **options: Any,
    ) -> None:
        broker = broker_for(resolve_url(url))
        _virtual_clock(broker, options)
        super().__init__(url, topology, queue, handler, **options)
        self.broker = broker
        self._return_pause_s = 0.0  # virtual time: no need to pause before a requeue
        self._prunes = PruneSchedule(self._settings.prune_every_ms, self._settings.retention_ms)

    async def start(self) -> None:
        """Declare the topology on the memory broker and attach to it."""
        self._stopping = False
        await self._open()
        self._stopped.clear()

    async def _open(self) -> None:
        self.broker.apply(self.topology)  # as the real consumer applies its topology
        self._acks = AckCoalescer()
        self.broker.subscribe(self)

    async def stop(self, timeout_s: float = 30.0) -> None:
        self.broker.unsubscribe(self)
        await super().stop(timeout_s)

    def deliver(self, tag: int, message: StoredMessage) -> None:
        raise RuntimeError("an async consumer is delivered to with adeliver()")

    async def adeliver(self, tag: int, message: StoredMessage) -> None:
        """Called by the broker: the same processing as a delivery from aio-pika."""
        await self._prune_on_virtual_time()
        await self._on_delivery(BrokerHandle(self.broker, tag), delivery_of(self.queue, message))
        await self._acks.drain()

    async def _prune_on_virtual_time(self) -> None:
        """Forget keys past the retention period on the broker's clock."""
        cutoff = self._prunes.due(self._clock_ms())
        if cutoff is not None and self._store is not None:
            await self._store.prune(older_than_ms=cutoff)
