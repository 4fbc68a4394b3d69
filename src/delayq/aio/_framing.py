"""AMQP frames over an asyncio transport: the lower half of :mod:`delayq.aio._wire`.

:class:`Framing` cuts what the socket gives into frames and writes what the
connection sends, in order, one write per loop turn. Frames on a consuming
channel that carry a delivery (``Basic.Deliver``, its content header and body)
go to that channel's :class:`ChannelReader` as bytes, undecoded (the frame feed
reads them by hand, :mod:`delayq.aio._deliveries`); every other frame is
decoded by pamqp and handed to :meth:`Framing._dispatch`, which the connection
(:class:`~delayq.aio._wire.Wire`) implements. Heartbeats both ways; a broker
silent for two heartbeat periods is a lost connection. The transport's flow
control is surfaced: :meth:`Framing.drained` waits while its buffer is past the
high-water mark.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from pamqp import frame, heartbeat
from pamqp.exceptions import PAMQPException

from delayq.aio._deliveries import DELIVER_METHOD

__all__ = ["ChannelReader", "Framing", "WireClosed"]

_HEARTBEAT = heartbeat.Heartbeat().marshal()
_METHOD, _FRAME_END = 1, 0xCE
_CONFIRM_SIZE = 21
"""A ``Basic.Ack`` or ``Basic.Nack`` frame: 7 bytes of frame header, class and method
(4), delivery tag (8), bits (1), frame end."""
_ACK, _NACK = b"\x00\x3c\x00\x50", b"\x00\x3c\x00\x78"  # Basic (60) Ack (80), Nack (120)
_TAG = struct.Struct(">QB")


class WireClosed(Exception):
    """The connection is gone: closed by the broker (its reply code and text), or lost."""

    def __init__(self, reply_code: int, reply_text: str) -> None:
        super().__init__(f"{reply_code} {reply_text}" if reply_code else reply_text)
        self.reply_code = reply_code
        self.reply_text = reply_text


class ChannelReader(Protocol):
    """A consuming channel's end of the wire (:attr:`Wire.readers`)."""

    def content(self, kind: int, payload: bytes) -> None:
        """A ``Basic.Deliver`` method frame (``kind`` 1), a content header (2) or body (3):
        its payload. Raises :class:`ValueError` if it cannot be read."""

    def cancelled(self, consumer_tag: str) -> None:
        """The broker cancelled the consumer ``consumer_tag`` (its queue went away)."""

    def closed(self, exc: Exception) -> None:
        """The channel or the connection closed (it was taken off :attr:`Wire.readers`)."""


class Framing(asyncio.Protocol):
    """The framing of one AMQP connection; see the module's docstring."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed: Exception | None = None
        """Why the connection is gone (``None`` while open)."""
        self.readers: dict[int, ChannelReader] = {}
        """Consuming channels: their deliveries' frames go to their reader, as bytes."""
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._drained: asyncio.Future[None] | None = None  # while the transport is full
        self._read_at = self._written_at = time.monotonic()
        self._heartbeat_s = 0
        self._timer: asyncio.TimerHandle | None = None

    def _dispatch(self, channel: int, value: Any) -> None:
        """A decoded frame (a method, or a header or body not on a reader's channel)."""
        raise NotImplementedError

    def _on_lost(self, exc: WireClosed) -> None:
        """The connection is gone (called once, after the readers heard it)."""

    def _confirmed(self, tag: int, multiple: bool, acked: bool) -> None:
        """A publisher confirm (``Basic.Ack`` or ``Basic.Nack``), read without pamqp: a
        publisher reads one per message or per few, and pamqp's decoder costs about
        nine times as much. The frames stay pamqp's everywhere else."""
        raise NotImplementedError

    # Writing ------------------------------------------------------------------

    def send_frames(self, frames: bytes) -> None:
        """Queue frames already encoded (an ack): written at the end of this loop turn,
        in order with everything else. Raises :class:`WireClosed` if the connection is gone."""
        if self.closed is not None:
            raise self.closed
        self._out.append(frames)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    async def drained(self) -> None:
        """Return once the transport's buffer is below its high-water mark (at once if it is):
        a writer that waits here never buffers more than that in memory. Raises
        :class:`WireClosed` if the connection goes meanwhile."""
        waiter = self._drained
        if waiter is not None:
            await asyncio.shield(waiter)
        if self.closed is not None:
            raise self.closed

    @property
    def writable(self) -> bool:
        """Whether the transport takes writes (its buffer is below the high-water mark)."""
        return self._drained is None

    def when_writable(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the transport takes writes again, or the connection goes
        (at the next loop turn if it takes them now)."""
        waiter = self._drained
        if waiter is None:
            self.loop.call_soon(callback)
        else:
            waiter.add_done_callback(lambda _: callback())

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if out and self.transport is not None and self.closed is None:
            self.transport.write(b"".join(out))
            self._written_at = time.monotonic()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and self.closed is None:
            if self._out:  # keep the order of frames
                self._flush()
            self.transport.write(data)
            self._written_at = time.monotonic()

    def send(self, channel: int, method: Any) -> None:
        """Send ``method`` on ``channel`` now, expecting no answer."""
        self._write(frame.marshal(method, channel))

    # asyncio.Protocol --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # No isinstance check: uvloop's TCPTransport is not an asyncio.Transport
        # subclass, though it has every method used here (write, abort, close).
        self.transport = cast("asyncio.Transport", transport)

    def pause_writing(self) -> None:
        if self._drained is None:
            self._drained = self.loop.create_future()

    def resume_writing(self) -> None:
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        lost = WireClosed(0, f"connection lost ({type(exc).__name__ if exc else 'EOF'})")
        lost.__cause__ = exc  # what the socket or TLS layer said (a TLS refusal names it)
        self._lost(lost)

    def data_received(self, data: bytes) -> None:
        self._read_at = time.monotonic()
        buffer = self._buffer
        buffer += data
        offset = 0
        size = len(buffer)
        readers = self.readers
        try:
            while size - offset >= 8:
                length = int.from_bytes(buffer[offset + 3 : offset + 7], "big") + 8
                if size - offset < length:
                    break
                if readers:  # a delivery's frames, on a consuming channel: its reader's
                    reader = readers.get(int.from_bytes(buffer[offset + 1 : offset + 3], "big"))
                    kind = buffer[offset]
                    if reader is not None and (
                        kind != _METHOD or buffer[offset + 7 : offset + 11] == DELIVER_METHOD
                    ):
                        if buffer[offset + length - 1] != _FRAME_END:
                            raise ValueError("a frame without its end marker")
                        reader.content(kind, bytes(buffer[offset + 7 : offset + length - 1]))
                        offset += length
                        if self.closed is not None:
                            return
                        continue
                if (
                    length == _CONFIRM_SIZE
                    and buffer[offset] == _METHOD
                    and buffer[offset + 7 : offset + 11] in (_ACK, _NACK)
                    and buffer[offset + 20] == _FRAME_END
                ):
                    acked = buffer[offset + 10] == 0x50
                    tag, bits = _TAG.unpack_from(buffer, offset + 11)
                    offset += length
                    self._confirmed(tag, bool(bits & 1), acked)
                    if self.closed is not None:
                        return
                    continue
                consumed, channel, value = frame.unmarshal(bytes(buffer[offset : offset + length]))
                offset += consumed
                self._dispatch(channel, value)
                if self.closed is not None:
                    return
        except (PAMQPException, ValueError) as exc:
            self._lost(WireClosed(0, f"unreadable frame from the broker: {exc}"))
            if self.transport is not None:
                self.transport.abort()
            return
        del buffer[:offset]

    def _lost(self, exc: WireClosed) -> None:
        if self.closed is not None:
            return
        self.closed = exc
        if self._timer is not None:
            self._timer.cancel()
        readers, self.readers = self.readers, {}
        for reader in readers.values():
            reader.closed(exc)
        self.resume_writing()  # a writer waiting for the socket hears it is gone
        self._on_lost(exc)

    def _beat(self) -> None:
        if self.closed is not None:
            return
        now = time.monotonic()
        if now - self._read_at > 2 * self._heartbeat_s:
            if self.transport is not None:
                self.transport.abort()
            self._lost(WireClosed(0, f"no heartbeat from the broker for {2 * self._heartbeat_s} s"))
            return
        if now - self._written_at >= self._heartbeat_s / 2:
            self._write(_HEARTBEAT)
        self._timer = self.loop.call_later(self._heartbeat_s / 2, self._beat)
