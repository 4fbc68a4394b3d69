"""The ladder: which tier a delay waits in."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from delayq.errors import DelayTooLong, InvalidDelay, InvalidTopology
from delayq.topology.ladder import DEFAULT_LADDER, MAX_TIER_MS, Ladder, Tier

tier_values = st.lists(
    st.integers(min_value=1, max_value=MAX_TIER_MS), min_size=1, max_size=12, unique=True
).map(sorted)


@st.composite
def ladder_and_delay(draw: st.DrawFn) -> tuple[Ladder, int]:
    values = draw(tier_values)
    delay = draw(st.integers(min_value=1, max_value=values[-1]))
    return Ladder(values), delay


# --- select_ms invariants ------------------------------------------------------------------------


@given(ladder_and_delay())
def test_chosen_tier_is_at_least_the_delay(case: tuple[Ladder, int]) -> None:
    ladder, delay = case
    tier = ladder.select_ms(delay)
    assert tier is not None
    assert tier.ttl_ms >= delay


@given(ladder_and_delay())
def test_chosen_tier_is_the_smallest_that_fits(case: tuple[Ladder, int]) -> None:
    ladder, delay = case
    chosen = ladder.select_ms(delay)
    assert chosen is not None
    assert not [t for t in ladder.tiers if delay <= t.ttl_ms < chosen.ttl_ms]


@given(ladder_and_delay())
def test_chosen_tier_belongs_to_the_ladder(case: tuple[Ladder, int]) -> None:
    ladder, delay = case
    assert ladder.select_ms(delay) in ladder.tiers


@given(tier_values)
def test_zero_delay_is_immediate(values: list[int]) -> None:
    assert Ladder(values).select_ms(0) is None


@given(tier_values, st.integers(min_value=1, max_value=10**12))
def test_delay_above_the_largest_tier_is_too_long(values: list[int], extra: int) -> None:
    ladder = Ladder(values)
    with pytest.raises(DelayTooLong):
        ladder.select_ms(ladder.max_ms + extra)


@given(tier_values)
def test_a_delay_equal_to_a_tier_selects_that_tier(values: list[int]) -> None:
    ladder = Ladder(values)
    for tier in ladder.tiers:
        assert ladder.select_ms(tier.ttl_ms) == tier


@given(st.lists(st.integers(min_value=1, max_value=MAX_TIER_MS), min_size=1, unique=True))
def test_ladder_sorts_its_tiers(values: list[int]) -> None:
    assert [t.ttl_ms for t in Ladder(values)] == sorted(values)


def test_delay_too_long_names_the_largest_tier() -> None:
    with pytest.raises(DelayTooLong, match="24h"):
        DEFAULT_LADDER.select_ms(25 * 3_600_000)


def test_delay_too_long_is_an_invalid_delay() -> None:
    assert issubclass(DelayTooLong, InvalidDelay)


# --- select (durations) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "label"),
    [
        ("1ms", "30s"),
        ("30s", "30s"),
        ("31s", "1m"),
        ("15m", "30m"),
        ("1h30m", "3h"),
        (timedelta(hours=23, minutes=59), "24h"),
        ("24h", "24h"),
    ],
)
def test_select_on_default_ladder(delay: object, label: str) -> None:
    tier = DEFAULT_LADDER.select(delay)
    assert tier is not None
    assert tier.label == label


def test_select_zero_duration_is_immediate() -> None:
    assert DEFAULT_LADDER.select("0s") is None
    assert DEFAULT_LADDER.select(timedelta(0)) is None


def test_select_rejects_bare_numbers() -> None:
    with pytest.raises(InvalidDelay):
        DEFAULT_LADDER.select(30)


# --- the default ladder --------------------------------------------------------------------------


def test_default_ladder_labels() -> None:
    assert [t.label for t in DEFAULT_LADDER] == [
        "30s",
        "1m",
        "5m",
        "30m",
        "1h",
        "3h",
        "6h",
        "12h",
        "24h",
    ]


def test_default_ladder_max_is_24h() -> None:
    assert DEFAULT_LADDER.max_ms == 86_400_000


# --- tiers ---------------------------------------------------------------------------------------


def test_tier_label_ttl_and_str() -> None:
    tier = Tier(5_400_000)
    assert tier.label == "1h30m"
    assert str(tier) == "1h30m"
    assert tier.ttl == timedelta(hours=1, minutes=30)


@given(tier_values)
def test_tier_labels_are_unique(values: list[int]) -> None:
    labels = [t.label for t in Ladder(values)]
    assert len(set(labels)) == len(labels)


# --- building ladders ----------------------------------------------------------------------------


def test_parse_accepts_strings_and_timedeltas() -> None:
    assert Ladder.parse(["1s", timedelta(seconds=2)]) == Ladder([1_000, 2_000])


def test_equal_ladders_hash_equal() -> None:
    assert hash(Ladder.parse(["2s", "1s"])) == hash(Ladder([1_000, 2_000]))


def test_repr_lists_labels() -> None:
    assert repr(Ladder.parse(["1s", "1m"])) == "Ladder(['1s', '1m'])"


@given(tier_values, st.data())
def test_duplicate_tier_is_invalid(values: list[int], data: st.DataObject) -> None:
    duplicate = data.draw(st.sampled_from(values))
    with pytest.raises(InvalidTopology, match="twice"):
        Ladder([*values, duplicate])


def test_duplicate_written_two_ways_is_invalid() -> None:
    with pytest.raises(InvalidTopology, match="twice"):
        Ladder.parse(["60s", "1m"])


def test_empty_ladder_is_invalid() -> None:
    with pytest.raises(InvalidTopology, match="at least one tier"):
        Ladder.parse([])


def test_zero_tier_is_invalid() -> None:
    with pytest.raises(InvalidTopology, match="longer than 0"):
        Ladder.parse(["0s", "1s"])


def test_negative_tier_ms_is_invalid() -> None:
    with pytest.raises(InvalidTopology):
        Ladder([-5, 1_000])


@given(st.integers(min_value=MAX_TIER_MS + 1, max_value=10**15))
def test_too_long_tier_is_invalid(ms: int) -> None:
    with pytest.raises(InvalidTopology, match="maximum"):
        Ladder([1_000, ms])


def test_longest_allowed_tier_is_accepted() -> None:
    assert Ladder([MAX_TIER_MS]).max_ms == MAX_TIER_MS


def test_too_long_tier_as_duration_is_invalid() -> None:
    with pytest.raises(InvalidTopology):
        Ladder.parse(["30d"])


@pytest.mark.parametrize("entry", ["abc", 30, 1.5, None, "-1s"], ids=repr)
def test_bad_ladder_entry_is_invalid_topology(entry: object) -> None:
    with pytest.raises(InvalidTopology, match="invalid ladder"):
        Ladder.parse(["1s", entry])


@given(ladder_and_delay())
def test_select_ms_is_monotonic(case: tuple[Ladder, int]) -> None:
    ladder, delay = case
    assume(delay > 1)
    smaller = ladder.select_ms(delay - 1)
    larger = ladder.select_ms(delay)
    assert smaller is not None and larger is not None
    assert smaller.ttl_ms <= larger.ttl_ms
