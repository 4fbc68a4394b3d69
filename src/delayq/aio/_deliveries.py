"""AMQP 0-9-1 deliveries decoded by hand: the frame feed's hot path.

A delivery is three frames or more: ``Basic.Deliver``, a content header and the
body. pamqp decodes each into objects with every field and property, its field
tables by slicing the rest of the frame at every value (quadratic in the table's
size); the consumer needs five things of a delivery (its tag, whether it was
redelivered, routing key, message id, content type) and the headers. So those
are read here with offsets into the frame's bytes, the common field-table types
(strings, integers, booleans, floats, timestamps, nested tables and arrays)
directly, any other (a decimal, a byte array) with pamqp's own decoder of that
type, so the headers are exactly what pamqp would give. Anything malformed
raises :class:`ValueError` (the wire drops a connection that sends it).

A field array is decoded once per distinct run of bytes and handed out as a fresh
copy after that: a delayed message arrives dead-lettered, with the broker's
``x-death`` array (a table of six entries in it), which the messages dead-lettered
from one tier in the same second share byte for byte; decoding it was about half of
such a delivery's headers. Every copy is a new list of new tables (a handler may
change what it is given), equal to what pamqp would give.

The acks and nacks the consumer writes are encoded here too (one ``struct``
call each).
"""

from __future__ import annotations

import struct
from datetime import datetime, timezone
from typing import Any

from pamqp import decode

__all__ = [
    "DELIVER_METHOD",
    "ack_frame",
    "content_header",
    "deliver_fields",
    "field_table",
    "nack_frame",
]

DELIVER_METHOD = b"\x00\x3c\x00\x3c"
"""The first bytes of a ``Basic.Deliver`` method frame's payload: class 60, method 60."""

_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_I64 = struct.Struct(">q").unpack_from
_I8 = struct.Struct(">b").unpack_from
_HEADER = struct.Struct(">4xQH").unpack_from  # class, weight, body size, property flags
_SETTLE = struct.Struct(">BHIHHQBB").pack  # a method frame of class 60 with tag and bits
_NUMBERS: dict[int, tuple[struct.Struct, int]] = {
    ord("b"): (struct.Struct(">b"), 1),
    ord("B"): (struct.Struct(">B"), 1),
    ord("s"): (struct.Struct(">h"), 2),
    ord("u"): (struct.Struct(">H"), 2),
    ord("I"): (struct.Struct(">i"), 4),
    ord("i"): (struct.Struct(">I"), 4),
    ord("l"): (struct.Struct(">q"), 8),
    ord("L"): (struct.Struct(">q"), 8),  # pamqp reads both as signed
    ord("f"): (struct.Struct(">f"), 4),
    ord("d"): (struct.Struct(">d"), 8),
}
_LONG_STR, _BOOL, _TABLE, _ARRAY, _VOID, _TIMESTAMP = (ord(c) for c in "StFAVT")
_SHORT_SHORT, _LONG_LONG = ord("b"), ord("l")
_UTC = timezone.utc

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
            headers, offset = _table(payload, offset)
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


def field_table(data: bytes, offset: int) -> tuple[dict[str, Any], int]:
    """The field table at ``offset`` and the offset past it (pamqp's values and types)."""
    try:
        return _table(data, offset)
    except (IndexError, struct.error) as exc:
        raise ValueError(f"a truncated field table at offset {offset}") from exc


def _table(data: bytes, offset: int) -> tuple[dict[str, Any], int]:
    # The types delayq's headers and the broker's x-death entries use are read here
    # without a call each (a table is most of a delivery's decoding); any other in _value.
    (length,) = _U32(data, offset)
    offset += 4
    end = offset + length
    if end > len(data):
        raise ValueError("a field table runs past the frame")
    table: dict[str, Any] = {}
    while offset < end:
        key_end = offset + 1 + data[offset]
        if key_end >= end:
            raise ValueError("a field-table key runs past its table")
        key = data[offset + 1 : key_end].decode()
        kind = data[key_end]
        offset = key_end + 1
        if kind == _LONG_STR:
            (size,) = _U32(data, offset)
            start = offset + 4
            offset = start + size
            raw = data[start:offset]
            try:
                table[key] = raw.decode()
            except UnicodeDecodeError:
                table[key] = raw  # as pamqp: bytes when not UTF-8
        elif kind == _SHORT_SHORT:
            table[key] = _I8(data, offset)[0]
            offset += 1
        elif kind == _LONG_LONG:
            table[key] = _I64(data, offset)[0]
            offset += 8
        elif kind == _TABLE:
            table[key], offset = _table(data, offset)
        elif kind == _ARRAY:
            table[key], offset = _known_array(data, offset)
        else:
            table[key], offset = _value(data, key_end)
    return table, end


_ARRAYS: dict[bytes, list[Any]] = {}
"""Arrays decoded lately, by their bytes (length included); never handed out."""
_ARRAYS_KEPT = 64


def _known_array(data: bytes, offset: int) -> tuple[list[Any], int]:
    """:func:`_array`, decoded once per distinct bytes: a copy of the array seen before."""
    (length,) = _U32(data, offset)
    end = offset + 4 + length
    raw = data[offset:end]
    known = _ARRAYS.get(raw)
    if known is not None:
        return _copy(known), end
    items, past = _array(data, offset)
    if past == end:  # well formed: nothing of it read past its own bytes
        if len(_ARRAYS) >= _ARRAYS_KEPT:
            _ARRAYS.clear()
        _ARRAYS[raw] = _copy(items)
    return items, past


def _copy(value: Any) -> Any:
    """``value`` with every mutable part (list, table, byte array) new."""
    kind = type(value)
    if kind is list:
        return [_copy(item) for item in value]
    if kind is dict:
        return {key: _copy(item) for key, item in value.items()}
    if kind is bytearray:
        return bytearray(value)
    return value  # str, int, float, bool, None, bytes, datetime, Decimal: immutable


def _array(data: bytes, offset: int) -> tuple[list[Any], int]:
    (length,) = _U32(data, offset)
    offset += 4
    end = offset + length
    if end > len(data):
        raise ValueError("a field array runs past the frame")
    items: list[Any] = []
    while offset < end:
        item, offset = _value(data, offset)
        items.append(item)
    return items, offset


def _value(data: bytes, offset: int) -> tuple[Any, int]:
    kind = data[offset]
    offset += 1
    if kind == _LONG_STR:
        (length,) = _U32(data, offset)
        end = offset + 4 + length
        raw = data[offset + 4 : end]
        try:
            return raw.decode(), end
        except UnicodeDecodeError:
            return raw, end  # as pamqp: bytes when not UTF-8
    number = _NUMBERS.get(kind)
    if number is not None:
        unpack, size = number
        return unpack.unpack_from(data, offset)[0], offset + size
    if kind == _BOOL:
        return bool(data[offset]), offset + 1
    if kind == _TABLE:
        return _table(data, offset)
    if kind == _ARRAY:
        return _array(data, offset)
    if kind == _TIMESTAMP:  # in every x-death entry: pamqp's reading, without its slice
        (seconds,) = _U64(data, offset)
        # pamqp: "anything above the year 2106 is likely milliseconds"
        stamp = seconds / 1000.0 if seconds > 0xFFFFFFFF else seconds
        try:
            return datetime.fromtimestamp(stamp, tz=_UTC), offset + 8
        except (OverflowError, OSError) as exc:  # past what a datetime holds
            raise ValueError(f"a timestamp out of range ({seconds})") from exc
    if kind == _VOID or kind == 0:
        return None, offset
    reader = decode.TABLE_MAPPING.get(bytes((kind,)))
    if reader is None:
        raise ValueError(f"unknown field type {chr(kind)!r}")
    consumed, value = reader(data[offset:])  # D decimal, T timestamp, x byte array
    return value, offset + consumed


def ack_frame(channel: int, tag: int, multiple: bool) -> bytes:
    """``Basic.Ack`` of ``tag`` (and every earlier one when ``multiple``)."""
    return _SETTLE(1, channel, 13, 60, 80, tag, 1 if multiple else 0, 0xCE)


def nack_frame(channel: int, tag: int, multiple: bool, requeue: bool) -> bytes:
    """``Basic.Nack`` of ``tag``: back to the queue when ``requeue``, else dropped (or
    dead-lettered by the queue's own policy)."""
    bits = (1 if multiple else 0) | (2 if requeue else 0)
    return _SETTLE(1, channel, 13, 60, 120, tag, bits, 0xCE)
