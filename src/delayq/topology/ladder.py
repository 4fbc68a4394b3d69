"""The tier ladder and the choice of tier for a delay.

Each tier is one queue whose every message has the same TTL, so queue order is
expiry order: RabbitMQ expires messages only at the head of a queue, and a
per-message TTL would make a 1 s message wait behind a 10 s one.

>>> ladder = Ladder.parse(["1s", "2s", "4s"])
>>> ladder.select_ms(1_500).label
'2s'
>>> ladder.select_ms(0) is None  # immediate
True
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta

from delayq.durations import format_ms, to_ms
from delayq.errors import DelayTooLong, InvalidTopology

__all__ = ["DEFAULT_LADDER", "MAX_TIER_MS", "Ladder", "Tier"]

MAX_TIER_MS = 2**31 - 1
"""The longest tier TTL accepted (about 24.8 days), within RabbitMQ's timer range."""


@dataclass(frozen=True, order=True)
class Tier:
    """One rung of the ladder: a queue whose messages all wait ``ttl_ms``."""

    ttl_ms: int

    @property
    def label(self) -> str:
        """The tier's name, which carries its TTL (``"30s"``, ``"1h30m"``)."""
        return format_ms(self.ttl_ms)

    @property
    def ttl(self) -> timedelta:
        return timedelta(milliseconds=self.ttl_ms)

    def __str__(self) -> str:
        return self.label


class Ladder:
    """An ordered, duplicate-free set of tiers."""

    __slots__ = ("_ms", "tiers")

    def __init__(self, tiers_ms: Iterable[int]) -> None:
        values = sorted(tiers_ms)
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidTopology(f"tier TTLs are whole milliseconds (int), got {value!r}")
        if not values:
            raise InvalidTopology("a ladder needs at least one tier")
        for prev, cur in itertools.pairwise(values):
            if prev == cur:
                raise InvalidTopology(f"the ladder lists the tier {format_ms(cur)} twice")
        if values[0] <= 0:
            raise InvalidTopology("every tier must be longer than 0 ms")
        if values[-1] > MAX_TIER_MS:
            raise InvalidTopology(
                f"tier {format_ms(values[-1])} is longer than the maximum {format_ms(MAX_TIER_MS)}"
            )
        self._ms: tuple[int, ...] = tuple(values)
        self.tiers: tuple[Tier, ...] = tuple(Tier(v) for v in values)

    @classmethod
    def parse(cls, durations: Iterable[object]) -> Ladder:
        """Build a ladder from durations (``"30s"``, ``timedelta``)."""
        try:
            return cls(to_ms(d, what="tier") for d in durations)
        except ValueError as exc:
            if isinstance(exc, InvalidTopology):
                raise
            raise InvalidTopology(f"invalid ladder: {exc}") from exc

    @property
    def max_ms(self) -> int:
        return self._ms[-1]

    def select_ms(self, delay_ms: int) -> Tier | None:
        """The smallest tier at or above ``delay_ms``; ``None`` means immediate (0 ms).

        Raises :class:`~delayq.errors.DelayTooLong` above the largest tier.
        """
        if delay_ms <= 0:
            return None
        index = bisect.bisect_left(self._ms, delay_ms)
        if index == len(self._ms):
            raise DelayTooLong(
                f"delay {format_ms(delay_ms)} is longer than the largest tier "
                f"{format_ms(self.max_ms)}; add a longer tier to the ladder"
            )
        return self.tiers[index]

    def select(self, delay: object) -> Tier | None:
        """Like :meth:`select_ms` for a ``timedelta`` or ``"15m"``-style string."""
        return self.select_ms(to_ms(delay))

    def __iter__(self) -> Iterator[Tier]:
        return iter(self.tiers)

    def __len__(self) -> int:
        return len(self.tiers)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ladder) and other._ms == self._ms

    def __hash__(self) -> int:
        return hash(self._ms)

    def __repr__(self) -> str:
        return f"Ladder([{', '.join(repr(t.label) for t in self.tiers)}])"


DEFAULT_LADDER = Ladder.parse(["30s", "1m", "5m", "30m", "1h", "3h", "6h", "12h", "24h"])
