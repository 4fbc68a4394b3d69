"""Checks of what a caller passes for a message (routing key, headers, message id).

Pure, and run before any I/O: bad input raises before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from delayq.errors import (
    HeadersTooLarge,
    InvalidHeaders,
    InvalidInput,
    InvalidMessageId,
    InvalidRoutingKey,
)
from delayq.message.envelope import HEADER_PREFIX
from delayq.message.limits import (
    DEFAULT_LIMITS,
    MessageLimits,
)
from delayq.wording import shown_int

__all__ = [
    "headers_size",
    "validate_headers",
    "validate_routing_key",
]

_INT64 = (-(2**63), 2**63 - 1)


def _utf8_len(value: str, error: type[InvalidInput], what: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise error(f"{what} cannot be encoded as UTF-8 ({exc})") from None


def validate_routing_key(routing_key: object) -> str:
    """A routing key is a non-empty str of at most 255 bytes without wildcards."""
    if not isinstance(routing_key, str):
        raise InvalidRoutingKey(f"routing key must be a str, got {type(routing_key).__name__}")
    if not routing_key:
        raise InvalidRoutingKey("routing key must not be empty")
    size = _utf8_len(routing_key, InvalidRoutingKey, "routing key")
    if size > 255:
        raise InvalidRoutingKey(
            f"routing key is {size} bytes long (UTF-8); AMQP allows at most 255 bytes"
        )
    if "*" in routing_key or "#" in routing_key:
        raise InvalidRoutingKey(
            f"routing key {routing_key!r} contains a wildcard ('*' or '#'); wildcards belong "
            "in binding keys, a message is published with a concrete key"
        )
    return routing_key


def _check_value(key: str, value: object, depth: int = 0) -> int:
    """Validate one header value; return the most bytes AMQP needs for it, type tag included.

    Field-table encoding: str and bytes are a 4-byte length and the data, ints at
    most 8 bytes (pika and pamqp pick the smallest width), a bool 1, None 0, an
    array a 4-byte length and its tagged values, a table a 4-byte length and its
    entries (a 1-byte name length, the name, the tagged value).
    """
    if depth > 8:
        raise InvalidHeaders(f"header {key!r} is nested more than 8 levels deep")
    if value is None:
        return 1
    if isinstance(value, bool):
        return 2
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            # shown_int: str() of an int past 4,300 digits raises ValueError
            raise InvalidHeaders(
                f"header {key!r}: {shown_int(value)} does not fit in signed 64 bits "
                "(-2**63 to 2**63 - 1), the widest int AMQP carries: send it as a str"
            )
        return 9
    if isinstance(value, str):
        return 5 + _utf8_len(value, InvalidHeaders, f"header {key!r}")
    if isinstance(value, bytes):
        return 5 + len(value)
    if isinstance(value, float):
        raise InvalidHeaders(
            f"header {key!r} is a float ({value!r}); pika cannot encode floats in headers: "
            "send an int (with the unit in the name, like 'price-cents') or a str"
        )
    if isinstance(value, (list, tuple)):
        return 5 + sum(_check_value(key, v, depth + 1) for v in value)
    if isinstance(value, Mapping):
        return 1 + _table_size(key, value, depth + 1)
    raise InvalidHeaders(
        f"header {key!r} has a value of type {type(value).__name__}; allowed: str, int, "
        "bool, bytes, None, and lists or dicts of those"
    )


def _table_size(where: str, table: Mapping[Any, Any], depth: int) -> int:
    """Validate a field table's names and values; return its encoded size (at most)."""
    size = 4
    for name, value in table.items():
        if not isinstance(name, str) or not name:
            raise InvalidHeaders(
                f"header {where!r} has a name that is not a non-empty str: {name!r}"
            )
        length = _utf8_len(name, InvalidHeaders, "header name")
        if length > 255:
            raise InvalidHeaders(f"header name {name[:40]!r}... is longer than 255 bytes")
        size += 1 + length + _check_value(name if depth == 0 else where, value, depth)
    return size


def headers_size(headers: Mapping[str, Any]) -> int:
    """The most bytes AMQP needs to encode ``headers`` as a field table (validating them)."""
    return _table_size("(headers)", headers, 0)


def validate_headers(headers: object, limits: MessageLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """User headers: str keys without the reserved ``delayq-``/``x-`` prefixes, AMQP values,
    within ``limits`` (:class:`~delayq.errors.HeadersTooLarge` otherwise)."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidHeaders(f"headers must be a mapping, got {type(headers).__name__}")
    if len(headers) > limits.max_headers:
        raise HeadersTooLarge(
            f"{len(headers)} headers; at most {limits.max_headers} are allowed "
            "(limits.max_headers; put large data in the body)"
        )
    for key in headers:
        if not isinstance(key, str) or not key:
            raise InvalidHeaders(f"header names must be non-empty str, got {key!r}")
        lowered = key.lower()
        if lowered.startswith(HEADER_PREFIX) or lowered.startswith("x-"):
            raise InvalidHeaders(
                f"header {key!r} uses a reserved prefix: 'delayq-' belongs to delayq and "
                "'x-' to RabbitMQ"
            )
    size = headers_size(headers)
    if size > limits.max_header_bytes:
        raise HeadersTooLarge(
            f"headers take {size} bytes encoded; at most {limits.max_header_bytes} are "
            "allowed (limits.max_header_bytes: the headers and delayq's own must fit in one "
            "AMQP frame; put large data in the body)"
        )
    return {key: _plain(value) for key, value in headers.items()}


def _plain(value: Any) -> Any:
    """Tuples as lists and mappings as dicts: the only containers pika and pamqp encode."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def validate_message_id(message_id: object) -> str:
    if not isinstance(message_id, str):
        raise InvalidMessageId(f"message id must be a str, got {type(message_id).__name__}")
    if not message_id or _utf8_len(message_id, InvalidMessageId, "message id") > 255:
        raise InvalidMessageId("message id must be 1 to 255 bytes long")
    return message_id
