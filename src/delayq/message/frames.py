"""AMQP 0-9-1 frames of a delayq publish, encoded by hand: the publishers' hot path
(the asyncio frame link's, and the sync pipeline's for messages with no further AMQP
properties).

A publish is three frames or more: ``Basic.Publish`` (mandatory), a content
header with the properties delayq sets (``content_type``, ``headers``,
``delivery_mode`` 2, ``priority`` 0, ``message_id``, ``timestamp``; the same as
:func:`delayq.aio._link.aio_message` and :func:`delayq.sync._sending.pika_properties`),
and the body, split into frames of at most ``frame_max`` bytes. pamqp encodes
the same bytes at about three times the cost (its generic property and table
encoders): the header tables of delayq's messages (strings and integers) are
encoded here, anything else (a user's nested table, a list, bytes) by pamqp's own
``field_table``, with the integer types pamqp picks, so a consumer reads what
the aio-pika link sent. A message with further properties (a task framework's, an
intake's: :func:`carried_header`) has its content header encoded by pamqp. Pure: no
I/O, the same for both adapters.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from pamqp import encode
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from delayq.errors import InvalidInput
from delayq.message import outcomes
from delayq.message.envelope import OutgoingMessage

__all__ = [
    "CARRIED",
    "FRAME_OVERHEAD",
    "carried_header",
    "content_frames",
    "pamqp_value",
    "publish_frames",
    "table",
]

FRAME_OVERHEAD = 8
"""Bytes a frame adds to its payload: type, channel, size, frame end."""

_END = b"\xce"
_FRAME = struct.Struct(">BHI")
_HEADER = struct.Struct(">HHQH")  # class 60, weight 0, body size, property flags
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_FLAGS = (1 << 15) | (1 << 13) | (1 << 12) | (1 << 11) | (1 << 7) | (1 << 6)
"""content_type, headers, delivery_mode, priority (0, as aio-pika sends), message_id, timestamp."""
_PUBLISH_METHOD = b"\x00\x3c\x00\x28\x00\x00"  # class 60 Basic, method 40 Publish, ticket 0
_MANDATORY = b"\x01"
_PERSISTENT_PRIORITY_0 = b"\x02\x00"

_pack_frame = _FRAME.pack
_pack_header = _HEADER.pack
_pack_u32 = _U32.pack
_pack_u64 = _U64.pack


def _short(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError(f"{value[:40]!r}... is longer than an AMQP short string (255 bytes)")
    return bytes((len(raw),)) + raw


_SHORTS: dict[str, bytes] = {}
_SHORTS_KEPT = 4096


def _name(value: str) -> bytes:
    """A short string that recurs (a header key, an exchange, a routing key), encoded once."""
    raw = _SHORTS.get(value)
    if raw is None:
        raw = _short(value)
        if len(_SHORTS) < _SHORTS_KEPT:
            _SHORTS[value] = raw
    return raw


_B = struct.Struct(">b").pack
_S = struct.Struct(">h").pack
_SU = struct.Struct(">H").pack
_I = struct.Struct(">i").pack
_IU = struct.Struct(">I").pack
_L = struct.Struct(">q").pack


def _integer(value: int) -> bytes:
    # pamqp's choice of type (encode.table_integer), which aio-pika sends.
    if -128 <= value <= 127:
        return b"b" + _B(value)
    if -32768 <= value <= 32767:
        return b"s" + _S(value)
    if 0 <= value <= 65535:
        return b"u" + _SU(value)
    if -2147483648 <= value <= 2147483647:
        return b"I" + _I(value)
    if 0 <= value <= 4294967295:
        return b"i" + _IU(value)
    if -9223372036854775808 <= value <= 9223372036854775807:
        return b"l" + _L(value)
    return encode.table_integer(value)  # pamqp's error past 64 bits


def table(headers: Mapping[str, Any]) -> bytes:
    """``headers`` as an AMQP field table (its 4-byte size first)."""
    parts: list[bytes] = []
    pairs = _PAIRS
    for key in sorted(headers):  # pamqp's order
        value = headers[key]
        kind = type(value)
        if kind is not str and kind is not int:  # bool, None, nested, bytes: pamqp's encoding
            return encode.field_table(dict(_pamqp_headers(headers)))
        pair = pairs.get((key, value))
        if pair is None:
            if kind is str:
                raw = value.encode()
                pair = _name(key) + b"S" + _pack_u32(len(raw)) + raw
                recurs = len(raw) <= 64
            else:
                pair = _name(key) + _integer(value)
                recurs = -2147483648 <= value <= 2147483647  # not a timestamp
            if recurs and len(pairs) < _PAIRS_KEPT:
                pairs[(key, value)] = pair
        parts.append(pair)
    payload = b"".join(parts)
    return _pack_u32(len(payload)) + payload


_METHODS: dict[tuple[str, str], bytes] = {}
"""``Basic.Publish`` payloads by exchange and routing key (a publisher's recur)."""

_PAIRS: dict[tuple[str, object], bytes] = {}
_PAIRS_KEPT = 4096
"""Header pairs that recur (delayq's version, tier, delay; a user's tenant), encoded once."""


def pamqp_value(value: Any) -> Any:
    """pamqp encodes byte strings only as ``bytearray`` (pika only as ``bytes``)."""
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, list):
        return [pamqp_value(v) for v in value]
    if isinstance(value, dict):
        return {k: pamqp_value(v) for k, v in value.items()}
    return value


def _pamqp_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    return {k: pamqp_value(v) for k, v in headers.items()}


def publish_frames(msg: OutgoingMessage, channel: int, frame_max: int) -> bytes:
    """The frames publishing ``msg`` (mandatory, persistent) on ``channel``.

    :raises HeaderFrameTooLarge: its content header does not fit in one frame of
        ``frame_max`` (the connection's, negotiated with the broker).
    """
    route = (msg.exchange, msg.routing_key)
    method = _METHODS.get(route)
    if method is None:
        method = _PUBLISH_METHOD + _name(msg.exchange) + _name(msg.routing_key) + _MANDATORY
        if len(_METHODS) < _SHORTS_KEPT:
            _METHODS[route] = method
    if msg.properties:
        return content_frames(msg, channel, frame_max, method, carried_header(msg))
    properties = (
        _name(msg.content_type)
        + table(msg.headers)
        + _PERSISTENT_PRIORITY_0
        + _short(msg.message_id)
        + _pack_u64(msg.timestamp_s)
    )
    header = _pack_header(60, 0, len(msg.body), _FLAGS) + properties
    return content_frames(msg, channel, frame_max, method, header)


_PAMQP_NAMES = {"type": "message_type"}
CARRIED = frozenset(
    ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
     "reply_to", "message_id", "timestamp", "type", "user_id", "app_id")
)  # fmt: skip
"""The AMQP properties a message may carry beyond delayq's own, pika's names. Not
``expiration``: a message's own TTL would end its wait in a tier early."""


def carried_header(msg: OutgoingMessage) -> bytes:
    """The content header payload of ``msg`` with its further properties
    (:attr:`OutgoingMessage.properties`: an intake's, a task framework's), by pamqp.

    :raises InvalidInput: a property AMQP has not, ``expiration``, or a value of the
        wrong type.
    """
    properties = msg.properties
    unknown = properties.keys() - CARRIED
    if unknown:
        raise InvalidInput(
            f"AMQP properties {sorted(unknown)!r} cannot be carried through the tiers "
            f"(carried: {', '.join(sorted(CARRIED))}; an expiration would end the wait early)"
        )
    fields: dict[str, Any] = {
        "content_type": msg.content_type,
        "delivery_mode": 2,
        "priority": 0,  # as the fast path and aio-pika send
        "message_id": msg.message_id,
        "timestamp": msg.timestamp_s,
        **{_PAMQP_NAMES.get(k, k): v for k, v in properties.items()},
        "headers": _pamqp_headers(msg.headers),
    }
    stamp = fields["timestamp"]
    if isinstance(stamp, int) and not isinstance(stamp, bool):
        fields["timestamp"] = datetime.fromtimestamp(stamp, tz=timezone.utc)
    try:
        header = ContentHeader(0, len(msg.body), Basic.Properties(**fields))
        return header.marshal()
    except (TypeError, ValueError, OverflowError, struct.error) as exc:
        raise InvalidInput(f"AMQP properties {dict(properties)!r} cannot be sent: {exc}") from None


def content_frames(
    msg: OutgoingMessage, channel: int, frame_max: int, method: bytes, header: bytes
) -> bytes:
    """A publish's frames from its encoded ``Basic.Publish`` and content header payloads:
    the method, the header and ``msg``'s body in frames of at most ``frame_max`` bytes.

    :raises HeaderFrameTooLarge: the content header does not fit in one frame.
    """
    if len(header) + FRAME_OVERHEAD > frame_max:  # the broker would close the connection
        raise outcomes.header_frame_too_large(msg, len(header) + FRAME_OVERHEAD, frame_max)
    parts = [
        _pack_frame(1, channel, len(method)),
        method,
        _END,
        _pack_frame(2, channel, len(header)),
        header,
        _END,
    ]
    body = msg.body
    size = len(body)
    limit = frame_max - FRAME_OVERHEAD
    if size <= limit:
        if size:
            parts += (_pack_frame(3, channel, size), body, _END)
    else:
        view = memoryview(body)
        for start in range(0, size, limit):
            chunk = view[start : start + limit]
            parts += (_pack_frame(3, channel, len(chunk)), bytes(chunk), _END)
    return b"".join(parts)
