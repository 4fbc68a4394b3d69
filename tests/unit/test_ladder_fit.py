"""The ladder recommendation: exact DP against brute force, and known optima."""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping

import pytest

from delayq.errors import InvalidInput
from delayq.topology.fit import LadderFit, ladder_overshoot, recommend_ladder


def brute_force_ladder(delays: Mapping[int, int], max_tiers: int) -> LadderFit:
    """Every subset of the distinct delays (containing the largest): small inputs only."""
    values = sorted(d for d, w in delays.items() if d > 0 and w > 0)
    best: LadderFit | None = None
    for size in range(1, min(max_tiers, len(values)) + 1):
        for rest in itertools.combinations(values[:-1], size - 1):
            fit = ladder_overshoot(delays, (*rest, values[-1]))
            if best is None or fit.mean_relative_overshoot < best.mean_relative_overshoot - 1e-12:
                best = fit
    if best is None:
        raise InvalidInput("no positive delays to fit a ladder to")
    return best


@pytest.mark.parametrize("seed", range(60))
def test_the_dp_finds_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    delays = {rng.randint(1, 5_000): rng.randint(1, 50) for _ in range(rng.randint(1, 10))}
    max_tiers = rng.randint(1, 5)
    fit = recommend_ladder(delays, max_tiers)
    best = brute_force_ladder(delays, max_tiers)
    assert fit.mean_relative_overshoot == pytest.approx(best.mean_relative_overshoot, abs=1e-12)
    assert len(fit.tiers_ms) <= max_tiers and fit.tiers_ms[-1] == max(delays)
    again = ladder_overshoot(delays, fit.tiers_ms)  # the figure belongs to those tiers
    assert again.mean_relative_overshoot == pytest.approx(fit.mean_relative_overshoot)


def test_clusters_get_a_tier_each_and_zero_overshoot() -> None:
    # Three clusters of exact delays and three tiers: the optimum is the clusters.
    delays = {1_000: 500, 60_000: 300, 3_600_000: 200}
    fit = recommend_ladder(delays, 3)
    assert fit.tiers_ms == (1_000, 60_000, 3_600_000)
    assert fit.mean_relative_overshoot == 0.0 and fit.messages == 1_000


def test_a_known_two_tier_optimum() -> None:
    # Delays 1, 2, 4 and 8 s, one message each; the top tier must be 8 s. Sums of the
    # relative overshoot for the lower tier: 1 s -> 3 + 1 = 4 (for 2 s and 4 s),
    # 2 s -> 1 + 1 = 2 (for 1 s and 4 s), 4 s -> 3 + 1 = 4 (for 1 s and 2 s).
    delays = {1_000: 1, 2_000: 1, 4_000: 1, 8_000: 1}
    fit = recommend_ladder(delays, 2)
    assert fit.tiers_ms == (2_000, 8_000)
    assert fit.mean_relative_overshoot == pytest.approx(2 / 4)


def test_the_current_ladder_what_if_counts_too_long_separately() -> None:
    fit = ladder_overshoot({500: 1, 1_000: 1, 9_000: 2, 0: 7}, [1_000, 2_000])
    assert fit.messages == 2 and fit.too_long == 2
    assert fit.mean_relative_overshoot == pytest.approx(0.5)  # (1 + 0) / 2


def test_many_distinct_delays_use_a_candidate_subset_and_stay_close() -> None:
    rng = random.Random(7)
    delays: dict[int, int] = {}
    for _ in range(20_000):
        d = int(rng.lognormvariate(10, 1.5)) + 1
        delays[d] = delays.get(d, 0) + 1
    exact = recommend_ladder(delays, 6)
    coarse = recommend_ladder(delays, 6, max_candidates=300)
    assert coarse.tiers_ms[-1] == exact.tiers_ms[-1] == max(delays)
    assert exact.mean_relative_overshoot <= coarse.mean_relative_overshoot
    assert coarse.mean_relative_overshoot < exact.mean_relative_overshoot * 1.2


def test_no_positive_delays_is_an_error() -> None:
    with pytest.raises(InvalidInput):
        recommend_ladder({0: 10}, 3)
    with pytest.raises(InvalidInput):
        recommend_ladder({10: 1}, 0)


def test_no_recommendation_is_worse_than_the_current_ladder() -> None:
    """Issue 29: delays of 1-5 s on the default grid got "recommended ladder 15s, mean
    overshoot 745 %" beside the current ladder's 16.7 %. Now the current ladder is kept,
    and the report says the grid is too coarse for these delays."""
    from delayq.topology.fit import DEFAULT_GRID_MS, never_worse, recommend_on_grid, serves_worse

    delays = {1_000: 10, 2_000: 10, 3_000: 10, 5_000: 10}
    current = ladder_overshoot(delays, [1_000, 2_000, 3_000, 5_000, 6_000])
    coarse = recommend_on_grid(delays, 5, min_top_ms=6_000)
    assert coarse.tiers_ms == (15_000,) and serves_worse(coarse, current)
    kept, same, why = never_worse(current, coarse, coarse, "", delays, DEFAULT_GRID_MS, "mean")
    assert kept is None and same is None
    assert "worse than the current one (mean overshoot 0.0%" in why and "keep it" in why
    assert "15s is longer than 100% of the delays seen (1s to 5s)" in why and "--grid" in why

    # A grid with short values finds a better ladder than a poor current one: kept.
    poor = ladder_overshoot(delays, [6_000])
    fine = recommend_on_grid(delays, 3, grid_ms=(1_000, 2_000, 5_000, 6_000), min_top_ms=6_000)
    assert not serves_worse(fine, poor) and serves_worse(poor, fine, "p99")
    assert never_worse(poor, fine, None, "", delays, DEFAULT_GRID_MS, "mean")[0] is fine
    # A current ladder that refuses a delay is worse than one that takes every delay.
    short = ladder_overshoot(delays, [1_000, 2_000, 3_000])
    assert short.too_long == 10 and serves_worse(short, coarse)
    # As good with fewer tiers is not worse: the recommendation stands.
    fewer = ladder_overshoot(delays, [1_000, 2_000, 3_000, 5_000])
    assert not serves_worse(fewer, current) and not serves_worse(current, fewer)
