"""The grid-constrained ladder recommendation: round tiers, the top kept, both objectives
against brute force, and the tail figures against a hand count."""

from __future__ import annotations

import itertools
import random

import pytest

from delayq.errors import InvalidInput
from delayq.topology.fit import DEFAULT_GRID_MS, LadderFit, ladder_overshoot, recommend_on_grid

S, M, H = 1_000, 60_000, 3_600_000


def over_p99(delays: dict[int, int], fit: LadderFit) -> int:
    """Messages whose tier / delay is above the ladder's own p99 (a tie-break)."""
    tiers = fit.tiers_ms
    return sum(
        w
        for d, w in delays.items()
        if d > 0 and min(t for t in tiers if t >= d) / d > fit.p99_ratio
    )


def brute_force(
    delays: dict[int, int], max_tiers: int, grid: list[int], top: int, objective: str
) -> LadderFit:
    below = [g for g in grid if g < top]
    fits = [
        ladder_overshoot(delays, (*rest, top))
        for size in range(max_tiers)
        for rest in itertools.combinations(below, size)
    ]
    if objective == "mean":
        return min(fits, key=lambda f: f.mean_relative_overshoot)
    return min(fits, key=lambda f: (f.p99_ratio, over_p99(delays, f), f.mean_relative_overshoot))


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("objective", ["mean", "p99"])
def test_the_grid_dp_finds_the_brute_force_optimum(seed: int, objective: str) -> None:
    rng = random.Random(seed)
    grid = sorted(rng.sample(range(1, 200), rng.randint(1, 8)))
    delays = {rng.randint(1, grid[-1]): rng.choice([1, 5, 50, 400]) for _ in range(12)}
    max_tiers = rng.randint(1, 4)
    top = min(g for g in grid if g >= max(delays))
    fit = recommend_on_grid(delays, max_tiers, grid_ms=grid, objective=objective)
    best = brute_force(delays, max_tiers, grid, top, objective)
    assert set(fit.tiers_ms) <= set(grid) and len(fit.tiers_ms) <= max_tiers
    assert fit.tiers_ms[-1] == top
    assert fit.mean_relative_overshoot == pytest.approx(best.mean_relative_overshoot)
    if objective == "p99":
        assert fit.p99_ratio == pytest.approx(best.p99_ratio)


def test_round_tiers_only_and_the_top_at_or_above_the_configured_maximum() -> None:
    # The distribution in small: delays spread from 40 s to 2 h, a 24h ladder now.
    rng = random.Random(3)
    delays: dict[int, int] = {}
    for _ in range(5_000):
        d = int(rng.lognormvariate(12, 1.5))
        d = min(max(d, 40 * S), 2 * H - 26 * S)
        delays[d] = delays.get(d, 0) + 1
    for objective in ("mean", "p99"):
        fit = recommend_on_grid(delays, 6, min_top_ms=24 * H, objective=objective)
        assert set(fit.tiers_ms) <= set(DEFAULT_GRID_MS)
        assert fit.tiers_ms[-1] == 24 * H  # not the longest delay seen (1h59m34s)
        assert fit.too_long == 0 and fit.messages == 5_000
    # The configured maximum between grid values: the next grid value up.
    fit = recommend_on_grid({10 * S: 1}, 2, min_top_ms=4 * H)
    assert fit.tiers_ms == (15 * S, 6 * H)
    # A delay longer than the configured maximum still gets a tier.
    fit = recommend_on_grid({5 * H: 1}, 1, min_top_ms=1 * H)
    assert fit.tiers_ms == (6 * H,)


def test_objective_p99_and_mean_give_different_ladders() -> None:
    # Two tiers under a fixed 10 s top, from a 1 s .. 10 s grid. 3% of the messages ask
    # for 1 s, 97% for 5 s. Mean: a 5 s tier leaves 3 messages in 100 at 5x, relative
    # overshoot (30 * 4 + 0 + ...) / 1000 = 0.12; a 1 s tier puts the 970 of 5 s in the
    # 10 s top, 1x over each: 0.97. So mean picks 5s. Its p99 though is 5x (30 > 1% of
    # 1000 at 5x), while a 1 s tier's p99 is 2x.
    delays = {1 * S: 30, 5 * S: 970}
    grid = [1 * S, 5 * S, 10 * S]
    mean = recommend_on_grid(delays, 2, grid_ms=grid, min_top_ms=10 * S)
    p99 = recommend_on_grid(delays, 2, grid_ms=grid, min_top_ms=10 * S, objective="p99")
    assert mean.tiers_ms == (5 * S, 10 * S) and p99.tiers_ms == (1 * S, 10 * S)
    assert mean.mean_relative_overshoot == pytest.approx(0.12)
    assert p99.mean_relative_overshoot == pytest.approx(0.97)
    assert (mean.p99_ratio, p99.p99_ratio) == (5.0, 2.0)
    assert mean.mean_relative_overshoot < p99.mean_relative_overshoot


def test_the_tail_figures_against_a_hand_count() -> None:
    # Tiers 1s 10s; 200 messages. Ratios (tier / delay), by hand:
    #   100 x 1000 ms -> 1s: 1.0        50 x 800 ms -> 1s: 1.25
    #    40 x 4000 ms -> 10s: 2.5        8 x 2000 ms -> 10s: 5.0
    #     2 x 1000 ms ... (same as the first)  and 2 too long (20 s), left out
    delays = {1_000: 102, 800: 50, 4_000: 40, 2_000: 8, 20_000: 2, 0: 9}
    fit = ladder_overshoot(delays, [1 * S, 10 * S])
    assert (fit.messages, fit.too_long) == (200, 2)
    # Sorted ratios: 102 x 1.0, 50 x 1.25, 40 x 2.5, 8 x 5.0. Rank ceil(0.99 * 200) = 198
    # falls among the 8 at 5.0 (ranks 193..200); the max is 5.0; over 2x: 40 + 8 = 48.
    assert fit.p99_ratio == 5.0 and fit.max_ratio == 5.0
    assert fit.over_2x == pytest.approx(48 / 200)
    # 101 messages: rank ceil(99.99) = 100, the last but one.
    fit = ladder_overshoot({1_000: 100, 100: 1}, [1 * S])
    assert (fit.p99_ratio, fit.max_ratio, fit.over_2x) == (1.0, 10.0, pytest.approx(1 / 101))
    # Exactly twice is not over twice.
    assert ladder_overshoot({500: 4}, [1 * S]).over_2x == 0.0


def test_misuse_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidInput, match="max_tiers must be at least 1"):
        recommend_on_grid({S: 1}, 0)
    with pytest.raises(InvalidInput, match="objective must be one of mean, p99"):
        recommend_on_grid({S: 1}, 2, objective="median")
    with pytest.raises(InvalidInput, match="no positive delays"):
        recommend_on_grid({0: 5}, 2)
    with pytest.raises(InvalidInput, match="grid is positive whole milliseconds"):
        recommend_on_grid({S: 1}, 2, grid_ms=[])
    with pytest.raises(InvalidInput, match="grid is positive whole milliseconds"):
        recommend_on_grid({S: 1}, 2, grid_ms=[0, S])
    with pytest.raises(
        InvalidInput, match=r"longest value 24h is below .*\(48h: the current ladder.s top\)"
    ):
        recommend_on_grid({S: 1}, 2, min_top_ms=48 * H)
    with pytest.raises(InvalidInput, match="the longest delay"):
        recommend_on_grid({30 * H: 1}, 2)
