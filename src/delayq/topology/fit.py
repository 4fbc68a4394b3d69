"""Choosing a ladder for the delays a system actually asks for (pure, no I/O).

A message asking for delay ``d`` waits in the smallest tier ``t >= d``; its
*relative overshoot* is ``(t - d) / d``. Given the observed delays (with their
counts) and a number of tiers, :func:`recommend_ladder` finds the ladder that
minimises the mean relative overshoot over all messages.

Why the search is exact over the observed delays: in an optimal ladder every
tier equals the largest delay it serves (lowering it to that delay serves the
same messages with less overshoot), and the top tier equals the largest delay.
So the tiers are a subset of the distinct observed delays, and a dynamic
programme over them (the delays a tier serves form a contiguous run) finds the
best one. The cost of a run satisfies the quadrangle inequality, so the split
points are monotone and divide and conquer makes each layer O(n log n).

>>> fit = recommend_ladder({1_000: 10, 1_100: 10, 9_000: 1}, max_tiers=2)
>>> fit.tiers_ms
(1100, 9000)
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from delayq.errors import InvalidInput

__all__ = [
    "LadderFit",
    "brute_force_ladder",
    "ladder_overshoot",
    "recommend_ladder",
]


@dataclass(frozen=True, slots=True)
class LadderFit:
    """A ladder and how it serves a delay distribution."""

    tiers_ms: tuple[int, ...]
    mean_relative_overshoot: float
    """Mean over the served messages of (tier - delay) / delay."""
    messages: int
    """Messages with a positive delay the ladder serves."""
    too_long: int = 0
    """Messages asking for more than the top tier (a current ladder only)."""


def _positive(delays: Mapping[int, int]) -> list[tuple[int, int]]:
    pairs = sorted((d, w) for d, w in delays.items() if d > 0 and w > 0)
    return pairs


def ladder_overshoot(delays: Mapping[int, int], tiers_ms: Iterable[int]) -> LadderFit:
    """How ``tiers_ms`` serves ``delays`` (delay ms -> messages): the what-if of a ladder.

    Immediate messages (delay 0) are left out; those above the top tier are
    counted in ``too_long`` and left out of the mean.
    """
    tiers = sorted(set(tiers_ms))
    if not tiers:
        raise InvalidInput("a ladder needs at least one tier")
    total = 0.0
    served = too_long = 0
    for delay, count in _positive(delays):
        index = bisect.bisect_left(tiers, delay)
        if index == len(tiers):
            too_long += count
            continue
        total += count * (tiers[index] - delay) / delay
        served += count
    return LadderFit(tuple(tiers), total / served if served else 0.0, served, too_long)


def recommend_ladder(
    delays: Mapping[int, int], max_tiers: int, *, max_candidates: int = 5000
) -> LadderFit:
    """The ladder of at most ``max_tiers`` tiers minimising mean relative overshoot.

    ``delays`` maps a requested delay in ms to its number of messages. The
    tiers are chosen among the distinct positive delays, which makes the result
    exact (see the module docstring). With more than ``max_candidates``
    distinct delays, tiers are chosen among that many of them, evenly spaced in
    rank (the largest always included); the objective stays exact for that
    choice.
    """
    if max_tiers < 1:
        raise InvalidInput(f"max_tiers must be at least 1, got {max_tiers}")
    pairs = _positive(delays)
    if not pairs:
        raise InvalidInput("no positive delays to fit a ladder to")
    values = [d for d, _ in pairs]
    if len(values) > max_candidates:
        step = len(values) / max_candidates
        picks = {
            values[min(len(values) - 1, int((i + 1) * step) - 1)] for i in range(max_candidates)
        }
        candidates = sorted(picks | {values[-1]})
    else:
        candidates = values
    # Group the delays by the candidate that would serve them if it were the tier
    # just above: prefix sums of messages and of messages / delay per group.
    n = len(candidates)
    count = [0] * n
    inverse = [0.0] * n
    for delay, weight in pairs:
        group = bisect.bisect_left(candidates, delay)
        count[group] += weight
        inverse[group] += weight / delay
    sum_count = [0, *itertools.accumulate(count)]
    sum_inverse = [0.0, *itertools.accumulate(inverse)]

    def cost(i: int, j: int) -> float:
        """Overshoot of groups i..j (inclusive) all served by tier candidates[j]."""
        return candidates[j] * (sum_inverse[j + 1] - sum_inverse[i]) - (
            sum_count[j + 1] - sum_count[i]
        )

    tiers = min(max_tiers, n)
    best = [cost(0, j) for j in range(n)]  # one tier, the top at j
    splits: list[list[int]] = []
    for _ in range(1, tiers):
        best, split = _next_layer(best, cost, n)
        splits.append(split)
    chosen = [n - 1]
    for split in reversed(splits):
        chosen.append(split[chosen[-1]])
    # The figure is recomputed from the tiers, free of the prefix sums' rounding.
    return ladder_overshoot(delays, (candidates[j] for j in chosen))


def _next_layer(
    previous: Sequence[float], cost: Callable[[int, int], float], n: int
) -> tuple[list[float], list[int]]:
    """One more tier: the best cost with the top tier at each j, and the tier below it.

    Divide and conquer: the best split for j is monotone in j (quadrangle inequality).
    """
    layer = [float("inf")] * n
    split = [0] * n

    def solve(lo: int, hi: int, opt_lo: int, opt_hi: int) -> None:
        if lo > hi:
            return
        mid = (lo + hi) // 2
        best_value, best_i = float("inf"), opt_lo
        for i in range(opt_lo, min(mid, opt_hi + 1)):  # the tier below at i < mid
            value = previous[i] + cost(i + 1, mid)
            if value < best_value:
                best_value, best_i = value, i
        layer[mid], split[mid] = best_value, best_i
        solve(lo, mid - 1, opt_lo, best_i)
        solve(mid + 1, hi, best_i, opt_hi)

    solve(0, n - 1, 0, n - 1)
    return layer, split


def brute_force_ladder(delays: Mapping[int, int], max_tiers: int) -> LadderFit:
    """Every subset of the distinct delays (containing the largest): for tests, small inputs."""
    values: Sequence[int] = [d for d, _ in _positive(delays)]
    best: LadderFit | None = None
    for size in range(1, min(max_tiers, len(values)) + 1):
        for rest in itertools.combinations(values[:-1], size - 1):
            fit = ladder_overshoot(delays, (*rest, values[-1]))
            if best is None or fit.mean_relative_overshoot < best.mean_relative_overshoot - 1e-12:
                best = fit
    if best is None:
        raise InvalidInput("no positive delays to fit a ladder to")
    return best
