"""The memory broker's inspection and replay: what tests read of its queues, and the
``dlq replay`` / ``unrouted replay`` it performs like the CLI does.

:class:`BrokerViews` is a base of :class:`~delayq.testing.MemoryBroker`: it reads the
broker's declared world and clock and sends through the broker's own :meth:`send`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from delayq.consume.delivery import Delivery
from delayq.message.envelope import OutgoingMessage
from delayq.observe.replays import replaying
from delayq.observe.tracing import TracingOption, tracing_for
from delayq.ops.parked import H_REPLAYED_AT, replay_message
from delayq.ops.replay_marks import ReplayMarks
from delayq.testing.clock import VirtualClock
from delayq.testing.dispatch import Dispatch
from delayq.testing.entities import Entities
from delayq.testing.model import Exchange, Queue, StoredMessage
from delayq.topology.model import Topology

__all__ = ["BrokerViews"]


class BrokerViews:
    """Inspection (queues, messages, depths, DLQs, unrouted) and replay."""

    clock: VirtualClock
    _world: Entities
    _queues: dict[str, Queue]
    _exchanges: dict[str, Exchange]
    _dispatch: Dispatch

    def send(self, msg: OutgoingMessage) -> None:
        raise NotImplementedError  # MemoryBroker.send

    def queues(self) -> list[str]:
        return list(self._queues)

    def exchanges(self) -> list[str]:
        return list(self._exchanges)

    def messages(self, queue: str) -> list[StoredMessage]:
        """The messages waiting in ``queue``, head first (they stay there)."""
        return list(self._world.queue(queue).messages)

    def depth(self, queue: str) -> int:
        return len(self._world.queue(queue).messages)

    def dlq(self, queue: str) -> list[StoredMessage]:
        """What delayq dead-lettered from ``queue`` (its ``<queue>.dlq``), oldest first."""
        return self.messages(f"{queue}.dlq")

    def unrouted(self, topology: Topology | str | None = None) -> list[StoredMessage]:
        """Due messages no binding wanted, parked in ``<ns>.unrouted`` (every
        namespace's when ``topology`` is ``None``), oldest first."""
        if isinstance(topology, Topology):
            return self.messages(topology.unrouted)
        if isinstance(topology, str):
            return self.messages(f"{topology}.unrouted")
        parked = [m for q in self._queues.values() if q.role == "unrouted" for m in q.messages]
        return sorted(parked, key=lambda m: m.seq)

    def purge(self, queue: str) -> list[StoredMessage]:
        """Remove and return everything waiting in ``queue``."""
        q = self._world.queue(queue)
        taken = list(q.messages)
        q.messages.clear()
        return taken

    def replay_dlq(
        self,
        queue: str,
        ids: Collection[str] | None = None,
        *,
        marks: ReplayMarks | None = None,
        tracing: TracingOption = None,
    ) -> list[str]:
        """Send ``<queue>.dlq``'s messages (those in ``ids``, else all) back to ``queue``
        alone, attempt counter reset, as ``delayq dlq replay`` does; return their ids.
        ``marks``: each message's cancel is looked up (or cleared) first, as
        ``delayq dlq replay --store`` (``--uncancel``) does. ``tracing``: as a
        publisher's; when traced, each replay is a ``replay`` span (as there)."""
        return self._replay(f"{queue}.dlq", ids, lambda message: ("", queue), marks, tracing)

    def replay_unrouted(
        self,
        topology: Topology,
        ids: Collection[str] | None = None,
        *,
        tracing: TracingOption = None,
    ) -> list[str]:
        """Send ``<ns>.unrouted``'s messages to the ready exchange again with their first
        routing key, as ``delayq unrouted replay`` does; return their ids. One whose key
        still matches no binding comes straight back and is not counted (as there)."""

        def target(message: StoredMessage) -> tuple[str, str]:
            return topology.ready_exchange, _delivery(message).origin_routing_key

        return self._replay(topology.unrouted, ids, target, tracing=tracing)

    def _replay(
        self,
        queue: str,
        ids: Collection[str] | None,
        target: Callable[[StoredMessage], tuple[str, str]],
        marks: ReplayMarks | None = None,
        tracing: TracingOption = None,
    ) -> list[str]:
        parked = self._world.queue(queue)
        traces = tracing_for(tracing)
        replayed: list[str] = []
        for message in list(parked.messages):
            if ids is not None and message.message_id not in ids:
                continue
            exchange, routing_key = target(message)
            if marks is not None:
                marks.before_send(_delivery(message), now_ms=self.clock.now_ms())
            copy = replay_message(
                _delivery(message),
                exchange=exchange,
                routing_key=routing_key,
                now_ms=self.clock.now_ms(),
            )
            with replaying(traces, _delivery(message, queue), copy):
                self.send(copy)
                parked.messages.remove(message)  # only once the copy is in
            last = parked.messages[-1] if parked.messages else None
            if (
                last is not None
                and last.message_id == copy.message_id
                and last.headers.get(H_REPLAYED_AT) == copy.headers[H_REPLAYED_AT]
            ):
                continue  # routed straight back here: parked again, not replayed
            replayed.append(message.message_id or "")
        return replayed

    def pending(self) -> int:
        """Messages waiting in queues with a TTL (delays and retries still running)."""
        return sum(
            1
            for q in self._queues.values()
            for m in q.messages
            if q.ttl_ms is not None or m.expiration_ms is not None
        )

    def next_due_ms(self) -> int | None:
        """When the next queue head expires (``None``: nothing is waiting)."""
        due = self._dispatch.next_due()
        return None if due is None else due[0]


def _delivery(message: StoredMessage, queue: str = "") -> Delivery:
    return Delivery(
        queue=queue,
        body=message.body,
        routing_key=message.routing_key,
        message_id=message.message_id,
        content_type=message.content_type,
        headers=message.headers,
    )
