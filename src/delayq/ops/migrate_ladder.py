"""The ladder ``delayq migrate plan`` writes, and what it says about it (pure).

Without a sample of the delays publishers use, the default ladder; a delay waits for
the smallest tier at or above it, so ``x-delay: 1500`` waits 30 s there, and the plan
says so. With a sample (``--delays``), the best ladder of :data:`TIERS` tiers for it
(:func:`delayq.topology.fit.recommend_on_grid`), its top kept at the default's (24h),
or at the longest delay seen if that is longer: a delay the default ladder took is
never parked because the sample did not show it. Tiers the fit leaves unused split
the widest gaps of the ladder, so an unseen delay waits less for its tier.

>>> fitted_ladder({1_000: 5, 2_000: 5}).tiers_ms[:2], format_ms(fitted_ladder({1_000: 1}).top_ms)
((1000, 2000), '24h')
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from delayq.durations import format_ms
from delayq.errors import InvalidInput
from delayq.topology.fit import DEFAULT_GRID_MS, ladder_overshoot, recommend_on_grid
from delayq.topology.ladder import DEFAULT_LADDER, MAX_TIER_MS
from delayq.wording import counted

__all__ = ["GRID_MS", "TIERS", "PlannedLadder", "default_ladder", "fitted_ladder"]

TIERS = 9
"""Tiers of a fitted ladder: as many as the default ladder has."""

_S, _H = 1_000, 3_600_000

GRID_MS: tuple[int, ...] = (*(v * _S for v in (1, 2, 5, 10)), *DEFAULT_GRID_MS)
"""The values a fitted ladder's tiers are taken from: the recommendation's grid, with
tiers under 15 s, which plugin publishers' delays of a second or two need."""


@dataclass(frozen=True)
class PlannedLadder:
    """The ladder of a migration topology and the sentence the plan prints about it."""

    tiers_ms: tuple[int, ...]
    note: str

    @property
    def labels(self) -> list[str]:
        return [format_ms(ms) for ms in self.tiers_ms]

    @property
    def top_ms(self) -> int:
        return self.tiers_ms[-1]


def default_ladder() -> PlannedLadder:
    """The default ladder, and how late it delivers a delay under its smallest tier."""
    tiers = tuple(t.ttl_ms for t in DEFAULT_LADDER.tiers)
    smallest = format_ms(tiers[0])
    return PlannedLadder(
        tiers,
        f"{' '.join(format_ms(t) for t in tiers)} (the default: no --delays). A message "
        f"waits for the smallest tier at or above its x-delay: any x-delay under "
        f"{smallest} arrives after {smallest} (x-delay 1500 arrives "
        f"{format_ms(tiers[0] - 1_500)} late). For closer tiers pass --delays FILE "
        "(observed x-delay values) or edit the ladder in the file",
    )


def fitted_ladder(delays: Mapping[int, int]) -> PlannedLadder:
    """The best ladder of :data:`TIERS` tiers for ``delays`` (ms -> messages), its top at
    or above the default ladder's, and the lateness it gives them."""
    seen = sorted(ms for ms, count in delays.items() if ms > 0 and count > 0)
    if not seen:
        raise InvalidInput("the delays sample holds no positive delay")
    if seen[-1] > MAX_TIER_MS:
        raise InvalidInput(
            f"the delays sample holds x-delay {seen[-1]} ({format_ms(seen[-1])}), longer "
            f"than the longest tier delayq takes, {format_ms(MAX_TIER_MS)}"
        )
    grid = list(GRID_MS)
    if seen[-1] > grid[-1]:  # past the grid: the whole hour at or above it
        grid.append(min(MAX_TIER_MS, -(-seen[-1] // _H) * _H))
    fit = recommend_on_grid(delays, TIERS, grid_ms=grid, min_top_ms=DEFAULT_LADDER.max_ms)
    tiers = _filled(sorted(fit.tiers_ms), grid, TIERS)
    served = ladder_overshoot(delays, tiers)
    latest = max(tiers[bisect.bisect_left(tiers, ms)] - ms for ms in seen)
    span = format_ms(seen[0]) + (f" to {format_ms(seen[-1])}" if len(seen) > 1 else "")
    lateness = (
        f"The observed delays arrive up to {format_ms(latest)} late: "
        f"{served.mean_relative_overshoot:.1%} of their delay on average, "
        f"{served.max_ratio:.2f} times it at worst"
        if latest
        else "Each observed delay is a tier's: none arrives late"
    )
    return PlannedLadder(
        tuple(tiers),
        f"{' '.join(format_ms(t) for t in tiers)} (fitted to "
        f"{counted(served.messages, 'observed x-delay')}, {span}; the top at least "
        f"the default's {format_ms(DEFAULT_LADDER.max_ms)}, so no delay the default takes "
        f"is parked). {lateness}",
    )


def _filled(tiers: list[int], grid: Sequence[int], count: int) -> list[int]:
    """``tiers`` with grid values added, up to ``count``: each into the widest gap (by
    ratio) between two tiers that a grid value falls in, the value splitting it most
    evenly. Adding a tier never makes a delay wait longer, so the fit's choice for the
    sample stands."""
    tiers = sorted(tiers)
    while len(tiers) < count:
        gaps: dict[int, list[int]] = {}  # the upper tier's index: grid values inside
        for value in grid:
            index = bisect.bisect_left(tiers, value)
            if 0 < index < len(tiers) and tiers[index] != value:
                gaps.setdefault(index, []).append(value)
        if not gaps:
            break
        upper = max(gaps, key=lambda i: (tiers[i] / tiers[i - 1], -i))
        low, high = tiers[upper - 1], tiers[upper]
        bisect.insort(tiers, min(gaps[upper], key=lambda v: max(v / low, high / v)))
    return tiers
