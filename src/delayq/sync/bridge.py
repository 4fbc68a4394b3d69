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
DLQ by the broker. A stop settles what is in flight first, for up to ``stop_grace``, and
only then cancels its consumer (what comes meanwhile is not sent: back in the queue); what
is still unconfirmed then is left unacked (back in the intake queue, sent again by the next
bridge under the same ids) and :meth:`Bridge.run` raises
:class:`~delayq.errors.PublishUnconfirmed` saying how many: a stuck broker (a memory
alarm, confirms that never come) cannot hold a stop. A second stop request gives up the
grace at once.

No message stops the bridge: what the relay cannot schedule it parks with the reason; a
message whose headers pika cannot read, or cannot write again (a NaN, a timestamp past
the year 9999), is rejected, and the broker dead-letters it, as it came, to the same DLQ
(reason ``rejected``). A message delayq itself fails on (a bug: planning it, encoding or
writing its forward) is parked as ``bridge-error``, with the error; if its park fails
too, it is rejected the same way. Every other message goes on.

A delay counts from when the bridge takes the message: while the bridge is down,
messages wait in the intake queue and arrive late by that much, never early.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pika

from delayq.consume.settings import RECONNECT_MAX_S, RECONNECT_MIN_S, check_prefetch
from delayq.durations import Duration
from delayq.errors import (
    ConnectionFailed,
    DelayqError,
    HeaderFrameTooLarge,
    InvalidInput,
    PublishError,
    UnsendableMessage,
)
from delayq.intake.relay import Forward, Incoming, Park, Relay
from delayq.message.envelope import OutgoingMessage
from delayq.sync._bridging import (
    IO_JOIN_S,
    PROPERTIES,
    STOP_GRACE,
    BridgeStats,
    acknowledge,
    check_stop_grace,
    no_wake,
    pick_intake,
    unconfirmed_at_stop,
    wake_by,
)
from delayq.sync._connection import close_quietly, connect
from delayq.sync._errors import CHANNEL_CLOSED, LOST, channel_error
from delayq.sync._intake_stream import Ended, Feed, Settled, Window
from delayq.sync._sending import unwritable
from delayq.sync._shared import LiveLink
from delayq.sync._signals import stopping_on_signals
from delayq.sync._unreadable import tolerate_unreadable_headers, unreadable
from delayq.sync.publisher import Publisher
from delayq.topology.model import Topology
from delayq.urls import resolve_url

__all__ = ["Bridge", "BridgeStats", "pick_intake"]

log = logging.getLogger("delayq.bridge")

RECONNECTABLE: tuple[type[BaseException], ...] = (*LOST, ConnectionFailed)
_PASSED_ON: tuple[type[BaseException], ...] = (*RECONNECTABLE, DelayqError)
"""What a stream may raise that is the broker's or the topology's doing."""

_POLL_S = 0.05

_NEVER_SENDABLE = (UnsendableMessage, HeaderFrameTooLarge)
"""What no retry of the same forward mends: parked instead (or rejected to the DLQ when
the park cannot be sent either), never put back to cycle to the delivery limit."""
"""How often the consuming thread looks at the stop flag (deliveries and confirms wake
it at once)."""


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
        stop_grace: Duration = STOP_GRACE,
    ) -> None:
        prefetch = check_prefetch(prefetch)  # AMQP's is 16 bits: refused before connecting
        self.stop_grace_s = check_stop_grace(stop_grace)
        """How long a stop waits for the confirms of what is in flight (see the module)."""
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
        self._hurry = threading.Event()
        self._after = ""
        """What ended the last stop with deliveries unconfirmed (see _abandon)."""
        self.started = threading.Event()
        self.stats = BridgeStats()
        # One consuming channel's state (see _serve).
        self._channel: Any = None
        self._window = Window()
        self._feeds: list[tuple[Feed, threading.Thread]] = []
        """Each stream not yet over, the newest last (the one taking deliveries)."""
        self._wake: Callable[[], None] = no_wake

    def request_stop(self, *, now: bool = False) -> None:
        """Stop taking deliveries, settle those in flight (for up to ``stop_grace``),
        return; ``now``: without waiting for them (safe from any thread or a signal
        handler). Deliveries not settled are left unacked: back in the intake queue."""
        if now:
            self._hurry.set()
        self._stop.set()

    def _signalled(self) -> None:
        """SIGTERM or SIGINT: a stop; a second one gives up the grace."""
        self.request_stop(now=self._stop.is_set())

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Bridge until SIGTERM or SIGINT (or :meth:`request_stop`). A lost connection
        is reopened (back-off up to ``RECONNECT_MAX_S``); a missing intake queue, a
        topology not applied or a refused permission raise at once.

        :raises PublishUnconfirmed: the stop left deliveries unconfirmed after its
            grace (they are back in the intake queue; nothing confirmed is lost).
        """
        abandoned = self.stats.abandoned
        with stopping_on_signals(self._signalled, install=install_signal_handlers):
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
        left = self.stats.abandoned - abandoned
        if left:
            raise unconfirmed_at_stop(self.queue, left, self._after)

    def _run(self) -> None:
        self._publisher.connect()  # the topology applied (its marker), or raise
        # Closed until a failed stream needs it (_send_alone reconnects): left open and
        # idle, nobody would answer its heartbeats and the broker would drop it.
        self._publisher.close()
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
        after = "its connection lost while stopping"  # what ended a stop with some in flight
        connection = connect(self._url, name=f"delayq-bridge {self.queue}")
        tolerate_unreadable_headers(connection)
        self._window = Window()
        self._wake = wake_by(connection)
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
            # Cancelled once those in flight are acked: a quorum queue's channel holds
            # acks back while 32 of its commands are unapplied; its cancel sends them
            # first, but one after it can be dropped with the channel (a duplicate).
            log.info(
                "bridge of %s stopping: up to %g s for the confirms of %d in flight (a "
                "second stop request: none)",
                self.queue,
                self.stop_grace_s,
                len(self._window),
            )
            give_up_at = time.monotonic() + self.stop_grace_s
            while self._window and not self._hurry.is_set() and time.monotonic() < give_up_at:
                connection.process_data_events(time_limit=_POLL_S)  # each in flight settles
                self._settle()
            after = "a second stop request" if self._hurry.is_set() else "its stop grace"
            channel.basic_cancel(consumer)  # what pika holds back goes back
        finally:
            # Unacked deliveries go back to the queue with the channel; the stream
            # sends no more of them (the ones in flight may still arrive: duplicates).
            if self._stop.is_set() and self._window:
                self._abandon(after)
            self._let_go()
            self._channel = None
            close_quietly(connection)

    def _abandon(self, after: str) -> None:
        """A stop leaves what is in the window unconfirmed: counted, said (run raises)."""
        self.stats.abandoned += len(self._window)
        self._after = after.replace("its stop grace", f"its {self.stop_grace_s:g} s stop grace")
        log.error(
            "bridge of %s stopping with %d deliveries unconfirmed after %s: left unacked, "
            "back in the queue",
            self.queue,
            len(self._window),
            self._after,
        )

    def _let_go(self) -> None:
        """End each stream: an idle one closes its connection; one with deliveries in
        flight (their channel is going: nobody will ack them) drops it at once. Waits
        :data:`IO_JOIN_S` at most for their I/O threads (one stuck in a write is left)."""
        for feed, _thread in self._feeds:
            if self._window:
                feed.abort()
            else:
                feed.end(drop=True)
        until = time.monotonic() + IO_JOIN_S
        for feed, thread in self._feeds:
            thread.join(max(0.0, until - time.monotonic()))
            if thread.is_alive():
                feed.abort()
                log.warning(
                    "bridge of %s: its stream's I/O thread did not end in %g s; left to end "
                    "on its own",
                    self.queue,
                    IO_JOIN_S,
                )
        self._feeds = []

    def _arrived(self, channel: Any, method: Any, props: pika.BasicProperties, body: bytes) -> None:
        tag = method.delivery_tag
        if self._stop.is_set():
            return  # not sent: back with the channel (past every tag a stop acks)
        try:
            planned = self._take(tag, method, props, body)
        except Exception as exc:  # delayq's own failure on this delivery: not the bridge's end
            log.exception("bridge of %s failed on delivery %d", self.queue, tag)
            self._reject(tag, f"delivery {tag}", f"{type(exc).__name__}: {exc}")
            return
        if planned is not None:
            self._window.add(tag, *planned)
            self._put(tag, planned[0].message)

    def _take(
        self, tag: int, method: Any, props: pika.BasicProperties, body: bytes
    ) -> tuple[Forward | Park, Incoming] | None:
        """The delivery's plan, or ``None``: rejected, pika cannot read or write it."""
        why = unreadable(props)
        if why is not None:
            self._reject(tag, f"delivery {tag}", f"its headers cannot be read ({why})")
            return None
        properties = {name: getattr(props, name) for name in PROPERTIES}
        incoming = Incoming(method.routing_key or "", body, properties)
        plan = self.relay.plan(incoming)  # never raises
        why = unwritable(plan.message)
        if why is not None and isinstance(plan, Forward):
            plan = self.relay.park(incoming, why)
            why = unwritable(plan.message)
        if why is not None:
            self._reject(tag, plan.message.message_id, f"its headers cannot be sent ({why})")
            return None
        return plan, incoming

    def _put(self, tag: int, msg: OutgoingMessage) -> None:
        feed = self._feeds[-1][0] if self._feeds else None
        while feed is None or not feed.put(tag, msg):
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
            "rejected %s of %s to %s, as it came: %s",
            name,
            self.queue,
            self.relay.dlq,
            why,
        )

    def _settle(self) -> None:
        """Ack or nack what the streams settled; handle the end of each that is over."""
        over: list[Ended] = []
        for feed, thread in list(self._feeds):
            outcomes, ended = feed.take()
            for tag, error in outcomes:
                if isinstance(error, _NEVER_SENDABLE):
                    self._failed(tag, error)
                else:
                    self._window.settled(tag, error)
            if ended is not None:
                thread.join()  # it has finished, or is about to
                self._feeds.remove((feed, thread))
                over.append(ended)
        refused = self._acked(self._window.ready())  # acked first: a raise below loses none
        for ended in over:
            self._ended(ended)
        if over:
            refused = self._acked(self._window.ready()) or refused
        if refused:
            self._stop.wait(min(RECONNECT_MAX_S, RECONNECT_MIN_S * 2))  # the broker is not taking

    def _acked(self, done: list[Settled]) -> bool:
        """Ack and nack ``done``; whether the broker refused any."""
        return acknowledge(self._channel, done, self.stats, self.queue, self.relay.dlq)

    def _failed(self, tag: int, error: UnsendableMessage | HeaderFrameTooLarge) -> None:
        """delayq could not send ``tag``'s message (nor will it ever: its own failure, or
        headers past the negotiated frame with delayq's envelope): a forward is parked as
        ``bridge-error`` in its place; a park (or a forward that cannot be parked) is
        rejected to the broker's dead-lettering, as it came."""
        try:
            plan = self._window.plan(tag)
        except KeyError:
            return  # settled already
        incoming = self._window.incoming(tag)
        log.error("bridge of %s: %s", self.queue, error)
        if isinstance(plan, Forward) and incoming is not None:
            park = self.relay.failed(incoming, error)
            if unwritable(park.message) is None:
                self._window.replan(tag, park)
                self._put(tag, park.message)
                return
        self._window.discard(tag)
        self._reject(tag, plan.message.message_id, str(error))

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
        self._publisher.close()

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
