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

Those tiers are whatever the delays were (``50s 7m47s 1h59m34s``), and the top one
is the longest delay seen, so a longer delay tomorrow would be refused. What an
operator deploys is :func:`recommend_on_grid`: tiers from a grid of round values
(:data:`DEFAULT_GRID_MS`), the top one at or above a required maximum (the
configured ladder's top), minimising the mean relative overshoot or its tail (the
99th percentile of tier / delay). Every :class:`LadderFit` carries the tail: the
p99 and the largest of tier / delay, and the share of messages waiting over twice
what they asked for.

>>> fit = recommend_on_grid({40_000: 10, 50_000: 10, 5_400_000: 1}, 2, min_top_ms=86_400_000)
>>> [format_ms(t) for t in fit.tiers_ms]
['1m', '24h']
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from delayq.durations import format_ms
from delayq.errors import InvalidInput

__all__ = [
    "DEFAULT_GRID_MS",
    "OBJECTIVES",
    "LadderFit",
    "coarse_grid_note",
    "ladder_overshoot",
    "never_worse",
    "recommend_ladder",
    "recommend_on_grid",
    "serves_worse",
]

_S, _M, _H = 1_000, 60_000, 3_600_000

DEFAULT_GRID_MS: tuple[int, ...] = (
    *(v * _S for v in (15, 30)),
    *(v * _M for v in (1, 2, 5, 10, 15, 30)),
    *(v * _H for v in (1, 2, 3, 6, 12, 24)),
)
"""The round tier values a recommendation picks from: 15s 30s 1m 2m 5m 10m 15m 30m 1h 2h
3h 6h 12h 24h."""

OBJECTIVES = ("mean", "p99")
"""What :func:`recommend_on_grid` minimises: the mean relative overshoot, or the p99 of
tier / delay (ties broken by the messages above it, then by the mean)."""


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
    p99_ratio: float = 0.0
    """Tier / delay that 99% of the served messages stay at or under (nearest rank: the
    value at rank ceil(0.99 n)): "p99 waits this many times its request"."""
    max_ratio: float = 0.0
    """The largest tier / delay over the served messages."""
    over_2x: float = 0.0
    """Share of the served messages whose tier is more than twice their delay."""


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
    served = too_long = twice = 0
    ratios: list[tuple[float, int]] = []
    for delay, count in _positive(delays):
        index = bisect.bisect_left(tiers, delay)
        if index == len(tiers):
            too_long += count
            continue
        total += count * (tiers[index] - delay) / delay
        served += count
        ratios.append((tiers[index] / delay, count))
        if tiers[index] > 2 * delay:
            twice += count
    if not served:
        return LadderFit(tuple(tiers), 0.0, 0, too_long)
    ratios.sort()
    rank = -(-99 * served // 100)  # ceil(0.99 n), 1-based
    seen, p99 = 0, ratios[-1][0]
    for ratio, count in ratios:
        seen += count
        if seen >= rank:
            p99 = ratio
            break
    return LadderFit(
        tuple(tiers), total / served, served, too_long, p99, ratios[-1][0], twice / served
    )


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


def serves_worse(candidate: LadderFit, current: LadderFit, objective: str = "mean") -> bool:
    """Whether ``candidate`` serves the same delays strictly worse than ``current`` by
    ``objective`` (``"mean"``: the mean relative overshoot, then the p99; ``"p99"``: the p99
    of tier / delay, then the mean). A ladder that refuses more delays (``too_long``) is
    worse whatever its overshoot. As good with fewer tiers is not worse."""
    if candidate.too_long != current.too_long:
        return candidate.too_long > current.too_long
    if objective == "mean":
        ours = (candidate.mean_relative_overshoot, candidate.p99_ratio)
        theirs = (current.mean_relative_overshoot, current.p99_ratio)
    else:
        ours = (candidate.p99_ratio, candidate.mean_relative_overshoot)
        theirs = (current.p99_ratio, current.mean_relative_overshoot)
    for mine, other in zip(ours, theirs, strict=True):
        if not math.isclose(mine, other, rel_tol=1e-9, abs_tol=1e-12):
            return mine > other
    return False


def coarse_grid_note(delays: Mapping[int, int], grid_ms: Sequence[int]) -> str:
    """A sentence when the grid's shortest value is above the shortest delays seen (it
    cannot serve them closely), else ``""``."""
    pairs = _positive(delays)
    grid = sorted(set(grid_ms))
    if not pairs or not grid or grid[0] <= pairs[0][0]:
        return ""
    below = sum(w for d, w in pairs if d < grid[0])
    share = below / sum(w for _, w in pairs)
    return (
        f"the grid's shortest value {format_ms(grid[0])} is longer than {share:.0%} of the "
        f"delays seen ({format_ms(pairs[0][0])} to {format_ms(pairs[-1][0])}): give a grid "
        "with shorter values (--grid)"
    )


def never_worse(
    current: LadderFit | None,
    recommended: LadderFit | None,
    same: LadderFit | None,
    refused: str,
    requested: Mapping[int, int],
    grid_ms: Sequence[int],
    objective: str,
) -> tuple[LadderFit | None, LadderFit | None, str]:
    """The recommendations (on as many tiers as wanted, on as many as now) and the reason
    there is none: a recommendation that serves ``requested`` worse than the ``current``
    ladder is dropped, and the reason says so (a 1-5 s workload was once told to
    move from 16.7 % to 745 % mean overshoot) and whether the grid is too coarse."""
    if current is None:
        return recommended, same, refused
    if same is not None and serves_worse(same, current, objective):
        same = None
    if recommended is not None and serves_worse(recommended, current, objective):
        recommended, same = None, None
        coarse = coarse_grid_note(requested, grid_ms)
        refused = (
            "every ladder from the grid serves the delays seen worse than the current one "
            f"(mean overshoot {current.mean_relative_overshoot:.1%}, p99 tier / delay "
            f"{current.p99_ratio:.2f}): keep it" + (f"; {coarse}" if coarse else "")
        )
    return recommended, same, refused


def recommend_on_grid(
    delays: Mapping[int, int],
    max_tiers: int,
    *,
    grid_ms: Iterable[int] = DEFAULT_GRID_MS,
    min_top_ms: int = 0,
    objective: str = "mean",
) -> LadderFit:
    """The ladder of at most ``max_tiers`` tiers, all from ``grid_ms``, best for ``delays``.

    The top tier is the smallest grid value at or above both the longest delay and
    ``min_top_ms`` (the configured maximum: a recommendation never refuses a delay the
    current ladder takes). ``objective`` ``"mean"`` minimises the mean relative overshoot;
    ``"p99"`` the p99 of tier / delay (:attr:`LadderFit.p99_ratio`), then the messages
    above that p99, then the mean. Fewer tiers than ``max_tiers`` come out when more
    would not do better. Both are exact: a dynamic programme over the grid (the delays a
    tier serves are a run of grid intervals), for ``"p99"`` inside a bisection on the ratio.
    """
    if max_tiers < 1:
        raise InvalidInput(f"max_tiers must be at least 1, got {max_tiers}")
    if objective not in OBJECTIVES:
        raise InvalidInput(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    grid = sorted(set(grid_ms))
    if not grid or grid[0] <= 0 or any(isinstance(g, bool) or not isinstance(g, int) for g in grid):
        raise InvalidInput(f"a grid is positive whole milliseconds, at least one, got {grid}")
    pairs = _positive(delays)
    if not pairs:
        raise InvalidInput("no positive delays to fit a ladder to")
    need = max(pairs[-1][0], min_top_ms)
    top = bisect.bisect_left(grid, need)
    if top == len(grid):
        raise InvalidInput(
            f"the grid's longest value {format_ms(grid[-1])} is below the top tier the "
            f"ladder needs ({format_ms(need)}: "
            + ("the longest delay" if need == pairs[-1][0] else "the current ladder's top")
            + "): add a longer value to the grid"
        )
    # A grid value below the shortest delay would serve nothing: left out.
    first = min(bisect.bisect_left(grid, pairs[0][0]), top)
    tiers = _GridProblem(pairs, grid[first : top + 1], min(max_tiers, top + 1 - first))
    _, chosen = tiers.solve(None if objective == "mean" else tiers.least_p99())
    return ladder_overshoot(delays, chosen)


class _GridProblem:
    """Delays (sorted, with weights) and candidate tiers (the last one the top, required)."""

    def __init__(self, pairs: list[tuple[int, int]], candidates: list[int], tiers: int) -> None:
        self.values = [d for d, _ in pairs]
        self.weight = [0, *itertools.accumulate(w for _, w in pairs)]
        self.inverse = [0.0, *itertools.accumulate(w / d for d, w in pairs)]
        self.candidates = candidates
        self.tiers = tiers
        # Group j: the delays in (candidates[j - 1], candidates[j]], as index bounds.
        self.bounds = [0, *(bisect.bisect_right(self.values, c) for c in candidates)]
        self.bounds[-1] = len(self.values)  # the top serves every delay (it is >= the longest)
        total = self.weight[-1]
        self.allowed = total - (-(-99 * total // 100))  # messages the p99 may leave above it

    def _cost(self, i: int, j: int, ratio: float | None) -> tuple[float, float]:
        """(messages over ``ratio``, relative overshoot) of groups i..j served by tier j."""
        lo, hi, tier = self.bounds[i], self.bounds[j + 1], self.candidates[j]
        mean = tier * (self.inverse[hi] - self.inverse[lo]) - (self.weight[hi] - self.weight[lo])
        if ratio is None:
            return 0.0, mean
        cut = min(hi, max(lo, bisect.bisect_left(self.values, tier / ratio)))  # d < tier / r
        return float(self.weight[cut] - self.weight[lo]), mean

    def solve(self, ratio: float | None) -> tuple[float, list[int]]:
        """The tiers minimising (messages over ``ratio``, relative overshoot), lexically,
        and how many messages they leave over ``ratio``."""
        n = len(self.candidates)
        best = [self._cost(0, j, ratio) for j in range(n)]
        answer, answer_tiers, splits = best[-1], 1, []
        for layer in range(1, self.tiers):
            row, split = [(math.inf, math.inf)] * n, [0] * n
            for j in range(layer, n):
                for i in range(layer - 1, j):
                    over, mean = self._cost(i + 1, j, ratio)
                    value = (best[i][0] + over, best[i][1] + mean)
                    if value < row[j]:
                        row[j], split[j] = value, i
            best = row
            splits.append(split)
            if best[-1] < answer:
                answer, answer_tiers = best[-1], layer + 1
        chosen = [n - 1]
        for split in reversed(splits[: answer_tiers - 1]):
            chosen.append(split[chosen[-1]])
        return answer[0], [self.candidates[j] for j in chosen]

    def least_p99(self) -> float:
        """Just above the smallest tier / delay some ladder keeps 99% of the messages at or
        under: a bisection (in log space) on the ratio, each step a dynamic programme."""
        lo, hi = 1.0, self.candidates[-1] / self.values[0]  # nothing is ever over hi
        if self.solve(lo)[0] <= self.allowed:
            return lo
        for _ in range(64):  # hi / lo shrinks to within float precision of the optimum
            mid = math.sqrt(lo * hi)
            if mid in (lo, hi):
                break
            if self.solve(mid)[0] <= self.allowed:
                hi = mid
            else:
                lo = mid
        return hi
