"""Words for messages to people: counted nouns ("1 message", "2 messages"), and values
too long to print whole."""

from __future__ import annotations

import math

__all__ = ["counted", "shortened", "shown_int"]

_SHOWN_DIGITS = 40


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, plural unless ``count`` is 1 (``plural`` for irregular ones).

    >>> counted(1, "retry", "retries"), counted(3, "message")
    ('1 retry', '3 messages')
    """
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def shown_int(value: int) -> str:
    """``value`` as digits, or, past 40 of them, how many it has: ``str()`` of an int
    over 4,300 digits raises ValueError (Python's limit), and in an error message such a
    number says nothing more than its size.

    >>> shown_int(-12), shown_int(10**50)
    ('-12', 'a 51-digit number')
    """
    if abs(value) < 10**_SHOWN_DIGITS:
        return str(value)
    # counted from the bit length (str() is what fails): the estimate is the count or one
    # short of it, and one comparison tells which
    digits = int(abs(value).bit_length() * math.log10(2))
    digits += abs(value) >= 10**digits
    return f"a {'negative ' if value < 0 else ''}{digits}-digit number"


def shortened(text: str, limit: int = 60) -> str:
    """``text`` quoted, its middle cut when longer than ``limit``: a 5,000-character
    value in an error message hides the message.

    >>> shortened("9" * 100, 20)
    "'99999999...99999999' (100 characters)"
    """
    if len(text) <= limit:
        return repr(text)
    half = (limit - 4) // 2
    return f"{text[:half] + '...' + text[-half:]!r} ({len(text)} characters)"
