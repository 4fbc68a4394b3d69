"""The bridge: plugin-style messages from an intake queue into delayq's tiers.

>>> bridge = Bridge(url, topology, "orders.delayed")        # doctest: +SKIP
>>> bridge.run()             # until SIGTERM/SIGINT (``delayq bridge`` runs this)  # doctest: +SKIP

One connection consumes the intake queue (``<ns>.intake.<exchange>``, prefetch
``prefetch``); each batch it receives is planned by :class:`~delayq.intake.relay.Relay`
(pure) and sent through a :class:`~delayq.sync.Publisher` with pipelined confirms. A
delivery is acked only once the broker confirmed where it went, its tier or the
intake's DLQ, so nothing is lost: a bridge that dies leaves the unacked messages in
the intake queue, and the next one sends them again under the same message ids
(duplicates an idempotent consumer skips). A message the broker did not take (a full
tier, say) goes back to the intake queue after a pause; one that comes back more
than the intake's ``delivery_limit`` times is dead-lettered to its DLQ by the broker.

No message stops the bridge: what the relay cannot schedule it parks with the reason; a
message whose headers pika cannot read, or cannot write again (a NaN, a timestamp past
the year 9999), is rejected, and the broker dead-letters it, as it came, to the same DLQ
(reason ``rejected``). Every other message of the batch goes on.

A delay counts from when the bridge takes the message: while the bridge is down,
messages wait in the intake queue and arrive late by that much, never early.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import pika

from delayq.consume.settings import RECONNECT_MAX_S, RECONNECT_MIN_S
from delayq.errors import ConnectionFailed, DelayqError, InvalidInput, PublishError
from delayq.intake.relay import Forward, Incoming, Park, Relay
from delayq.message.envelope import OutgoingMessage
from delayq.sync._connection import close_quietly, connect
from delayq.sync._errors import CHANNEL_CLOSED, LOST, channel_error
from delayq.sync._sending import pika_properties
from delayq.sync._signals import stopping_on_signals
from delayq.sync._unreadable import tolerate_unreadable_headers, unreadable
from delayq.sync.publisher import Publisher
from delayq.topology.intakes import Intake
from delayq.topology.model import Topology
from delayq.urls import resolve_url

__all__ = ["Bridge", "BridgeStats"]

log = logging.getLogger("delayq.bridge")

RECONNECTABLE: tuple[type[BaseException], ...] = (*LOST, ConnectionFailed)
_PASSED_ON: tuple[type[BaseException], ...] = (*RECONNECTABLE, DelayqError)
"""What sending a batch may raise that is the broker's or the topology's doing."""

_PROPERTIES = (
    "content_type",
    "content_encoding",
    "headers",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)


@dataclass
class BridgeStats:
    """What a bridge did since it started."""

    forwarded: int = 0
    """Messages confirmed into their tier (or the cascade, or at once when due now)."""
    parked: int = 0
    """Messages confirmed into the intake's DLQ, with their reason."""
    returned: int = 0
    """Deliveries put back on the intake queue: the broker did not take their publish."""
    rejected: int = 0
    """Deliveries rejected to the intake's DLQ, as they came: headers pika cannot read or
    write again."""
    reconnects: int = 0


_INT64_MIN, _INT64_END = -(2**63), 2**63


def _unwritable(msg: OutgoingMessage) -> str | None:
    """Why pika cannot write ``msg``'s properties, or ``None``: checked only when its
    headers hold more than strings, bytes, booleans and 64-bit integers."""
    if not all(type(key) is str for key in msg.headers):
        return "a header name is not UTF-8 text"
    for value in msg.headers.values():
        if isinstance(value, (str, bytes, bool)) or value is None:
            continue
        if isinstance(value, int) and _INT64_MIN <= value < _INT64_END:
            continue
        try:
            pika_properties(msg).encode()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None
    return None


def pick_intake(topology: Topology, name: str | None) -> Intake:
    """The intake of ``topology`` named ``name`` (the only one when ``None``)."""
    if not topology.intakes:
        raise InvalidInput(
            f"topology {topology.namespace!r} declares no intakes: add one under `intakes`"
        )
    if name is None:
        if len(topology.intakes) > 1:
            names = ", ".join(i.exchange for i in topology.intakes)
            raise InvalidInput(f"the topology has several intakes ({names}): name one")
        return topology.intakes[0]
    for intake in topology.intakes:
        if intake.exchange == name:
            return intake
    names = ", ".join(i.exchange for i in topology.intakes)
    raise InvalidInput(f"the topology has no intake {name!r} (it has: {names})")


class Bridge:
    """Schedules what plugin-style publishers send to one intake (see the module)."""

    def __init__(
        self,
        url: str | None,
        topology: Topology,
        intake: str | None = None,
        *,
        prefetch: int = 1000,
        publisher: Publisher | None = None,
    ) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise InvalidInput(f"prefetch must be an int of at least 1, got {prefetch!r}")
        self._url = resolve_url(url)
        self.topology = topology
        self.intake = pick_intake(topology, intake)
        self.relay = Relay(topology, self.intake)
        self.queue = self.relay.queue
        self._prefetch = prefetch
        self._publisher = publisher or Publisher(self._url, topology)
        self._stop = threading.Event()
        self.started = threading.Event()
        self.stats = BridgeStats()
        self._batch: list[tuple[int, Incoming]] = []

    def request_stop(self) -> None:
        """Stop after the batch in hand (safe from any thread or a signal handler)."""
        self._stop.set()

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Bridge until SIGTERM or SIGINT (or :meth:`request_stop`). A lost connection
        is reopened (back-off up to ``RECONNECT_MAX_S``); a missing intake queue, a
        topology not applied or a refused permission raise at once."""
        with stopping_on_signals(self.request_stop, install=install_signal_handlers):
            try:
                self._run()
            finally:
                self._publisher.close()
                log.info(
                    "bridge of %s stopped: %d forwarded, %d parked in %s, %d returned, "
                    "%d reconnects",
                    self.queue,
                    self.stats.forwarded,
                    self.stats.parked,
                    self.relay.dlq,
                    self.stats.returned,
                    self.stats.reconnects,
                )

    def _run(self) -> None:
        self._publisher.connect()  # the topology applied (its marker), or raise
        delay = RECONNECT_MIN_S
        while not self._stop.is_set():
            try:
                self._serve()
                return
            except RECONNECTABLE as exc:
                if not self.started.is_set():
                    raise
                log.warning("bridge of %s lost the broker (%s); reconnecting", self.queue, exc)
            self._stop.wait(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)
            self.stats.reconnects += 1

    def _serve(self) -> None:
        connection = connect(self._url, name=f"delayq-bridge {self.queue}")
        tolerate_unreadable_headers(connection)
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self._prefetch)
            try:
                channel.basic_consume(self.queue, self._arrived)
            except CHANNEL_CLOSED as exc:
                raise channel_error(exc) from exc  # a missing queue: TopologyMissing
            self.started.set()
            log.info("bridging %s (prefetch %d)", self.queue, self._prefetch)
            while not self._stop.is_set():
                connection.process_data_events(time_limit=0.05)
                if self._batch:
                    batch, self._batch = self._batch, []
                    self._send(channel, batch)
        finally:
            self._batch = []  # unacked: back to the queue with the channel
            close_quietly(connection)

    def _arrived(self, channel: Any, method: Any, props: pika.BasicProperties, body: bytes) -> None:
        why = unreadable(props)
        if why is not None:
            self._reject(channel, method.delivery_tag, f"delivery {method.delivery_tag}", why)
            return
        properties = {name: getattr(props, name) for name in _PROPERTIES}
        incoming = Incoming(method.routing_key or "", body, properties)
        self._batch.append((method.delivery_tag, incoming))

    def _reject(self, channel: Any, tag: int, name: str, why: str) -> None:
        """Leave the delivery to the broker's dead-lettering: into the intake's DLQ, intact."""
        channel.basic_reject(tag, requeue=False)
        self.stats.rejected += 1
        log.warning(
            "rejected %s of %s to %s, as it came: its headers cannot be read or sent again "
            "(%s)",
            name,
            self.queue,
            self.relay.dlq,
            why,
        )

    def _planned(self, channel: Any, batch: list[tuple[int, Incoming]]) -> list[Any]:
        """Each delivery's plan, the ones pika cannot write rejected (and left out)."""
        kept: list[tuple[tuple[int, Incoming], Forward | Park]] = []
        for tag, incoming in batch:
            try:
                plan = self.relay.plan(incoming)
            except Exception as exc:  # the relay's own fallback failed: the broker's
                self._reject(channel, tag, f"delivery {tag}", f"{type(exc).__name__}: {exc}")
                continue
            why = _unwritable(plan.message)
            if why is not None and isinstance(plan, Forward):
                plan = self.relay.park(incoming, why)
                why = _unwritable(plan.message)
            if why is not None:
                self._reject(channel, tag, plan.message.message_id, why)
                continue
            kept.append(((tag, incoming), plan))
        return kept

    def _send(self, channel: Any, batch: list[tuple[int, Incoming]]) -> None:
        kept = self._planned(channel, batch)
        if not kept:
            return
        batch = [item for item, _plan in kept]
        plans = [plan for _item, plan in kept]
        errors: dict[int, BaseException] = {}

        def settle(index: int, msg: OutgoingMessage, error: PublishError | None) -> None:
            if error is not None:
                errors[index] = error

        try:
            self._publisher.send_many(
                (plan.message for plan in plans), settle=settle, window=len(plans)
            )
        except ConnectionFailed as exc:  # nothing could be sent: all go back
            errors = dict.fromkeys(range(len(plans)), exc)
        except _PASSED_ON:
            raise
        except Exception as exc:  # not the broker's doing: find the message, go on
            log.exception("bridge of %s failed sending a batch of %d", self.queue, len(plans))
            if len(batch) == 1:
                self._reject(channel, batch[0][0], plans[0].message.message_id, repr(exc))
            else:
                for item in batch:
                    self._send(channel, [item])
            return
        if not errors:
            channel.basic_ack(batch[-1][0], multiple=True)
        for index, ((tag, _incoming), plan) in enumerate(zip(batch, plans, strict=True)):
            error = errors.get(index)
            if error is not None:
                log.warning(
                    "%s of %s not taken by the broker (%s): back to the intake queue",
                    plan.message.message_id,
                    self.queue,
                    error,
                )
                channel.basic_nack(tag, requeue=True)
                self.stats.returned += 1
                continue
            if errors:
                channel.basic_ack(tag)
            if isinstance(plan, Park):
                self.stats.parked += 1
                log.warning(
                    "parked %s in %s: %s", plan.message.message_id, self.relay.dlq, plan.reason
                )
            elif isinstance(plan, Forward):
                self.stats.forwarded += 1
        if errors:
            time.sleep(min(RECONNECT_MAX_S, RECONNECT_MIN_S * 2))  # the broker is not taking
