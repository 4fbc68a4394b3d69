"""One connection's round of a pipelined stream (:mod:`delayq.sync._pipeline`), on pika's
SelectConnection: the apply marker checked, each exchange checked before its first
publish, up to ``window`` messages (and ``max_bytes``) unconfirmed, each confirm, return
or nack settled by delivery tag (:mod:`delayq.sync._settling`). What a lost connection
left unconfirmed is the next round's to send again.

A failure of delayq's own on one message settles that message alone: encoding it
(:class:`~delayq.errors.UnsendableMessage`; nothing of it was written, the connection goes
on), or writing it (the connection is dropped, its state unknown: the reconnect path; a
message whose write raises on a second connection too is settled as unsendable). An
aborted source has the connection torn down at once.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pika

from delayq.errors import (
    AccessRefused,
    HeaderFrameTooLarge,
    PublishError,
    PublishRejected,
    TopologyMissing,
)
from delayq.links import Settle
from delayq.message import outcomes
from delayq.message.carried import carried_frames
from delayq.message.envelope import OutgoingMessage
from delayq.message.frames import publish_frames
from delayq.message.inflight import size_of
from delayq.message.limits import FRAME_MAX
from delayq.sync._connection import coalesce_writes, frames_writer
from delayq.sync._errors import ConnectionAbandoned, closed_by_broker, connection_lost, is_missing
from delayq.sync._sending import Source, check_header_frame, pika_properties
from delayq.sync._settling import Settling
from delayq.topology.marker import Gate

__all__ = ["CONFIRM_IDLE_TIMEOUT_S", "Round"]

log = logging.getLogger("delayq.publisher")

CONFIRM_IDLE_TIMEOUT_S = 60.0
"""A round with messages unconfirmed and no confirm for this long is abandoned."""

_Encoded = tuple[bytes | None, pika.BasicProperties | None, int]
"""A message ready to go out: delayq's frames (or ``None``: pika's ``basic_publish``
with the properties), and its size in the in-flight bound."""


class Round(Settling):
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
        self.write: Callable[[bytes], None] | None = None
        """Sends frames encoded by delayq on the channel (:func:`frames_writer`); ``None``:
        pika's ``basic_publish`` (a pika without the internals, other properties)."""
        self.frame_max_now = frame_max
        """The ``frame_max`` the connection negotiated."""
        self.connection: pika.SelectConnection | None = None
        self.dropping = self.torn_down = False
        """Its connection is being dropped (closed; torn down, for an aborted source):
        nothing more is written on it."""
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
        if self.source.aborted:
            self._drop(None)
            return
        coalesce_writes(connection)
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
        self.write = None if self.properties is not pika_properties else frames_writer(channel)
        self.frame_max_now = channel.connection.params.frame_max
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
        if self.source.aborted:
            self._drop(None)
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

    def _drop(self, error: BaseException | None) -> None:
        """Give up this round's connection: closed after a write that raised (``error``,
        what it left unconfirmed goes to the next round), torn down at once when the
        source is aborted (nobody waits for its confirms; a blocked broker would not
        even read a close)."""
        connection = self.connection
        assert connection is not None
        if error is not None:
            self.dropping = True
            self.lost = self.lost or error
            self._finish()
            return
        if self.torn_down:
            return
        self.dropping = self.torn_down = True
        terminate = getattr(connection, "_terminate_stream", None)  # pika's own teardown
        if connection.is_closed:
            connection.ioloop.stop()
        elif callable(terminate):
            terminate(ConnectionAbandoned("the stream was abandoned"))
        else:
            self._finish()

    # publishing ---------------------------------------------------------------

    def _fill(self, _frame: Any = None) -> None:
        if self.dropping:
            return
        if self.source.aborted:
            self._drop(None)
            return
        channel = self.channel
        while len(self.outstanding) < self.window and self._bytes_free():
            item = self.source.next()
            if item is None:
                break
            msg = item[1]
            if msg.exchange not in self.checked:
                self._check_exchange(item)
                return
            encoded = self._encode(item)
            if encoded is None:
                continue  # settled: not sent, the rest goes on
            frames, properties, size = encoded
            tag = self.next_tag
            self.outstanding[tag] = item
            self.outstanding_bytes += size
            self.next_tag += 1
            try:
                if frames is not None:
                    assert self.write is not None
                    self.write(frames)
                else:
                    channel.basic_publish(
                        msg.exchange, msg.routing_key, msg.body, properties, mandatory=True
                    )
            except Exception as exc:
                if not (channel.is_open and self.connection and self.connection.is_open):
                    raise  # the channel or connection is going: the round is lost
                self._write_failed(tag, exc)
                return
        if self.source.done and not self.outstanding:
            self._finish()

    def _encode(self, item: tuple[int, OutgoingMessage]) -> _Encoded | None:
        """``item``'s frames, or ``None`` once it is settled: delayq failed on it (its own
        fault, not the connection's: nothing of it was written)."""
        index, msg = item
        properties: pika.BasicProperties | None = None
        frames: bytes | None = None
        try:
            if self.write is None:
                pass
            elif not msg.properties:  # delayq's own encoder (message/frames.py)
                frames = publish_frames(msg, self.channel.channel_number, self.frame_max_now)
            else:  # an intake's carried properties: as pika writes them, or pika
                frames = carried_frames(msg, self.channel.channel_number, self.frame_max_now)
            if frames is None:
                properties = self.properties(msg)
                check_header_frame(msg, properties, self.connection, self.frame_max)
            return frames, properties, size_of(msg)
        except HeaderFrameTooLarge as exc:  # not sent; the rest goes on
            error: PublishError = exc
        except Exception as exc:
            log.exception("delayq failed encoding message %r; it is not sent", msg.message_id)
            error = outcomes.unsendable(msg, exc, "encoding")
        self.settled += 1
        self._report(index, msg, error)
        return None

    def _bytes_free(self) -> bool:
        """Whether another message may go out under the byte bound (one always may when
        nothing is outstanding: the bound slows a stream, it never stops one)."""
        return (
            self.max_bytes is None
            or not self.outstanding
            or self.outstanding_bytes < self.max_bytes
        )
