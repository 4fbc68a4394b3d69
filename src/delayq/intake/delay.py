"""An ``x-delay`` header read as the delayed-message-exchange plugin read it.

The plugin took integers of any AMQP width as milliseconds, a string of digits
(``binary_to_integer``) and a float or decimal (truncated); a delay of 0 or less, or
none at all, meant now. What it could not read it delivered at once, silently; an
intake parks it instead, with the reason (:class:`BadDelay`).

>>> read_delay({"x-delay": 5000}), read_delay({"x-delay": b"1500"}), read_delay({})
(5000, 1500, 0)
>>> read_delay({"x-delay": -20}), read_delay({"x-delay": 2.9})
(0, 2)
>>> read_delay({"x-delay": "soon"}).reason[:45]
"x-delay 'soon' is not a number of millisecond"
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = ["X_DELAY", "BadDelay", "read_delay"]

X_DELAY = "x-delay"

_DIGITS = re.compile(r"[+-]?[0-9]+")
"""What Erlang's ``binary_to_integer`` takes: an optional sign and digits, nothing else."""

_DIGITS_READ = 30
"""An x-delay string of more digits is read as ``10**30`` ms, past any tier."""


@dataclass(frozen=True)
class BadDelay:
    """An ``x-delay`` the plugin could not have read as a delay."""

    reason: str

    def __repr__(self) -> str:
        return f"BadDelay(reason={self.reason!r})"


def read_delay(headers: Mapping[str, Any] | None) -> int | BadDelay:
    """The delay in ms ``headers`` ask for (0: now), or why it cannot be read."""
    if not headers or X_DELAY not in headers:
        return 0
    value = headers[X_DELAY]
    if isinstance(value, bool):
        return BadDelay(f"x-delay {value!r} is a boolean, not a number of milliseconds")
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, (float, Decimal)):
        if not math.isfinite(value):
            return BadDelay(f"x-delay {value!r} is not a finite number of milliseconds")
        return max(0, math.trunc(value))
    if isinstance(value, (bytes, bytearray, str)):
        if isinstance(value, str):
            text = value
        else:
            try:
                text = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                return BadDelay(f"x-delay {bytes(value)!r} is not UTF-8 text")
        if _DIGITS.fullmatch(text) is None:
            return BadDelay(
                f"x-delay {text!r} is not a number of milliseconds (an integer, or a string "
                "of digits)"
            )
        digits = text.lstrip("+-").lstrip("0") or "0"
        if text.startswith("-"):
            return 0
        # longer than any delay alike; int() of 4,300+ digits would raise ValueError
        return 10**_DIGITS_READ if len(digits) > _DIGITS_READ else int(digits)
    return BadDelay(
        f"x-delay of type {type(value).__name__} ({value!r}) is not a number of milliseconds"
    )
