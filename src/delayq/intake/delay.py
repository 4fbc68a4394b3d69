"""An ``x-delay`` header read as the delayed-message-exchange plugin read it, and the
delivery annotations of RabbitMQ 4.4's own delayed messages read alike.

The plugin took integers of any AMQP width as milliseconds, a string of digits
(``binary_to_integer``) and a float or decimal (truncated); a delay of 0 or less, or
none at all, meant now. What it could not read it delivered at once, silently; an
intake parks it instead, with the reason (:class:`BadDelay`).

Without ``x-delay``, an intake reads ``x-opt-delivery-delay`` (milliseconds from now,
the same way) or ``x-opt-delivery-time`` (a Unix time in milliseconds, or an AMQP
timestamp): what a publisher written for RabbitMQ 4.4's delayed messages in quorum queues
sends, so it can publish to an intake unchanged.

>>> read_delay({"x-delay": 5000}), read_delay({"x-delay": b"1500"}), read_delay({})
(5000, 1500, 0)
>>> read_delay({"x-delay": -20}), read_delay({"x-delay": 2.9})
(0, 2)
>>> read_delay({"x-delay": "soon"}).reason[:45]
"x-delay 'soon' is not a number of millisecond"
>>> read_delay({"x-opt-delivery-time": 1_000_090_000}, now_ms=1_000_000_000)
90000
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

__all__ = [
    "DELAY_HEADERS",
    "X_DELAY",
    "X_DELIVERY_DELAY",
    "X_DELIVERY_TIME",
    "BadDelay",
    "read_delay",
]

X_DELAY = "x-delay"
X_DELIVERY_DELAY = "x-opt-delivery-delay"
"""RabbitMQ 4.4's relative delay annotation (milliseconds)."""
X_DELIVERY_TIME = "x-opt-delivery-time"
"""RabbitMQ 4.4's absolute delivery time annotation (Unix milliseconds)."""
DELAY_HEADERS = (X_DELAY, X_DELIVERY_DELAY, X_DELIVERY_TIME)
"""The headers an intake reads a delay from, in the order it looks (the first present
decides; the others are not read)."""

_DIGITS = re.compile(r"[+-]?[0-9]+")
"""What Erlang's ``binary_to_integer`` takes: an optional sign and digits, nothing else."""

_LONGEST = 25
"""Digits past which a string of digits is read as 10**25 ms: longer than any delay a
duration holds (8.64e16 ms has 17), whatever the rest says."""


@dataclass(frozen=True)
class BadDelay:
    """An ``x-delay`` the plugin could not have read as a delay."""

    reason: str

    def __repr__(self) -> str:
        return f"BadDelay(reason={self.reason!r})"


def read_delay(headers: Mapping[str, Any] | None, *, now_ms: int | None = None) -> int | BadDelay:
    """The delay in ms ``headers`` ask for (0: now), or why it cannot be read; ``now_ms``
    (default: the clock) is what an ``x-opt-delivery-time`` counts from."""
    if not headers:
        return 0
    for name in DELAY_HEADERS:
        if name in headers:
            value = headers[name]
            if name != X_DELIVERY_TIME:
                return _milliseconds(name, value)
            if isinstance(value, datetime):  # an AMQP timestamp (whole seconds)
                when = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
                due: int | BadDelay = int(when.timestamp()) * 1000
            else:
                due = _milliseconds(name, value)
            if isinstance(due, BadDelay):
                return due
            now = int(time.time() * 1000) if now_ms is None else now_ms
            return max(0, due - now)
    return 0


def _milliseconds(name: str, value: Any) -> int | BadDelay:
    if isinstance(value, bool):
        return BadDelay(f"{name} {value!r} is a boolean, not a number of milliseconds")
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, (float, Decimal)):
        if not math.isfinite(value):
            return BadDelay(f"{name} {value!r} is not a finite number of milliseconds")
        return max(0, math.trunc(value))
    if isinstance(value, (bytes, bytearray, str)):
        if isinstance(value, str):
            text = value
        else:
            try:
                text = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                return BadDelay(f"{name} {bytes(value)!r} is not UTF-8 text")
        if _DIGITS.fullmatch(text) is None:
            return BadDelay(
                f"{name} {text!r} is not a number of milliseconds (an integer, or a string "
                "of digits)"
            )
        magnitude = text.lstrip("+-").lstrip("0")
        if len(magnitude) > _LONGEST:  # past any delay; int() refuses 4,300 digits
            return 0 if text.startswith("-") else 10**_LONGEST
        return 0 if text.startswith("-") else int(magnitude or "0")
    return BadDelay(
        f"{name} of type {type(value).__name__} ({value!r}) is not a number of milliseconds"
    )
