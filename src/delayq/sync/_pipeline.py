"""Pipelined confirms for the sync adapter, on pika's SelectConnection.

pika's BlockingChannel waits for each confirm before the next publish (about
1,600 msg/s here). For a batch, delayq runs a SelectConnection's I/O loop in the
calling thread, keeps up to ``window`` messages unconfirmed, and re-sends what
was not confirmed on a fresh connection when one is lost.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pika
from pika.spec import Basic

from delayq.errors import (
    AccessRefused,
    ConnectionFailed,
    HeaderFrameTooLarge,
    PublishBatchError,
    PublishError,
    PublishRejected,
    TopologyMissing,
)
from delayq.links import Settle
from delayq.message import outcomes
from delayq.message.envelope import OutgoingMessage
from delayq.message.inflight import size_of
from delayq.message.limits import FRAME_MAX
from delayq.retrying import Reconnecting, pause_s
from delayq.sync._errors import closed_by_broker, connection_lost, is_missing
from delayq.sync._sending import Source, check_header_frame
from delayq.topology.marker import Gate

__all__ = ["publish_pipelined", "send_pipelined"]

log = logging.getLogger("delayq.publisher")

CONFIRM_IDLE_TIMEOUT_S = 60.0
"""A round with messages unconfirmed and no confirm for this long is abandoned."""


class _Round:
    """One connection's worth of publishing; what it could not finish goes to the next."""

    def __init__(
        self,
        params: pika.ConnectionParameters,
        source: Source,
        window: int,
        properties: Callable[[OutgoingMessage], pika.BasicProperties],
        settle: Settle,
        gate: Gate | None = None,
        max_bytes: int | None = None,
        frame_max: int = FRAME_MAX,
    ) -> None:
        self.params = params
        self.frame_max = frame_max
        self.max_bytes = max_bytes
        self.outstanding_bytes = 0
        self.gate = gate
        self.gating = False  # the passive declare of the apply marker is under way
        self.source = source
        self.window = window
        self.properties = properties
        self.settle = settle
        # tag -> (stream index, message), in delivery-tag order
        self.outstanding: OrderedDict[int, tuple[int, OutgoingMessage]] = OrderedDict()
        self.returned: set[int] = set()
        self.settled = 0
        self.next_tag = 1
        self.opened = False
        self.fatal: BaseException | None = None
        self.lost: BaseException | None = None
        self.settle_error: BaseException | None = None
        self.channel: Any = None
        self.connection: pika.SelectConnection | None = None
        self.last_progress = time.monotonic()
        # A publish to a missing exchange closes the channel and leaves the fate of
        # every in-flight message unknown, so each exchange is checked before its
        # first message of the round goes out.
        self.checked: set[str] = set()

    def run(self) -> None:
        try:
            self.connection = pika.SelectConnection(
                self.params,
                on_open_callback=self._on_open,
                on_open_error_callback=self._on_open_error,
                on_close_callback=self._on_closed,
            )
            self.connection.ioloop.start()
        except Exception as exc:
            if exc is self.settle_error:
                self._abandon()
                raise  # the caller's own callback failed: not ours to hide
            # pika raised out of its I/O loop (a publish on a channel or connection
            # closing under it): the round is lost like a dropped connection, and
            # what it left unconfirmed goes to the next one.
            self.lost = self.lost or exc
            self._abandon()

    def _abandon(self) -> None:
        """Close this round's connection after its I/O loop ended abnormally."""
        connection = self.connection
        if connection is None or connection.is_closed:
            return
        try:
            if connection.is_open:
                connection.close()
            connection.ioloop.call_later(5.0, connection.ioloop.stop)
            connection.ioloop.start()  # until _on_closed stops it (or 5 s)
        except Exception as exc:
            if exc is self.settle_error:
                raise
            # A connection already broken: nothing more to close.
            log.debug("closing an abandoned batch connection failed: %r", exc)

    # connection and channel ---------------------------------------------------

    def _on_open(self, connection: pika.SelectConnection) -> None:
        self.opened = True
        connection.channel(on_open_callback=self._on_channel)
        self._watchdog()

    def _on_open_error(self, _conn: Any, error: BaseException | str) -> None:
        self.lost = connection_lost(error)
        assert self.connection is not None
        self.connection.ioloop.stop()

    def _on_closed(self, _conn: Any, reason: BaseException) -> None:
        self.source.attach(None)
        if self.outstanding or not self.source.done:
            self.lost = self.lost or reason
        assert self.connection is not None
        self.connection.ioloop.stop()

    def _on_channel(self, channel: Any) -> None:
        self.channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._pass_gate)

    def _pass_gate(self, _frame: Any) -> None:
        """Every connection checks the apply marker before its first publish."""
        if self.gate is None:
            self._attach()
            return

        def passed(_frame: Any) -> None:
            self.gating = False
            self._attach()

        self.gating = True
        self.channel.exchange_declare(self.gate.marker, passive=True, callback=passed)

    def _attach(self) -> None:
        """Let a live source wake this round from another thread, then fill."""
        assert self.connection is not None
        ioloop, channel = self.connection.ioloop, self.channel

        def fill() -> None:
            if channel.is_open:
                self._fill()

        self.source.attach(lambda: ioloop.add_callback_threadsafe(fill))
        self._fill()

    def _on_channel_closed(self, _channel: Any, reason: BaseException) -> None:
        self.source.attach(None)
        error = closed_by_broker(reason)
        if error is not None:
            if self.gating and self.gate is not None and is_missing(reason):
                self.fatal = self.gate.refusal()
            elif isinstance(error, (TopologyMissing, AccessRefused)):
                self.fatal = error
            else:
                self.fatal = PublishRejected(str(error))
        self._finish()

    def _check_exchange(self, item: tuple[int, OutgoingMessage]) -> None:
        name = item[1].exchange
        self.source.push_front([item])

        def checked(_frame: Any) -> None:
            self.checked.add(name)
            self._fill()

        self.channel.exchange_declare(name, passive=True, callback=checked)

    def _watchdog(self) -> None:
        assert self.connection is not None
        if self.connection.is_closed:
            return
        if self.outstanding and time.monotonic() - self.last_progress > CONFIRM_IDLE_TIMEOUT_S:
            self.lost = TimeoutError(f"no confirm for {CONFIRM_IDLE_TIMEOUT_S:.0f} s")
            self._finish()
            return
        self.connection.ioloop.call_later(1.0, self._watchdog)

    def _finish(self) -> None:
        assert self.connection is not None
        if self.connection.is_open:
            self.connection.close()
        elif not self.connection.is_closing:
            self.connection.ioloop.stop()

    # publishing ---------------------------------------------------------------

    def _fill(self, _frame: Any = None) -> None:
        channel = self.channel
        while len(self.outstanding) < self.window and self._bytes_free():
            item = self.source.next()
            if item is None:
                break
            msg = item[1]
            if msg.exchange not in self.checked:
                self._check_exchange(item)
                return
            properties = self.properties(msg)
            try:
                check_header_frame(msg, properties, self.connection, self.frame_max)
            except HeaderFrameTooLarge as exc:  # not sent; the rest goes on
                self.settled += 1
                self._report(item[0], msg, exc)
                continue
            self.outstanding[self.next_tag] = item
            self.outstanding_bytes += size_of(msg)
            self.next_tag += 1
            channel.basic_publish(
                msg.exchange, msg.routing_key, msg.body, properties, mandatory=True
            )
        if self.source.done and not self.outstanding:
            self._finish()

    def _bytes_free(self) -> bool:
        """Whether another message may go out under the byte bound (one always may when
        nothing is outstanding: the bound slows a stream, it never stops one)."""
        return (
            self.max_bytes is None
            or not self.outstanding
            or self.outstanding_bytes < self.max_bytes
        )

    def _on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        # Returns come before the confirm of the same message, in publish order. The id
        # alone is not enough: two messages of one id may be in flight, one routable.
        for index, msg in self.outstanding.values():  # in delivery-tag order
            if (
                index not in self.returned
                and msg.message_id == properties.message_id
                and msg.exchange == method.exchange
                and msg.routing_key == method.routing_key
            ):
                self.returned.add(index)
                return

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag = method.delivery_tag
        acked = isinstance(method, Basic.Ack)
        if method.multiple:
            while self.outstanding and next(iter(self.outstanding)) <= tag:
                self._settle(self.outstanding.popitem(last=False)[1], acked)
        else:
            item = self.outstanding.pop(tag, None)
            if item is not None:
                self._settle(item, acked)
        self.last_progress = time.monotonic()
        self._fill()

    def _settle(self, item: tuple[int, OutgoingMessage], acked: bool) -> None:
        index, msg = item
        self.settled += 1
        self.outstanding_bytes -= size_of(msg)
        if index in self.returned:
            self.returned.discard(index)
            error: PublishError | None = outcomes.unroutable(msg)
        else:
            error = None if acked else outcomes.rejected(msg)
        self._report(index, msg, error)

    def _report(self, index: int, msg: OutgoingMessage, error: PublishError | None) -> None:
        try:
            self.settle(index, msg, error)
        except BaseException as exc:
            self.settle_error = exc
            raise


def send_pipelined(
    hosts: Sequence[pika.ConnectionParameters],
    messages: Iterable[OutgoingMessage] | Source,
    *,
    settle: Settle,
    window: int,
    properties: Callable[[OutgoingMessage], pika.BasicProperties],
    attempts: int,
    backoff_s: float,
    url_for_errors: str,
    explain: Callable[[BaseException], str | None] = lambda _exc: None,
    gate: Gate | None = None,
    max_bytes: int | None = None,
    reconnecting: Reconnecting | None = None,
    frame_max: int = FRAME_MAX,
) -> None:
    """Stream ``messages`` with up to ``window`` unconfirmed; ``settle`` hears each fate once.

    ``max_bytes`` bounds what is unconfirmed in bytes too (body plus an allowance per
    message: :func:`delayq.message.inflight.size_of`).

    ``messages`` is pulled lazily (a generator of millions is fine; a
    :class:`~delayq.sync._sending.Source` may say "nothing now" and wake the round). A lost
    connection costs an attempt only when its round confirmed nothing, so a long
    stream survives several drops; what was in flight is sent again (same
    message ids: idempotent consumers skip the duplicates). Once a connection has
    been up (``reconnecting.up``), the rounds go on until nothing was confirmed for
    ``reconnecting.within_s`` seconds (a broker restart is ridden through); before,
    ``attempts`` rounds (:class:`delayq.retrying.Reconnecting`). When they are
    spent, every message not yet settled is settled: ``PublishUnconfirmed`` if it
    was written to a connection (its fate unknown), ``PublishNotSent`` if never; if
    nothing was ever written to a socket, :class:`~delayq.errors.ConnectionFailed`
    is raised instead. ``explain`` names a failure that no retry can mend (TLS):
    nothing sent yet, it raises at once. Each round after a lost one goes to the
    next of ``hosts`` (the nodes of a cluster); an attempt is a pass over all of
    them. :class:`~delayq.errors.TopologyMissing` and
    :class:`~delayq.errors.AccessRefused` raise at once; so does
    :class:`~delayq.errors.TopologyNotApplied` when a round's connection finds no
    apply marker of ``gate`` (checked before its first publish).
    """
    source = messages if isinstance(messages, Source) else Source(enumerate(messages))
    if reconnecting is None:
        reconnecting = Reconnecting(attempts, backoff_s, None)
    quiet_since = time.monotonic()
    barren_rounds = 0
    last: BaseException | None = None
    handed_over = False  # did any round write a message to a socket?
    rounds = 0
    while True:
        rnd = _Round(
            hosts[rounds % len(hosts)],
            source,
            window,
            properties,
            settle,
            gate,
            max_bytes,
            frame_max,
        )
        rounds += 1
        rnd.run()
        reconnecting.up = reconnecting.up or rnd.opened
        handed_over = handed_over or rnd.next_tag > 1
        if isinstance(rnd.fatal, (TopologyMissing, AccessRefused)):
            raise rnd.fatal
        source.push_front(rnd.outstanding.values())
        if source.done:
            return
        last = rnd.fatal or rnd.lost
        reason = explain(last) if last is not None and not handed_over else None
        if reason is not None:
            raise ConnectionFailed(reason) from last
        if rnd.settled:
            barren_rounds, quiet_since = 0, time.monotonic()
        else:
            barren_rounds += 1
        if reconnecting.gives_up(barren_rounds, attempts * len(hosts), quiet_since):
            break
        if rnd.opened:
            log.warning(
                "batch connection ended (%s) with %d messages unconfirmed; sending them again",
                type(last).__name__ if last else "closed",
                len(source.again),
            )
        if barren_rounds and barren_rounds % len(hosts) == 0:  # after a pass over the hosts
            time.sleep(pause_s(barren_rounds // len(hosts), backoff_s))
    spent = reconnecting.spent(-(-barren_rounds // len(hosts)))
    if not handed_over:
        raise ConnectionFailed(
            f"cannot connect to the broker at {url_for_errors} {spent} "
            f"({type(last).__name__}); nothing of the batch was sent"
        ) from last
    written, source.again = source.again, deque()  # each was on a connection: fate unknown
    for index, msg in written:
        settle(index, msg, outcomes.unconfirmed(msg, spent, url_for_errors, last))
    for index, msg in source.drain():
        settle(index, msg, outcomes.not_sent(msg, spent, url_for_errors, last))


def publish_pipelined(
    hosts: Sequence[pika.ConnectionParameters],
    messages: Sequence[OutgoingMessage],
    *,
    window: int,
    properties: Callable[[OutgoingMessage], pika.BasicProperties],
    attempts: int,
    backoff_s: float,
    url_for_errors: str,
    explain: Callable[[BaseException], str | None] = lambda _exc: None,
    gate: Gate | None = None,
    reconnecting: Reconnecting | None = None,
    frame_max: int = FRAME_MAX,
) -> None:
    """Publish ``messages`` with up to ``window`` unconfirmed; raise for any not confirmed.

    :func:`send_pipelined` over a list, raising
    :class:`~delayq.errors.PublishBatchError` naming each failed message.
    """
    failures: dict[int, PublishError] = {}

    def settle(index: int, _msg: OutgoingMessage, error: PublishError | None) -> None:
        if error is not None:
            failures[index] = error

    send_pipelined(
        hosts,
        messages,
        settle=settle,
        window=window,
        properties=properties,
        attempts=attempts,
        backoff_s=backoff_s,
        url_for_errors=url_for_errors,
        explain=explain,
        gate=gate,
        reconnecting=reconnecting,
        frame_max=frame_max,
    )
    if failures:
        receipts = [None if i in failures else messages[i].receipt for i in range(len(messages))]
        raise PublishBatchError(receipts, failures)
