"""Content headers read as pika reads them, at about half the cost: the sync consumer's
header reader (:func:`delayq.sync._connection.read_content_headers`).

pika decodes a field table with a call and a slice for every key and value (about 7 µs
a delivery of delayq's headers, 18 for one a tier dead-lettered, with RabbitMQ's
``x-death``). :func:`pika_table` reads the same tables with offsets into the frame, the
values *of pika's types*: a 64-bit integer as pika's ``long`` (the marker its encoder
keeps 64 bits wide when a retry carries the header on), a timestamp as an aware UTC
``datetime``, a byte array as ``bytes``. What pika reads differently from pamqp, or
refuses (a float or double, which pika 1.4 truncates to an integer; a decimal; pika's
``U``; an unknown type; a key or string that is not UTF-8; anything malformed) raises
:class:`ValueError`, and pika reads that header itself, as before. An ``x-death`` array
is decoded once per distinct bytes (:func:`delayq.message.decoding.remembered_array`),
and so is a table's tail from its ``x-death`` key on, where RabbitMQ's dead-lettering
headers are (:func:`delayq.message.decoding.read_pairs`).
"""

from __future__ import annotations

import struct
from datetime import datetime, timezone
from typing import Any

from pika.compat import long

from delayq.message.decoding import read_array, read_pairs, remembered_array

__all__ = ["pika_table"]

_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_I64 = struct.Struct(">q").unpack_from
_INTEGERS: dict[int, tuple[struct.Struct, int]] = {
    ord("b"): (struct.Struct(">b"), 1),
    ord("B"): (struct.Struct(">B"), 1),
    ord("s"): (struct.Struct(">h"), 2),
    ord("u"): (struct.Struct(">H"), 2),
    ord("I"): (struct.Struct(">i"), 4),
    ord("i"): (struct.Struct(">I"), 4),
}
_LONG_STR, _BOOL, _TABLE, _ARRAY, _VOID, _TIMESTAMP, _BYTES = (ord(c) for c in "StFAVTx")
_LONGS = (ord("l"), ord("L"))
_SHORT_SHORT, _LONG_LONG = ord("b"), ord("l")
_I8 = struct.Struct(">b").unpack_from
_UTC = timezone.utc
_ARRAYS: dict[bytes, list[Any]] = {}
_TAILS: dict[bytes, dict[str, Any]] = {}


def pika_table(data: bytes, offset: int) -> tuple[dict[str, Any], int]:
    """The field table at ``offset`` as pika decodes it, and the offset past it."""
    try:
        return _table(data, offset, True)
    except (IndexError, struct.error) as exc:
        raise ValueError(f"a truncated field table at offset {offset}") from exc


def _table(data: bytes, offset: int, tails: bool = False) -> tuple[dict[str, Any], int]:
    (length,) = _U32(data, offset)
    offset += 4
    end = offset + length
    if end > len(data):
        raise ValueError("a field table runs past the frame")
    table: dict[str, Any] = {}
    read_pairs(data, offset, end, table, _fill, _TAILS if tails else None)
    return table, end


def _fill(data: bytes, offset: int, stop: int, end: int, table: dict[str, Any]) -> int:
    """:data:`delayq.message.decoding.PairReader` with pika's types."""
    while offset < stop:
        key_end = offset + 1 + data[offset]
        if key_end >= end:
            raise ValueError("a field-table key runs past its table")
        key = data[offset + 1 : key_end].decode()
        kind = data[key_end]
        offset = key_end + 1
        if kind == _LONG_STR:  # the types of delayq's headers and x-death, without a call
            (size,) = _U32(data, offset)
            start = offset + 4
            offset = start + size
            raw = data[start:offset]
            try:
                table[key] = raw.decode()
            except UnicodeDecodeError:
                table[key] = raw  # as pika: bytes when not UTF-8
        elif kind == _SHORT_SHORT:
            table[key] = _I8(data, offset)[0]
            offset += 1
        elif kind == _LONG_LONG:
            table[key] = long(_I64(data, offset)[0])
            offset += 8
        elif kind == _ARRAY:
            table[key], offset = remembered_array(data, offset, _array, _ARRAYS)
        else:
            table[key], offset = _value(data, key_end)
    return offset


def _array(data: bytes, offset: int) -> tuple[list[Any], int]:
    return read_array(data, offset, _value)


def _value(data: bytes, offset: int) -> tuple[Any, int]:
    kind = data[offset]
    offset += 1
    if kind == _LONG_STR:
        (size,) = _U32(data, offset)
        end = offset + 4 + size
        raw = data[offset + 4 : end]
        try:
            return raw.decode(), end
        except UnicodeDecodeError:
            return raw, end  # as pika: bytes when not UTF-8
    if kind in _LONGS:
        return long(_I64(data, offset)[0]), offset + 8
    integer = _INTEGERS.get(kind)
    if integer is not None:
        unpack, size = integer
        return unpack.unpack_from(data, offset)[0], offset + size
    if kind == _TABLE:
        return _table(data, offset)
    if kind == _ARRAY:
        return remembered_array(data, offset, _array, _ARRAYS)
    if kind == _BOOL:
        return bool(data[offset]), offset + 1
    if kind == _TIMESTAMP:
        (seconds,) = _U64(data, offset)
        try:
            return datetime.fromtimestamp(seconds, _UTC), offset + 8
        except (OverflowError, OSError) as exc:  # pika's own error then
            raise ValueError(f"a timestamp out of range ({seconds})") from exc
    if kind == _BYTES:
        (size,) = _U32(data, offset)
        end = offset + 4 + size
        return data[offset + 4 : end], end
    if kind == _VOID:
        return None, offset
    raise ValueError(f"field type {chr(kind)!r}: pika reads it")
