"""Typed durations: ``timedelta`` or ``"1h30m"``-style strings outside, ``int`` ms inside.

A bare number is never accepted: ``30`` could mean seconds (aio-pika) or
milliseconds (pika), and guessing wrong delays a message a thousand times too
long or short.

>>> to_ms("1h30m")
5400000
>>> format_ms(90_000)
'1m30s'
"""

from __future__ import annotations

import functools
import math
import re
from datetime import timedelta

from delayq.errors import InvalidDelay
from delayq.wording import shortened, shown_int

__all__ = ["ACCEPTED_FORMS", "Duration", "format_ms", "to_ms", "to_timedelta"]

Duration = timedelta | str
"""A duration as delayq accepts it at its edges."""

ACCEPTED_FORMS = (
    "a datetime.timedelta, or a string of whole numbers with units ms, s, m, h, d "
    '(for example "500ms", "90s", "15m", "1h30m", "24h")'
)

_UNIT_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
_MAX_MS = timedelta.max // timedelta(milliseconds=1)
"""The longest duration there is: ``timedelta.max``, 999999999 days (18 digits in ms)."""
_PART = re.compile(r"([0-9]+)(ms|d|h|m|s)", re.ASCII)
_WHOLE = re.compile(r"(?:[0-9]+(?:ms|d|h|m|s))+", re.ASCII)


@functools.lru_cache(maxsize=1024)
def _parse(value: str, what: str) -> int:
    """Parse a duration string; cached, since a few delays serve millions of messages
    (a failure raises and is not cached)."""
    text = value.strip().replace(" ", "")
    shown = shortened(value)
    if not text:
        raise InvalidDelay(f"{what} is an empty string; expected {ACCEPTED_FORMS}")
    if text.startswith("="):  # `-d=-5s`: click gives a short option "=-5s"
        hint = (
            f"{what} {shown} starts with '=': a short option takes its value without one "
            "(-d 5s, or --delay=5s)"
        )
        try:
            _parse(text[1:], what)
        except InvalidDelay as exc:
            raise InvalidDelay(f"{exc}; {hint}") from None
        raise InvalidDelay(hint)
    if text.startswith("-"):
        raise InvalidDelay(f"{what} must not be negative, got {shown}")
    if text.isascii() and text.isdigit():
        raise InvalidDelay(_bare_number(what, value, text))
    if not _WHOLE.fullmatch(text):
        raise InvalidDelay(f"{what} {shown} is not a duration; expected {ACCEPTED_FORMS}")
    parts = _PART.findall(text)
    units = [unit for _, unit in parts]
    if len(set(units)) != len(units):
        raise InvalidDelay(f"{what} {shown} repeats a unit; expected {ACCEPTED_FORMS}")
    # Past 20 digits a part is longer than any duration; int() of one past 4,300 digits
    # raises ValueError (Python's limit), so it is never asked to.
    if any(len(n.lstrip("0")) > 20 for n, _ in parts):
        raise InvalidDelay(_too_long(what, shown))
    total = sum(int(n.lstrip("0") or "0") * _UNIT_MS[unit] for n, unit in parts)
    if total > _MAX_MS:
        raise InvalidDelay(_too_long(what, shown))
    return total


def _too_long(what: str, shown: str) -> str:
    return (
        f"{what} {shown} is longer than any duration (at most {_MAX_MS} ms, "
        "timedelta.max); delayq's ladders hold at most a few weeks"
    )


def to_ms(value: object, *, what: str = "delay") -> int:
    """Convert a duration to whole milliseconds (sub-millisecond parts round up).

    Raises :class:`~delayq.errors.InvalidDelay` for bare numbers, negatives,
    NaN, empty or unparseable strings; the message names the accepted forms.
    """
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise InvalidDelay(f"{what} must not be negative, got {value!r}")
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        return -(-micros // 1_000)
    if isinstance(value, str):
        return _parse(value, what)
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidDelay(f"{what} is {value!r}, not a duration; expected {ACCEPTED_FORMS}")
    if isinstance(value, bool):
        raise InvalidDelay(f"{what} {value!r} is a bool, not a duration; expected {ACCEPTED_FORMS}")
    if isinstance(value, (int, float)):
        raise InvalidDelay(_bare_number(what, value, value))
    raise InvalidDelay(
        f"{what} of type {type(value).__name__} is not accepted; expected {ACCEPTED_FORMS}"
    )


def _bare_number(what: str, value: object, number: object) -> str:
    """The refusal of a number without a unit, with the two ways to write it."""
    if isinstance(number, float) and not number.is_integer():
        how = f"timedelta(seconds={number!r})"
    else:
        whole = shown_int(int(number)) if isinstance(number, (int, float)) else str(number)
        if len(whole) <= 40 and whole.lstrip("-").isdigit():
            how = f'"{whole}s" (or "{whole}ms"), or timedelta(seconds={whole})'
        else:  # too long to repeat
            how = 'it with a unit, as in "90s" or timedelta(seconds=90)'
    return (
        f"{what} {_shown(value)} is a bare number, which has no unit: write {how}; "
        f"expected {ACCEPTED_FORMS}"
    )


def _shown(value: object) -> str:
    """``value`` for an error message, however long (an int past 4,300 digits cannot be
    printed at all)."""
    if isinstance(value, str):
        return shortened(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return shown_int(value)
    return repr(value)


def to_timedelta(ms: int) -> timedelta:
    """Milliseconds as a ``timedelta``."""
    return timedelta(milliseconds=ms)


def format_ms(ms: int) -> str:
    """Compact label for a duration in ms, hours first: ``5400000 -> "1h30m"``."""
    if ms < 0:
        raise ValueError(f"negative duration {ms} ms")
    if ms == 0:
        return "0s"
    parts = []
    for unit in ("h", "m", "s", "ms"):  # no days: the default ladder names its top tier "24h"
        size = _UNIT_MS[unit]
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
