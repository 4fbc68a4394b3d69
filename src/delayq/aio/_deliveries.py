"""AMQP 0-9-1 deliveries decoded by hand: the frame feed's hot path.

A delivery is three frames or more: ``Basic.Deliver``, a content header and the
body. pamqp decodes each into objects with every field and property; the consumer
needs five things of a delivery (its tag, whether it was redelivered, routing key,
message id, content type) and the headers. So those are read here with offsets into
the frame's bytes, the headers by :mod:`delayq.message.decoding` (exactly what pamqp
would give). Anything malformed raises :class:`ValueError` (the wire drops a
connection that sends it).

The acks and nacks the consumer writes are encoded here too (one ``struct``
call each).
"""

from __future__ import annotations

import struct
from typing import Any

from delayq.message.decoding import field_table, read_table

__all__ = [
    "DELIVER_METHOD",
    "DeliveryFrames",
    "ack_frame",
    "content_header",
    "deliver_fields",
    "field_table",
    "nack_frame",
]

DELIVER_METHOD = b"\x00\x3c\x00\x3c"
"""The first bytes of a ``Basic.Deliver`` method frame's payload: class 60, method 60."""

_U64 = struct.Struct(">Q").unpack_from
_HEADER = struct.Struct(">4xQH").unpack_from  # class, weight, body size, property flags
_SETTLE = struct.Struct(">BHIHHQBB").pack  # a method frame of class 60 with tag and bits

# Bits of the content header's property flags, highest first (AMQP 0-9-1 Basic).
_CONTENT_TYPE = 1 << 15
_CONTENT_ENCODING = 1 << 14
_HEADERS = 1 << 13
_DELIVERY_MODE = 1 << 12
_PRIORITY = 1 << 11
_CORRELATION_ID = 1 << 10
_REPLY_TO = 1 << 9
_EXPIRATION = 1 << 8
_MESSAGE_ID = 1 << 7
_MORE_FLAGS = 1


def deliver_fields(payload: bytes) -> tuple[int, bool, str]:
    """``(delivery_tag, redelivered, routing_key)`` of a ``Basic.Deliver`` payload."""
    try:
        offset = 5 + payload[4]  # past class, method and the consumer tag
        (tag,) = _U64(payload, offset)
        redelivered = bool(payload[offset + 8] & 1)
        offset += 10 + payload[offset + 9]  # past the exchange
        end = offset + 1 + payload[offset]
        if end > len(payload):
            raise ValueError("the routing key runs past the frame")
        return tag, redelivered, payload[offset + 1 : end].decode()
    except (IndexError, struct.error) as exc:
        raise ValueError(f"a truncated Basic.Deliver ({len(payload)} bytes)") from exc


def content_header(payload: bytes) -> tuple[int, str | None, dict[str, Any], str | None]:
    """``(body_size, content_type, headers, message_id)`` of a content header payload."""
    try:
        size, flags = _HEADER(payload, 0)
        if flags & _MORE_FLAGS:
            raise ValueError("a content header with a second property-flags word")
        offset = 14
        content_type: str | None = None
        headers: dict[str, Any] = {}
        message_id: str | None = None
        if flags & _CONTENT_TYPE:
            end = offset + 1 + payload[offset]
            content_type = payload[offset + 1 : end].decode()
            offset = end
        if flags & _CONTENT_ENCODING:
            offset += 1 + payload[offset]
        if flags & _HEADERS:
            headers, offset = read_table(payload, offset)
        if flags & _DELIVERY_MODE:
            offset += 1
        if flags & _PRIORITY:
            offset += 1
        for skipped in (_CORRELATION_ID, _REPLY_TO, _EXPIRATION):
            if flags & skipped:
                offset += 1 + payload[offset]
        if flags & _MESSAGE_ID:
            end = offset + 1 + payload[offset]
            if end > len(payload):
                raise ValueError("the message id runs past the frame")
            message_id = payload[offset + 1 : end].decode()
        return size, content_type, headers, message_id
    except (IndexError, struct.error) as exc:
        raise ValueError(f"a truncated content header ({len(payload)} bytes)") from exc


class DeliveryFrames:
    """Puts a consuming channel's deliveries together from their frames (the
    :meth:`content` of a :class:`~delayq.aio._framing.ChannelReader`) and hands each to
    :meth:`whole`: ``Basic.Deliver``'s fields, its content header's payload (unread: the
    reader decides what to read of it, and what to do when it cannot) and its body."""

    def __init__(self) -> None:
        self._deliver: tuple[int, bool, str] | None = None  # the delivery being read
        self._header = b""
        self._left = 0
        self._chunks: list[bytes] = []

    def content(self, kind: int, payload: bytes) -> None:
        """A ``Basic.Deliver`` method frame (``kind`` 1), a content header (2) or body (3).
        Raises :class:`ValueError` if they do not make a delivery."""
        if kind == 1:
            self._deliver = deliver_fields(payload)
            return
        if self._deliver is None:
            raise ValueError(f"a content frame (type {kind}) outside a delivery")
        if kind == 2:
            if len(payload) < 12:
                raise ValueError("a content header cut short")
            (self._left,) = _U64(payload, 4)  # after class and weight
            self._header, self._chunks = payload, []
            if not self._left:
                self._whole(b"")
            return
        if kind != 3:
            raise ValueError(f"a frame of type {kind} inside a delivery")
        self._left -= len(payload)
        if self._left > 0:
            self._chunks.append(payload)
            return
        if self._left < 0:
            raise ValueError("a delivery's body is longer than its header said")
        chunks = self._chunks
        self._whole(b"".join((*chunks, payload)) if chunks else payload)

    def _whole(self, body: bytes) -> None:
        deliver, self._deliver = self._deliver, None
        assert deliver is not None
        self.whole(deliver, self._header, body)

    def whole(self, deliver: tuple[int, bool, str], header: bytes, body: bytes) -> None:
        """One delivery: ``(delivery_tag, redelivered, routing_key)``, its content header's
        payload, its body."""
        raise NotImplementedError


def ack_frame(channel: int, tag: int, multiple: bool) -> bytes:
    """``Basic.Ack`` of ``tag`` (and every earlier one when ``multiple``)."""
    return _SETTLE(1, channel, 13, 60, 80, tag, 1 if multiple else 0, 0xCE)


def reject_frame(channel: int, tag: int, requeue: bool) -> bytes:
    """``Basic.Reject`` of ``tag``: back to the queue when ``requeue`` (RabbitMQ 4.3 counts
    it toward a quorum queue's delivery limit, a ``Basic.Nack`` not), else dropped (or
    dead-lettered by the queue's own policy)."""
    return _SETTLE(1, channel, 13, 60, 90, tag, 1 if requeue else 0, 0xCE)


def nack_frame(channel: int, tag: int, multiple: bool, requeue: bool) -> bytes:
    """``Basic.Nack`` of ``tag``: back to the queue when ``requeue``, else dropped (or
    dead-lettered by the queue's own policy)."""
    bits = (1 if multiple else 0) | (2 if requeue else 0)
    return _SETTLE(1, channel, 13, 60, 120, tag, bits, 0xCE)
