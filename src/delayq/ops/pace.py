"""The pace of a bulk resend (``delayq dlq replay --rate``, ``replay(rate_per_s=)``): a
number of messages per second, checked once for both (pure).

>>> check_rate(0.5)
0.5
"""

from __future__ import annotations

import math

from delayq.errors import InvalidInput

__all__ = ["MAX_RATE_PER_S", "MIN_RATE_PER_S", "check_rate"]

MIN_RATE_PER_S = 1 / 86_400
"""One message a day: slower, the pause between two messages is no pace but a hang (at
``1e-300`` its ``1e300`` seconds overflowed ``time.sleep``, after the first message)."""

MAX_RATE_PER_S = 1e12
"""Far past what a broker takes: a bound that keeps ``inf`` out."""


def check_rate(rate_per_s: object) -> float:
    """``rate_per_s`` (messages per second) as a float, if finite and from
    :data:`MIN_RATE_PER_S` to :data:`MAX_RATE_PER_S`; else
    :class:`~delayq.errors.InvalidInput` saying why."""
    if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, (int, float)):
        raise InvalidInput(
            f"the rate must be a number of messages per second, got {type(rate_per_s).__name__}"
        )
    try:
        rate = float(rate_per_s)
    except OverflowError:  # an int past a float's range
        rate = math.inf
    if not math.isfinite(rate) or rate <= 0:
        raise InvalidInput(
            f"the rate must be a finite number above 0 (messages per second), got {rate:g}"
        )
    if rate < MIN_RATE_PER_S:
        raise InvalidInput(
            f"rate {rate:g} per second is slower than one message a day "
            f"({MIN_RATE_PER_S:.3g} per second): a message every {1 / rate:.3g} s is a hang, "
            "not a pace"
        )
    if rate > MAX_RATE_PER_S:
        raise InvalidInput(f"rate {rate:g} per second is more than {MAX_RATE_PER_S:g}")
    return rate
