"""The message on the wire, built by pure code shared by both publishers.

:class:`~delayq.message.factory.MessageFactory` validates everything a caller
passes (:mod:`delayq.message.validate`) and decides exchange, routing key, body
bytes and properties before any I/O, so bad input raises before anything is sent
and both adapters send the same bytes. This module holds what it builds.

Headers use the ``delayq-`` prefix (``x-`` belongs to the broker) and are
replaced on every hop, never stacked.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from json.encoder import JSONEncoder, c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from pydantic import BaseModel

from delayq.errors import (
    InvalidBody,
)
from delayq.message.limits import (
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    MAX_HEADERS,
)
from delayq.topology.cascade import Strategy

__all__ = [
    "CONTENT_BYTES",
    "CONTENT_JSON",
    "CONTENT_TEXT",
    "DEFAULT_MAX_BODY_BYTES",
    "ENVELOPE_VERSION",
    "HEADER_PREFIX",
    "H_ATTEMPT",
    "H_DELAY_MS",
    "H_DUE_AT",
    "H_GENERATION",
    "H_PUBLISHED_AT",
    "H_ROUTING_KEY",
    "H_TIER",
    "H_TIER_MS",
    "H_VERSION",
    "IMMEDIATE",
    "MAX_HEADERS",
    "MAX_HEADERS_BYTES",
    "Message",
    "OutgoingMessage",
    "Receipt",
    "encode_body",
    "envelope_headers",
    "epoch_ms",
    "new_message_id",
    "parse_json_body",
    "restamp",
]


ENVELOPE_VERSION = 1


HEADER_PREFIX = "delayq-"


H_VERSION = "delayq-version"


H_DELAY_MS = "delayq-delay-ms"


H_TIER = "delayq-tier"


H_TIER_MS = "delayq-tier-ms"


H_PUBLISHED_AT = "delayq-published-at"


H_DUE_AT = "delayq-due-at"


H_ATTEMPT = "delayq-attempt"


H_ROUTING_KEY = "delayq-routing-key"


H_GENERATION = "delayq-generation"
"""A rescheduled copy's generation (an int >= 1; absent: 0, never rescheduled). The
idempotency store keeps each key's live generation: a copy below it is cancelled.
Retries and dead letters carry it on (see ``docs/concepts/cancel.md``)."""


IMMEDIATE = "immediate"


CONTENT_JSON = "application/json"


CONTENT_TEXT = "text/plain; charset=utf-8"


CONTENT_BYTES = "application/octet-stream"


DEFAULT_MAX_BODY_BYTES = MAX_BODY_BYTES
"""16 MiB (see :mod:`delayq.message.limits` for why); a topology's ``limits`` may change it."""


MAX_HEADERS_BYTES = MAX_HEADER_BYTES


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


_UUID4_KEEP = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)
"""A random UUID's version (4) and variant (RFC 4122) bits, set as ``uuid.uuid4`` sets them."""


def new_message_id() -> str:
    """A fresh random message id: the 32 hex digits of a version 4 UUID, what
    ``uuid.uuid4().hex`` gives, at half its cost (no ``UUID`` object is made)."""
    return f"{int.from_bytes(os.urandom(16), 'big') & _UUID4_KEEP | _UUID4_SET:032x}"


@dataclass(frozen=True)
class Message:
    """One message of a ``publish_many`` batch; fields as for ``publish``."""

    body: object
    routing_key: str
    delay: object
    message_id: str | None = None
    headers: Mapping[str, Any] | None = None
    strategy: Strategy | str | None = None
    """``None``: the topology's default strategy."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """What the broker confirmed: which message, where it waits, when it is due."""

    message_id: str
    routing_key: str
    exchange: str
    tier: str | None
    """The tier's label (``"exact"`` for the cascade), or ``None`` for an immediate message."""
    delay_ms: int
    tier_ms: int
    """How long the message actually waits (a tier's TTL, or the cascade's whole units)."""
    published_at_ms: int
    strategy: Strategy = Strategy.TIERED
    hops: int = 0
    """Queues the message waits in: 1 for a tier, ``popcount(units)`` for the cascade,
    0 when immediate."""

    @property
    def delay(self) -> timedelta:
        """The delay the caller asked for."""
        return timedelta(milliseconds=self.delay_ms)

    @property
    def lateness(self) -> timedelta:
        """How much later than asked the message is due: the tier minus the delay."""
        return timedelta(milliseconds=self.tier_ms - self.delay_ms)

    @property
    def published_at(self) -> datetime:
        return datetime.fromtimestamp(self.published_at_ms / 1000, tz=timezone.utc)

    @property
    def due_at(self) -> datetime:
        """When the wait runs out and the message is routed to its destination."""
        return datetime.fromtimestamp((self.published_at_ms + self.tier_ms) / 1000, tz=timezone.utc)


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """Everything an adapter needs to send one message; no I/O object inside."""

    exchange: str
    routing_key: str
    body: bytes
    content_type: str
    message_id: str
    timestamp_s: int
    headers: dict[str, Any]
    receipt: Receipt
    properties: Mapping[str, Any] = field(default_factory=dict)
    """Further AMQP properties, pika's names (``correlation_id``, ``reply_to``, ``type``,
    ``app_id``, ``priority``, ``content_encoding``; ``content_type`` and ``timestamp``
    override the fields above): what an intake's bridge carries over from a message a
    plugin-style publisher sent, a task framework's (:mod:`delayq.integrations`); never
    ``expiration`` (:data:`delayq.message.frames.CARRIED`)."""


def encode_body(body: object) -> tuple[bytes, str]:
    """Bytes and content type for a body: bytes, str, a pydantic model or a JSON value.

    A JSON value's dict keys must be ``str``: JSON has no other, so ``{1: "a"}`` would
    arrive as ``{"1": "a"}``; such a body is refused (:class:`InvalidBody`). Tuples
    arrive as lists.
    """
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body), CONTENT_BYTES
    if isinstance(body, str):
        try:
            return body.encode("utf-8"), CONTENT_TEXT
        except UnicodeEncodeError as exc:
            raise InvalidBody(f"str body cannot be encoded as UTF-8 ({exc})") from exc
    if isinstance(body, _CONTAINERS):
        _check_keys(body)  # a model's own schema turns its keys back on validation
    try:
        value = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
        return _JSON(value).encode("utf-8"), CONTENT_JSON
    except RecursionError:
        raise InvalidBody(
            f"body of type {type(body).__name__} cannot be encoded: it is nested too deeply "
            "(past Python's recursion limit) or holds itself"
        ) from None
    except (TypeError, ValueError) as exc:
        raise InvalidBody(
            f"body of type {type(body).__name__} cannot be encoded ({exc}); pass bytes, "
            "str, a pydantic model, or a JSON value (dict, list, int, float, bool, None) "
            "without NaN or infinity"
        ) from exc


def parse_json_body(text: str | bytes, what: str = "body") -> Any:
    """``text`` parsed as JSON, or :class:`InvalidBody` for JSON Python's parser cannot
    hold: an integer past ``sys.get_int_max_str_digits()`` (4,300 by default) digits, or
    nesting past the recursion limit (both raised a bare ValueError or RecursionError).
    Invalid JSON raises ``json.JSONDecodeError``, for the caller to say how to write it.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # only the digit limit: any other is a JSONDecodeError
        raise InvalidBody(
            f"{what} holds an integer of more than {sys.get_int_max_str_digits()} digits, "
            "more than Python reads: send such a number as a JSON string"
        ) from exc
    except RecursionError as exc:
        raise InvalidBody(
            f"{what} is nested too deeply for Python to read (arrays or objects inside "
            f"one another past {sys.getrecursionlimit()} levels, about)"
        ) from exc


_CONTAINERS = (dict, list, tuple)


def _json_encoder() -> Callable[[object], str]:
    """One encoder for every body: the C one ``JSONEncoder.encode`` builds per call
    (``json.dumps`` with options builds a ``JSONEncoder`` too: together 1.2 µs a
    publish, 0.45 this way), shared by threads (it keeps no state between calls). Without
    markers, a body that holds itself ends in a RecursionError, said as such."""
    options = {"allow_nan": False, "separators": (",", ":"), "ensure_ascii": False}
    if c_make_encoder is None:  # no C accelerator (PyPy): the encoder in Python
        return JSONEncoder(**options, check_circular=False).encode  # type: ignore[arg-type]
    default = JSONEncoder().default  # a TypeError naming the type
    encode = c_make_encoder(None, default, encode_basestring, None, ":", ",", False, False, False)
    return lambda value: "".join(encode(value, 0))


_JSON = _json_encoder()


def _check_keys(body: object) -> None:
    """Refuse a dict key that is not a str anywhere in ``body`` (see :func:`encode_body`).

    Plain recursion, no paths built (this runs on every publish; a refusal walks again
    to name where); a cyclic or too deep body is left to json.dumps, whose refusal
    says so."""
    try:
        ok = _str_keys(body)
    except RecursionError:
        return
    if not ok:
        raise InvalidBody(_bad_key(body))


def _str_keys(value: Any) -> bool:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return False
            if isinstance(item, _CONTAINERS) and not _str_keys(item):
                return False
        return True
    return all(_str_keys(item) for item in value if isinstance(item, _CONTAINERS))


def _bad_key(body: object) -> str:
    """Where the first non-str dict key of ``body`` is, and what JSON would make of it."""
    stack: list[tuple[object, str]] = [(body, "body")]
    seen: set[int] = set()
    while stack:
        value, where = stack.pop()
        if not isinstance(value, (dict, list, tuple)) or id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    kind = type(key).__name__
                    fate = (
                        f"JSON would turn {key!r} into {json.dumps(key)!r}"
                        if isinstance(key, (int, float)) or key is None  # bool too
                        else f"JSON has no {kind} keys"
                    )
                    return f"{where} has the key {key!r} ({kind}): dict keys must be str; {fate}"
                stack.append((item, f"{where}[{key!r}]"))
        else:
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(value))
    return "a dict key is not a str"  # not reached: _check_keys found one


def envelope_headers(
    delay_ms: int,
    tier_label: str | None,
    tier_ms: int,
    now_ms: int,
    attempt: int,
    routing_key: str,
) -> dict[str, Any]:
    """The ``delayq-*`` headers of one hop (all ints or str: pika cannot send floats)."""
    return {
        H_VERSION: ENVELOPE_VERSION,
        H_DELAY_MS: delay_ms,
        H_TIER: tier_label or IMMEDIATE,
        H_TIER_MS: tier_ms,
        H_PUBLISHED_AT: now_ms,
        H_DUE_AT: now_ms + tier_ms,
        H_ATTEMPT: attempt,
        H_ROUTING_KEY: routing_key,
    }


def restamp(msg: OutgoingMessage, now_ms: int) -> OutgoingMessage:
    """``msg`` as if built at ``now_ms``: its publish time, due time and AMQP timestamp
    moved (a message that waited in its publisher for room counts its delay from when
    it is sent, not from when it was built). Everything else is unchanged."""
    shift = now_ms - msg.receipt.published_at_ms
    if shift == 0:
        return msg
    headers = dict(msg.headers)
    headers[H_PUBLISHED_AT] = now_ms
    headers[H_DUE_AT] = now_ms + msg.receipt.tier_ms
    return replace(
        msg,
        timestamp_s=now_ms // 1000,
        headers=headers,
        receipt=replace(msg.receipt, published_at_ms=now_ms),
    )
