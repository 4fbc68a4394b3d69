"""The bridge: plugin-style messages from an intake queue into delayq's tiers.

>>> bridge = Bridge(url, topology, "orders.delayed")        # doctest: +SKIP
>>> bridge.run()             # until SIGTERM/SIGINT (``delayq bridge`` runs this)  # doctest: +SKIP

One connection consumes the intake queue (``<ns>.intake.<exchange>``, prefetch
``prefetch``); each delivery is planned by :class:`~delayq.intake.relay.Relay` (pure) as
it arrives and streamed through the :class:`~delayq.sync.Publisher`'s link, up to
``prefetch`` unconfirmed (:mod:`delayq.sync._intake_stream`). A delivery is acked only
once the broker confirmed where it went, its tier or the intake's DLQ (the confirmed
ones in delivery order, with one ``multiple`` ack), so nothing is lost: a bridge that
dies leaves the unacked messages in the intake queue, and the next one sends them again
under the same message ids (duplicates an idempotent consumer skips). A message the
broker did not take (a full tier, say) goes back to the intake queue after a pause; one
that comes back more than the intake's ``delivery_limit`` times is dead-lettered to its
DLQ by the broker. A stop settles what is in flight first.

No message stops the bridge: what the relay cannot schedule it parks with the reason; a
message whose headers pika cannot read, or cannot write again (a NaN, a timestamp past
the year 9999), is rejected, and the broker dead-letters it, as it came, to the same DLQ
(reason ``rejected``). Every other message goes on.

A delay counts from when the bridge takes the message: while the bridge is down,
messages wait in the intake queue and arrive late by that much, never early.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pika

from delayq.consume.settings import RECONNECT_MAX_S, RECONNECT_MIN_S, check_prefetch
from delayq.errors import ConnectionFailed, DelayqError, InvalidInput, PublishError
from delayq.intake.relay import Forward, Incoming, Park, Relay
from delayq.sync._connection import close_quietly, connect
from delayq.sync._errors import CHANNEL_CLOSED, CONNECTION_ERRORS, LOST, channel_error
from delayq.sync._intake_stream import Ended, Feed, Settled, Window, coalesce
from delayq.sync._sending import unwritable
from delayq.sync._shared import LiveLink
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
"""What a stream may raise that is the broker's or the topology's doing."""

_POLL_S = 0.05
"""How often the consuming thread looks at the stop flag (deliveries and confirms wake
it at once)."""

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
        prefetch = check_prefetch(prefetch)  # AMQP's is 16 bits: refused before connecting
        self._url = resolve_url(url)
        self.topology = topology
        self.intake = pick_intake(topology, intake)
        self.relay = Relay(topology, self.intake)
        self.queue = self.relay.queue
        self._prefetch = prefetch
        self._publisher = publisher or Publisher(self._url, topology)
        link = self._publisher.link
        if not isinstance(link, LiveLink):
            raise InvalidInput(f"the bridge streams through pika's link, not {link!r}")
        self._link: LiveLink = link
        self._stop = threading.Event()
        self.started = threading.Event()
        self.stats = BridgeStats()
        # One consuming channel's state (see _serve).
        self._channel: Any = None
        self._window = Window()
        self._feeds: list[tuple[Feed, threading.Thread]] = []
        """Each stream not yet over, the newest last (the one taking deliveries)."""
        self._wake: Callable[[], None] = _nothing

    def request_stop(self) -> None:
        """Stop taking deliveries, settle those in flight, return (safe from any thread
        or a signal handler)."""
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
        self._window = Window()
        self._wake = partial(_wake, connection)
        try:
            channel = self._channel = connection.channel()
            channel.basic_qos(prefetch_count=self._prefetch)
            try:
                consumer = channel.basic_consume(self.queue, self._arrived)
            except CHANNEL_CLOSED as exc:
                raise channel_error(exc) from exc  # a missing queue: TopologyMissing
            self.started.set()
            log.info("bridging %s (prefetch %d)", self.queue, self._prefetch)
            while not self._stop.is_set():
                connection.process_data_events(time_limit=_POLL_S)
                self._settle()
            channel.basic_cancel(consumer)  # what the client holds goes back
            while self._window:  # each one in flight settles (a lost broker: in time)
                connection.process_data_events(time_limit=_POLL_S)
                self._settle()
        finally:
            # Unacked deliveries go back to the queue with the channel; the stream
            # sends no more of them (the ones in flight may still arrive: duplicates).
            for feed, _thread in self._feeds:
                feed.end(drop=True)
            for _feed, thread in self._feeds:
                thread.join()
            self._feeds = []
            self._channel = None
            close_quietly(connection)

    def _arrived(self, channel: Any, method: Any, props: pika.BasicProperties, body: bytes) -> None:
        tag = method.delivery_tag
        why = unreadable(props)
        if why is not None:
            self._reject(tag, f"delivery {tag}", why)
            return
        properties = {name: getattr(props, name) for name in _PROPERTIES}
        plan = self._planned(tag, Incoming(method.routing_key or "", body, properties))
        if plan is None:
            return
        self._window.add(tag, plan)
        feed = self._feeds[-1][0] if self._feeds else None
        while feed is None or not feed.put(tag, plan.message):
            feed = self._start_feed()  # the last one gave up: _settle hears its end

    def _start_feed(self) -> Feed:
        feed = Feed(self._wake)
        thread = threading.Thread(
            target=self._stream, args=(feed,), name=f"delayq-bridge-io {self.queue}", daemon=True
        )
        self._feeds.append((feed, thread))
        thread.start()
        return feed

    def _stream(self, feed: Feed) -> None:
        """The I/O thread: one pipelined stream, until the feed ends or it gives up."""
        failed: BaseException | None = None
        try:
            self._link.send_live(feed, feed.settle, self._prefetch)
        except BaseException as exc:  # the consuming thread decides (see _ended)
            failed = exc
        feed.finish(failed)

    def _reject(self, tag: int, name: str, why: str) -> None:
        """Leave the delivery to the broker's dead-lettering: into the intake's DLQ, intact."""
        self._channel.basic_reject(tag, requeue=False)
        self.stats.rejected += 1
        log.warning(
            "rejected %s of %s to %s, as it came: its headers cannot be read or sent again "
            "(%s)",
            name,
            self.queue,
            self.relay.dlq,
            why,
        )

    def _planned(self, tag: int, incoming: Incoming) -> Forward | Park | None:
        """The delivery's plan, or ``None``: rejected, pika cannot write it."""
        try:
            plan = self.relay.plan(incoming)
        except Exception as exc:  # the relay's own fallback failed: the broker's
            self._reject(tag, f"delivery {tag}", f"{type(exc).__name__}: {exc}")
            return None
        why = unwritable(plan.message)
        if why is not None and isinstance(plan, Forward):
            plan = self.relay.park(incoming, why)
            why = unwritable(plan.message)
        if why is not None:
            self._reject(tag, plan.message.message_id, why)
            return None
        return plan

    def _settle(self) -> None:
        """Ack or nack what the streams settled; handle the end of each that is over."""
        over: list[Ended] = []
        for feed, thread in list(self._feeds):
            outcomes, ended = feed.take()
            for tag, error in outcomes:
                self._window.settled(tag, error)
            if ended is not None:
                thread.join()  # it has finished, or is about to
                self._feeds.remove((feed, thread))
                over.append(ended)
        refused = self._apply(self._window.ready())  # acked first: a raise below loses none
        for ended in over:
            self._ended(ended)
        if over:
            refused = self._apply(self._window.ready()) or refused
        if refused:
            self._stop.wait(min(RECONNECT_MAX_S, RECONNECT_MIN_S * 2))  # the broker is not taking

    def _ended(self, ended: Ended) -> None:
        """A stream is over with ``ended.left`` unsettled: they go back, or it raises."""
        error = ended.error
        if error is None or isinstance(error, ConnectionFailed):  # nothing sent: all back
            for tag in ended.left:
                self._window.settled(tag, error or ConnectionFailed("the stream gave up"))
            return
        if isinstance(error, _PASSED_ON):
            raise error  # the channel's close puts every unacked delivery back
        log.error(
            "bridge of %s failed streaming; sending its %d in flight one at a time",
            self.queue,
            len(ended.left),
            exc_info=error,
        )
        for tag in ended.left:  # not the broker's doing: find the message, go on
            self._send_alone(tag)

    def _send_alone(self, tag: int) -> None:
        msg = self._window.plan(tag).message
        try:
            self._publisher.send(msg)
        except PublishError as exc:
            self._window.settled(tag, exc)
        except _PASSED_ON:
            raise
        except Exception as exc:
            log.exception("bridge of %s failed sending %s", self.queue, msg.message_id)
            self._window.discard(tag)
            self._reject(tag, msg.message_id, repr(exc))
        else:
            self._window.settled(tag, None)

    def _apply(self, done: list[Settled]) -> bool:
        """Ack and nack ``done``; whether the broker refused any."""
        if not done:
            return False
        for step, tag in coalesce(done):
            if step == "ack":
                self._channel.basic_ack(tag, multiple=True)
            else:
                self._channel.basic_reject(tag, requeue=True)  # counted on 4.3 too
        refused = False
        for item in done:
            plan = item.plan
            if item.error is not None:
                refused = True
                log.warning(
                    "%s of %s not taken by the broker (%s): back to the intake queue",
                    plan.message.message_id,
                    self.queue,
                    item.error,
                )
                self.stats.returned += 1
            elif isinstance(plan, Park):
                self.stats.parked += 1
                log.warning(
                    "parked %s in %s: %s", plan.message.message_id, self.relay.dlq, plan.reason
                )
            else:
                self.stats.forwarded += 1
        return refused


def _nothing() -> None:
    """No consuming connection to wake."""


def _wake(connection: pika.BlockingConnection) -> None:
    """Wake the consuming thread from the I/O thread (a closed connection: nobody to)."""
    try:
        connection.add_callback_threadsafe(_nothing)
    except CONNECTION_ERRORS:
        pass  # closing: the consuming thread is leaving, or reconnecting
