"""Links to a :class:`~delayq.testing.MemoryBroker`, for ``memory://NAME`` URLs.

``Publisher("memory://NAME", ...)`` and ``AsyncPublisher("memory://NAME", ...)``
are the real publishers (message building, checks, observers) over these links,
which :data:`delayq.links.LINKS` names for the ``memory`` scheme. Publishers
given no clock build messages on the broker's virtual clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from delayq.envelope import OutgoingMessage
from delayq.errors import PublishError, TopologyMissing
from delayq.links import LinkOptions, Settle
from delayq.marker import Gate
from delayq.provisioning import ApplyReport
from delayq.testing.broker import MemoryBroker, broker_for, send_batch
from delayq.topology import Topology

__all__ = ["AsyncMemoryLink", "MemoryLink"]


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
