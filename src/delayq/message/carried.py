"""The frames of a publish whose message carries further AMQP properties (an intake's,
forwarded by ``delayq bridge``), encoded by hand: byte for byte what pika's
``basic_publish`` writes for :func:`pika_properties`, at a
fraction of its cost (pika builds a properties object and encodes the header table
value by value; a bridged message has a dozen headers, most of the relay's time).

pika's encoding is kept, not :func:`delayq.message.frames.publish_frames`' (pamqp's):
an integer header as a signed 32-bit ``I`` (64-bit ``l`` past it), the header table in
its own order, no ``priority`` unless carried, so a consumer reads the carried headers
with the types the bridge always sent. A message with a header value other than text or a 64-bit
integer, or a property of another type, is encoded by pika's own codec
(:func:`bridged_frames`; no connection: ``pika.spec`` only), which :func:`unwritable`
checks can write it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from delayq.message.envelope import OutgoingMessage
from delayq.message.frames import content_frames

if TYPE_CHECKING:
    import pika

__all__ = ["Unwritable", "bridged_frames", "carried_frames", "pika_properties", "unwritable"]

_pack_header = struct.Struct(">HHQH").pack  # class 60, weight 0, body size, property flags
_pack_u32 = struct.Struct(">I").pack
_pack_int = struct.Struct(">ci").pack
_pack_long = struct.Struct(">cq").pack
_pack_u64 = struct.Struct(">Q").pack
_PUBLISH_METHOD = b"\x00\x3c\x00\x28\x00\x00"  # class 60 Basic, method 40 Publish, ticket 0
_MANDATORY = b"\x01"
_PERSISTENT = b"\x02"
_INT32_MIN, _INT32_END = -(2**31), 2**31


def _short(value: object) -> bytes | None:
    raw = value.encode() if isinstance(value, str) else value
    if type(raw) is not bytes or len(raw) > 255:
        return None
    return bytes((len(raw),)) + raw


_KEPT = 4096
_NAMES: dict[str, bytes] = {}
_PAIRS: dict[tuple[str, object], bytes] = {}
"""Short strings and header pairs that recur (a tier, an exchange, delayq's headers, a
content type), encoded once: at most ``_KEPT`` of each."""


def _name(value: object) -> bytes | None:
    """A short string that recurs (not a message id: each is new)."""
    if type(value) is not str:
        return _short(value)
    raw = _NAMES.get(value)
    if raw is None:
        raw = _short(value)
        if raw is not None and len(_NAMES) < _KEPT:
            _NAMES[value] = raw
    return raw


def _pair(key: str, value: object) -> tuple[bytes, bool] | None:
    """A header's key and value as pika encodes them, and whether the pair recurs (not a
    timestamp, nor a long text), or ``None``: pika's own encoding (a bool is no int)."""
    name = _name(key)
    if name is None:
        return None
    if type(value) is str:
        raw = value.encode()
        return name + b"S" + _pack_u32(len(raw)) + raw, len(raw) <= 64
    if type(value) is int and _INT32_MIN <= value < _INT32_END:
        return name + _pack_int(b"I", value), True
    if type(value) is int and _INT64_MIN <= value < _INT64_END:
        return name + _pack_long(b"l", value), False
    return None


def _table(headers: dict[str, object]) -> bytes | None:
    parts: list[bytes] = []
    pairs = _PAIRS
    for key, value in headers.items():
        kind = type(value)
        if type(key) is not str or (kind is not str and kind is not int):
            return None
        pair = pairs.get((key, value))
        if pair is None:
            found = _pair(key, value)
            if found is None:
                return None
            pair, recurs = found
            if recurs and len(pairs) < _KEPT:
                pairs[(key, value)] = pair
        parts.append(pair)
    payload = b"".join(parts)
    return _pack_u32(len(payload)) + payload


def _octet(value: object) -> bytes | None:
    return bytes((value,)) if type(value) is int and 0 <= value <= 255 else None


def _timestamp(value: object) -> bytes | None:
    return _pack_u64(value) if type(value) is int and 0 <= value < 2**64 else None


def _headers(value: object) -> bytes | None:
    return _table(value) if isinstance(value, dict) else None


Encoder = Callable[[object], "bytes | None"]

_FIELDS: tuple[tuple[str, int, Encoder], ...] = (
    # (pika's name, property flag, encoder), in the order AMQP encodes them
    ("content_type", 1 << 15, _name),
    ("content_encoding", 1 << 14, _name),
    ("headers", 1 << 13, _headers),
    ("delivery_mode", 1 << 12, _octet),
    ("priority", 1 << 11, _octet),
    ("correlation_id", 1 << 10, _name),
    ("reply_to", 1 << 9, _name),
    ("expiration", 1 << 8, _name),
    ("message_id", 1 << 7, _short),  # each one new: not kept
    ("timestamp", 1 << 6, _timestamp),
    ("type", 1 << 5, _name),
    ("user_id", 1 << 4, _name),
    ("app_id", 1 << 3, _name),
)
_ALWAYS = frozenset({"content_type", "headers", "delivery_mode", "message_id", "timestamp"})
_SHAPES: dict[tuple[str, ...], tuple[tuple[str, int, Encoder], ...]] = {}
"""The fields to encode, by the names of the properties a message carries (a few
shapes recur: the property names a publisher sets)."""


def _shape(names: tuple[str, ...]) -> tuple[tuple[str, int, Encoder], ...] | None:
    present = _ALWAYS.union(names)
    if not present.issubset(field[0] for field in _FIELDS):
        return None  # a property pika knows and this does not: pika's
    shape = tuple(field for field in _FIELDS if field[0] in present)
    if len(_SHAPES) < _KEPT:
        _SHAPES[names] = shape
    return shape


def carried_frames(msg: OutgoingMessage, channel: int, frame_max: int) -> bytes | None:
    """The frames publishing ``msg`` (mandatory, persistent) on ``channel`` as pika would,
    or ``None``: pika must encode it.

    :raises HeaderFrameTooLarge: its content header does not fit in one frame of
        ``frame_max`` (the connection's).
    """
    props = msg.properties
    shape = _SHAPES.get(tuple(props))
    if shape is None:
        shape = _shape(tuple(props))
        if shape is None:
            return None
    values = {
        "content_type": msg.content_type,
        "delivery_mode": 2,
        "message_id": msg.message_id,
        "timestamp": msg.timestamp_s,
        **props,
        "headers": msg.headers,
    }
    flags = 0
    encoded: list[bytes] = []
    for name, flag, encode in shape:
        value = values[name]
        if value is None:
            continue
        part = encode(value)
        if part is None:
            return None
        flags |= flag
        encoded.append(part)
    exchange, key = _name(msg.exchange), _name(msg.routing_key)
    if exchange is None or key is None:
        return None
    method = _PUBLISH_METHOD + exchange + key + _MANDATORY
    header = _pack_header(60, 0, len(msg.body), flags) + b"".join(encoded)
    return content_frames(msg, channel, frame_max, method, header)


_pack_content = struct.Struct(">HHQ").pack  # class 60, weight 0, body size


class Unwritable(ValueError):
    """A message's headers cannot be written again (:func:`unwritable` says why)."""


def bridged_frames(msg: OutgoingMessage, channel: int, frame_max: int) -> bytes:
    """The frames publishing ``msg`` (an intake's, with the properties it carries) on
    ``channel``: :func:`carried_frames`, or pika's encoding of its properties when that
    leaves it to pika (checked by :func:`unwritable` first: only then, the common
    message, text and integer headers, always writable, is not checked twice).

    :raises Unwritable: pika cannot write its headers again.
    :raises HeaderFrameTooLarge: its content header does not fit in one frame.
    """
    frames = carried_frames(msg, channel, frame_max)
    if frames is not None:
        return frames
    why = unwritable(msg)
    if why is not None:
        raise Unwritable(why)
    exchange, key = _short(msg.exchange), _short(msg.routing_key)
    if exchange is None or key is None:
        raise ValueError(f"exchange {msg.exchange!r} or key {msg.routing_key!r} past 255 bytes")
    method = _PUBLISH_METHOD + exchange + key + _MANDATORY
    header = _pack_content(60, 0, len(msg.body)) + b"".join(pika_properties(msg).encode())
    return content_frames(msg, channel, frame_max, method, header)


def pika_properties(msg: OutgoingMessage) -> pika.BasicProperties:
    """``msg``'s AMQP properties for pika (those an intake's message carries too). pika
    is imported here, not with the module: only its codec is used, and the core imports
    no broker client."""
    import pika

    if msg.properties:
        return pika.BasicProperties(
            **{
                "content_type": msg.content_type,
                "delivery_mode": 2,
                "message_id": msg.message_id,
                "timestamp": msg.timestamp_s,
                **msg.properties,
                "headers": msg.headers,
            }
        )
    return pika.BasicProperties(
        content_type=msg.content_type,
        delivery_mode=2,
        message_id=msg.message_id,
        timestamp=msg.timestamp_s,
        headers=msg.headers,
    )


_INT64_MIN, _INT64_END = -(2**63), 2**63


def unwritable(msg: OutgoingMessage) -> str | None:
    """Why pika cannot write ``msg``'s properties, or ``None``: pika reads some values it
    cannot write again (a float of 1e300 read as a 997-digit integer, a header name that
    is not UTF-8, tables nested past what it writes). Checked by encoding only when the
    headers hold more than strings, bytes, booleans and 64-bit integers."""
    why = _names_problem(msg.headers)
    if why is not None:
        return why
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


NAME_NOT_TEXT = "a header name is not UTF-8 text"
MAX_DEPTH = 100
"""Tables and arrays nested deeper than this are not written again (pika's encoder
recurses once a level; Python's stack is the limit)."""
TOO_DEEP = f"the headers nest tables or arrays more than {MAX_DEPTH} levels deep"


def _names_problem(table: dict[Any, Any], depth: int = 0) -> str | None:
    """Why ``table`` (or a table inside it) cannot be written: a key that is not a str
    (pika reads a name that is not UTF-8 as bytes, which delayq's stream cannot write),
    or nesting past :data:`MAX_DEPTH`; ``None`` when neither."""
    if depth > MAX_DEPTH:
        return TOO_DEEP
    for key, value in table.items():
        if type(key) is not str:
            return NAME_NOT_TEXT
        if type(value) not in _FLAT:
            why = _nested_problem(value, depth + 1)
            if why is not None:
                return why
    return None


_FLAT = frozenset({str, int, bytes, bool, float, type(None)})
"""Value types with no names inside (the common ones: checked without a call)."""


def _nested_problem(value: object, depth: int) -> str | None:
    if isinstance(value, dict):
        return _names_problem(value, depth)
    if isinstance(value, (list, tuple)):
        if depth > MAX_DEPTH:
            return TOO_DEEP
        for item in value:
            why = _nested_problem(item, depth + 1)
            if why is not None:
                return why
    return None
