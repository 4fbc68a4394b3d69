"""AMQP 0-9-1 field tables and content-header properties decoded by hand: both
consumers' hot path (the asyncio frame feed's :mod:`delayq.aio._deliveries`, the sync
consumer's header reader in :mod:`delayq.sync._connection`).

pamqp decodes a table by slicing the rest of the frame at every value (quadratic in
the table's size), pika with a call and a slice per key and value. Here tables are read
with offsets into the frame's bytes, the types delayq's headers and the broker's
``x-death`` entries use (strings, integers, nested tables, arrays, booleans,
timestamps) without a call each, any other (a decimal, a byte array) with pamqp's own
decoder of that type: the values and their types are exactly what pamqp gives.
Anything malformed raises :class:`ValueError`.

A field array is decoded once per distinct run of bytes and handed out as a fresh
copy after that: a delayed message arrives dead-lettered, with the broker's
``x-death`` array (a table of six entries in it), which the messages dead-lettered
from one tier in the same second share byte for byte; decoding it was 40 % of
such a delivery's headers. Every copy is a new list of new tables (a handler may
change what it is given), equal to what pamqp would give. So is a header table's tail
from its ``x-death`` key on (:func:`read_pairs`): RabbitMQ sorts a dead-lettered
message's headers by key, which puts what it added after delayq's own.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from pamqp import decode

__all__ = [
    "KEPT_ARRAYS",
    "PROPERTY_NAMES",
    "X_DEATH_KEY",
    "ArrayReader",
    "PairReader",
    "TableReader",
    "ValueReader",
    "basic_properties",
    "copied",
    "field_table",
    "read_array",
    "read_pairs",
    "read_table",
    "remembered_array",
    "remembered_tail",
]

_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_I64 = struct.Struct(">q").unpack_from
_I8 = struct.Struct(">b").unpack_from
_FLAGS = struct.Struct(">H").unpack_from
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

TableReader = Callable[[bytes, int], tuple[dict[str, Any], int]]
"""Reads the field table at an offset: the table and the offset past it."""

PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)
"""AMQP 0-9-1 Basic's content properties, in the order of their flag bits (highest first)."""
_SHORT, _OCTET, _LONGLONG, _TABLE_PROPERTY = range(4)
_PROPERTY_KINDS = (
    _SHORT, _SHORT, _TABLE_PROPERTY, _OCTET, _OCTET, _SHORT, _SHORT, _SHORT, _SHORT,
    _LONGLONG, _SHORT, _SHORT, _SHORT, _SHORT,
)  # fmt: skip


_PRESENT: dict[int, tuple[tuple[str, int], ...]] = {}
"""The properties (name, kind) a value of the property flags says are present."""


def _present(flags: int) -> tuple[tuple[str, int], ...]:
    if flags & 1:
        raise ValueError("a content header with a second property-flags word")
    present = tuple(
        (name, kind)
        for bit, name, kind in zip(range(15, 1, -1), PROPERTY_NAMES, _PROPERTY_KINDS, strict=True)
        if flags & (1 << bit)
    )
    if len(_PRESENT) < 1024:  # flag words seen: a handful in practice
        _PRESENT[flags] = present
    return present


def basic_properties(
    data: bytes, offset: int, end: int, table: TableReader | None = None
) -> dict[str, Any]:
    """The properties of a Basic content header whose property flags are at ``offset``
    and whose payload ends at ``end``: each one present, by its name in
    :data:`PROPERTY_NAMES` (short strings as ``str``, the timestamp as an ``int`` of
    seconds, the headers as ``table`` reads them: :func:`read_table` unless given).
    Raises :class:`ValueError` for anything malformed or past ``end``, a short string
    that is not UTF-8, or a second property-flags word."""
    read = read_table if table is None else table
    try:
        (flags,) = _FLAGS(data, offset)
        present = _PRESENT.get(flags)
        if present is None:
            present = _present(flags)
        offset += 2
        found: dict[str, Any] = {}
        for name, kind in present:
            if kind == _SHORT:
                stop = offset + 1 + data[offset]
                found[name] = data[offset + 1 : stop].decode()
                offset = stop
            elif kind == _TABLE_PROPERTY:
                found[name], offset = read(data, offset)
            elif kind == _OCTET:
                found[name] = data[offset]
                offset += 1
            else:
                (found[name],) = _U64(data, offset)
                offset += 8
    except (IndexError, struct.error) as exc:
        raise ValueError("a truncated content header") from exc
    if offset > end:
        raise ValueError("a content header's properties run past its frame")
    return found


def field_table(data: bytes, offset: int) -> tuple[dict[str, Any], int]:
    """The field table at ``offset`` and the offset past it (pamqp's values and types)."""
    try:
        return read_table(data, offset)
    except (IndexError, struct.error) as exc:
        raise ValueError(f"a truncated field table at offset {offset}") from exc


def read_table(data: bytes, offset: int, tails: bool = True) -> tuple[dict[str, Any], int]:
    """:func:`field_table` for a caller that turns ``IndexError`` and ``struct.error`` (a
    table cut short) into its own ``ValueError``. With ``tails`` the pairs from an
    ``x-death`` key on (RabbitMQ's dead-lettering headers) are read once per distinct
    bytes (:func:`read_pairs`)."""
    (length,) = _U32(data, offset)
    offset += 4
    end = offset + length
    if end > len(data):
        raise ValueError("a field table runs past the frame")
    table: dict[str, Any] = {}
    read_pairs(data, offset, end, table, _fill, _TAILS if tails else None)
    return table, end


def _fill(data: bytes, offset: int, stop: int, end: int, table: dict[str, Any]) -> int:
    """Read the pairs of a table ending at ``end`` from ``offset`` into ``table`` until
    ``stop`` is reached or passed; the offset past the last pair read."""
    # The types delayq's headers and the broker's x-death entries use are read here
    # without a call each (a table is most of a delivery's decoding); any other in _value.
    while offset < stop:
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
            table[key], offset = read_table(data, offset, False)
        elif kind == _ARRAY:
            table[key], offset = remembered_array(data, offset, _array, _ARRAYS)
        else:
            table[key], offset = _value(data, key_end)
    return offset


PairReader = Callable[[bytes, int, int, int, dict[str, Any]], int]
"""``read(data, offset, stop, end, table)``: reads the pairs of a table ending at ``end``
from ``offset`` into ``table`` until ``stop`` is reached or passed; the offset past them."""

X_DEATH_KEY = b"\x07x-death"
"""The ``x-death`` key as a field table holds it (its length, then its bytes)."""

_TAILS: dict[bytes, dict[str, Any]] = {}
"""Table tails from an ``x-death`` key on, decoded lately, by their bytes; never handed out."""


def read_pairs(
    data: bytes,
    offset: int,
    end: int,
    table: dict[str, Any],
    read: PairReader,
    seen: dict[bytes, dict[str, Any]] | None,
) -> None:
    """Read a table's pairs from ``offset`` to its ``end`` into ``table`` with ``read``;
    unless ``seen`` is None, those from an ``x-death`` key on once per distinct bytes
    (:func:`remembered_tail`).

    RabbitMQ writes a dead-lettered message's headers sorted by key (3.10.8 and 4.0.5
    alike): delayq's own (``delayq-*``, ``traceparent``) come before ``x-death``, and
    from it on is what the broker added when the tier dead-lettered the message, the
    same bytes for the messages one tier dead-lettered in one second (the ``x-death``
    array, ``x-first-death-*`` and, on 4.0.5, ``x-last-death-*``: half of such a
    delivery's decoding), up to an application's own headers sorted after them. A table
    without those bytes is read as it is, with one search of its bytes; where they are
    not a key (inside a value) the table is read on from there, as without the memo."""
    if seen is not None:
        tail = data.find(X_DEATH_KEY, offset, end)
        if tail >= 0:
            offset = read(data, offset, tail, end, table)
            if offset == tail:
                offset = remembered_tail(data, tail, end, table, read, seen)
    if offset < end:
        offset = read(data, offset, end, end, table)
    if offset != end:
        raise ValueError("a field-table value runs past its table")


_LAST_REASONS = (b"\x13x-last-death-reason", b"\x14x-first-death-reason")
"""The last key RabbitMQ adds when it dead-letters a message: 4.0.5's, then 3.10.8's."""


def _broker_end(data: bytes, tail: int, end: int) -> int:
    """Where the pairs RabbitMQ added, from the ``x-death`` key at ``tail``, likely end:
    past the value of its last ``x-*-death-reason`` string, else the table's ``end`` (an
    application's own ``x-request-id`` sorts after them and differs per message)."""
    for key in _LAST_REASONS:
        found = data.find(key, tail, end)
        if found >= 0:
            kind = found + len(key)
            if kind + 5 <= end and data[kind] == _LONG_STR:
                size: int = _U32(data, kind + 1)[0]
                return min(end, kind + 5 + size)
    return end


def remembered_tail(
    data: bytes,
    offset: int,
    end: int,
    table: dict[str, Any],
    read: PairReader,
    seen: dict[bytes, dict[str, Any]],
) -> int:
    """Read the pairs from ``offset`` (an ``x-death`` key) on into ``table`` as ``read``
    gives them, once per distinct bytes: a copy of what ``seen`` (at most
    :data:`KEPT_ARRAYS`) holds of the same bytes read before; the offset past what was
    read. Those bytes are the rest of the table, or, where that was not seen before, up
    to the end of what the broker added (:func:`_broker_end`). Updating a table with the
    pairs gives what reading them into it one by one would (a key met again keeps its
    place and takes the later value). Where that end is not between two pairs (the bytes
    that put it there were inside a value), what was read is kept and not remembered."""
    known = seen.get(data[offset:end])
    if known is not None:  # nothing after the broker's headers, the usual case
        table.update(copied(known))
        return end
    stop = _broker_end(data, offset, end)
    raw = data[offset:stop]
    if stop != end:
        known = seen.get(raw)
        if known is not None:
            table.update(copied(known))
            return stop
    part: dict[str, Any] = {}
    offset = read(data, offset, stop, end, part)
    table.update(part)
    if offset == stop:
        if len(seen) >= KEPT_ARRAYS:
            seen.clear()
        seen[raw] = copied(part)
    return offset


ArrayReader = Callable[[bytes, int], tuple[list[Any], int]]

_ARRAYS: dict[bytes, list[Any]] = {}
"""Arrays decoded lately, by their bytes (length included); never handed out."""
KEPT_ARRAYS = 64


def remembered_array(
    data: bytes, offset: int, read: ArrayReader, seen: dict[bytes, list[Any]]
) -> tuple[list[Any], int]:
    """``read(data, offset)``, once per distinct bytes of the array at ``offset``: a copy
    of what ``seen`` (at most :data:`KEPT_ARRAYS`) holds of an array read before."""
    (length,) = _U32(data, offset)
    end = offset + 4 + length
    raw = data[offset:end]
    known = seen.get(raw)
    if known is not None:
        return copied(known), end
    items, past = read(data, offset)
    if past == end:  # well formed: nothing of it read past its own bytes
        if len(seen) >= KEPT_ARRAYS:
            seen.clear()
        seen[raw] = copied(items)
    return items, past


def copied(value: Any) -> Any:
    """``value`` with every mutable part (list, table, byte array) new."""
    kind = type(value)
    if kind is list:
        return [item if type(item) in _IMMUTABLE else copied(item) for item in value]
    if kind is dict:
        return {
            key: item if type(item) in _IMMUTABLE else copied(item) for key, item in value.items()
        }
    if kind is bytearray:
        return bytearray(value)
    return value  # immutable: float, bool, None, bytes, Decimal (and _IMMUTABLE's)


_IMMUTABLE = frozenset((str, int, datetime))
"""The types of nearly every header value (x-death's included): copied as they are."""


ValueReader = Callable[[bytes, int], tuple[Any, int]]
"""Reads the typed field value at an offset: the value and the offset past it."""


def read_array(data: bytes, offset: int, value: ValueReader) -> tuple[list[Any], int]:
    """The field array at ``offset``, each item read by ``value``, and the offset past
    its last item."""
    (length,) = _U32(data, offset)
    offset += 4
    end = offset + length
    if end > len(data):
        raise ValueError("a field array runs past the frame")
    items: list[Any] = []
    while offset < end:
        item, offset = value(data, offset)
        items.append(item)
    return items, offset


def _array(data: bytes, offset: int) -> tuple[list[Any], int]:
    return read_array(data, offset, _value)


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
        return read_table(data, offset, False)
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
