"""The blocking adapters on a :class:`~delayq.testing.MemoryBroker`.

``Publisher("memory://NAME", ...)`` and ``Consumer("memory://NAME", ...)`` build
these: the same classes with the broker I/O swapped for the memory broker's,
so the decisions (tier choice, envelope, retries, dead letters, duplicates)
are the real adapters' own code, not a copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from delayq.envelope import epoch_ms
from delayq.errors import InvalidInput
from delayq.logcontext import bound_delivery
from delayq.sync.consumer import Consumer
from delayq.testing.broker import MemoryBroker, broker_for
from delayq.testing.clock import PruneSchedule
from delayq.testing.model import StoredMessage, delivery_of
from delayq.topology import Topology
from delayq.urls import resolve_url

__all__ = ["BrokerSettler", "MemoryConsumer"]


def _virtual_clock(broker: MemoryBroker, options: dict[str, Any]) -> None:
    """Unless the caller passed its own clock, time is the broker's virtual time."""
    if options.get("clock_ms", epoch_ms) is epoch_ms:
        options["clock_ms"] = broker.clock_ms


class BrokerSettler:
    """Settles a delivery on the memory broker, while its consumer is attached."""

    __slots__ = ("_broker", "_consumer", "_tag")

    def __init__(self, consumer: MemoryConsumer, tag: int) -> None:
        self._consumer, self._broker, self._tag = consumer, consumer.broker, tag

    @property
    def current(self) -> bool:
        return self._consumer.attached

    def ack(self) -> None:
        self._broker.ack(self._tag)

    def requeue(self) -> None:
        self._broker.nack(self._tag, requeue=True)


class MemoryConsumer(Consumer):
    """A :class:`~delayq.sync.Consumer` attached to a memory broker.

    It runs its handler inline when the broker runs (``broker.advance("15m")``):
    ``start()`` (or ``run()``, which returns at once) attaches it. Handlers run
    in the test's thread, so ``handler_timeout`` is not enforced.
    """

    is_async = False

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
        self._attached = False
        self._prunes = PruneSchedule(self._settings.prune_every_ms, self._settings.retention_ms)

    @property
    def attached(self) -> bool:
        return self._attached

    def _open(self) -> None:
        self.broker.apply(self.topology)  # as the real consumer applies its topology
        self._attached = True
        self.broker.subscribe(self)

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Attach to the broker and return: the broker's ``advance`` runs the handler."""
        if not self._attached:
            self.start()

    def close(self) -> None:
        self.broker.unsubscribe(self)
        self._attached = False
        self._observers.flush()
        self.started.clear()

    def deliver(self, tag: int, message: StoredMessage) -> None:
        """Called by the broker: the same processing as a delivery from pika."""
        if not self._attached:
            self.start()
        self._prune_on_virtual_time()
        # The real consumer's steps, in this thread: no handler thread, no timeout.
        job = self._begin(BrokerSettler(self, tag), delivery_of(self.queue, message))
        if job is not None:
            job.run()
            with bound_delivery(job.delivery):
                self._finish(job)
        if self._fatal is not None:
            fatal, self._fatal = self._fatal, None
            raise fatal

    async def adeliver(self, tag: int, message: StoredMessage) -> None:
        raise InvalidInput("a sync consumer is delivered to with deliver()")

    def _prune_on_virtual_time(self) -> None:
        """Forget keys past the retention period on the broker's clock."""
        cutoff = self._prunes.due(self._clock_ms())
        if cutoff is not None and self._store is not None:
            self._store.prune(older_than_ms=cutoff)
