"""Retry policies: delays capped and monotone before jitter, jitter only shortens, schedules."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq import DEFAULT_LADDER, DelayTooLong, InvalidDelay, InvalidInput, Ladder
from delayq.cli import main
from delayq.consume.retry import (
    ROCKETMQ_SCHEDULE,
    ExponentialBackoff,
    FixedBackoff,
    ScheduleBackoff,
)
from tests.unit.test_cli import TOPOLOGY


def ms(low: int, high: int) -> st.SearchStrategy[timedelta]:
    return st.integers(low, high).map(lambda n: timedelta(milliseconds=n))


exponential = st.builds(
    ExponentialBackoff,
    initial=ms(1, 10**7),
    multiplier=st.floats(1.0, 100.0),
    max_delay=ms(10**7, 10**9),
    max_attempts=st.integers(1, 60),
    jitter=st.floats(0.0, 1.0),
)


@given(exponential)
def test_exponential_delays_are_capped_and_monotone_before_jitter(policy):
    delays = [policy.base_delay_ms(r) for r in range(1, 80)]
    assert all(1 <= d <= policy.max_delay for d in delays)
    assert delays == sorted(delays)
    assert delays[0] == min(policy.initial, policy.max_delay)


@given(exponential, st.integers(0, 2**32))
def test_jitter_only_shortens_and_never_below_one_ms(policy, seed):
    rng = random.Random(seed)
    for attempt in range(1, policy.max_attempts):
        delay = policy.delay_ms(attempt, rng)
        assert delay is not None
        assert 1 <= delay <= policy.base_delay_ms(attempt)
        assert delay >= policy.base_delay_ms(attempt) * (1 - policy.jitter) - 1


@given(exponential)
def test_attempts_run_out_at_max_attempts(policy):
    assert policy.delay_ms(policy.max_attempts) is None
    assert policy.delay_ms(policy.max_attempts + 5) is None
    if policy.max_attempts > 1:
        assert policy.delay_ms(policy.max_attempts - 1) is not None


def test_same_seed_same_jitter():
    policy = ExponentialBackoff(initial="10s", jitter=0.5, max_attempts=10)
    first = [policy.delay_ms(a, random.Random(7)) for a in range(1, 10)]
    assert first == [policy.delay_ms(a, random.Random(7)) for a in range(1, 10)]


def test_exponential_from_durations():
    policy = ExponentialBackoff(initial="1s", multiplier=3, max_delay="1m", max_attempts=6)
    assert [policy.delay_ms(a) for a in range(1, 7)] == [1000, 3000, 9000, 27000, 60000, None]


def test_fixed_backoff():
    policy = FixedBackoff(delay="2m", max_attempts=3)
    assert [policy.delay_ms(a) for a in (1, 2, 3)] == [120_000, 120_000, None]


def test_rocketmq_schedule_has_sixteen_retries():
    policy = ScheduleBackoff.of(ROCKETMQ_SCHEDULE)
    assert policy.max_attempts == 17
    assert policy.delay_ms(1) == 10_000 and policy.delay_ms(16) == 7_200_000
    assert policy.delay_ms(17) is None


@given(exponential)
def test_schedule_rows_use_the_smallest_tier_at_or_above(policy):
    ladder = Ladder.parse(["1s", "1m", "1h", "24h"])
    try:
        rows = policy.schedule(ladder)
    except DelayTooLong:
        assert policy.max_delay > ladder.max_ms
        return
    assert [r.attempt for r in rows] == list(range(2, policy.max_attempts + 1))
    total = 0
    for row in rows:
        assert row.tier_ms >= row.requested_ms
        assert not any(row.requested_ms <= t.ttl_ms < row.tier_ms for t in ladder.tiers)
        total += row.tier_ms
        assert row.cumulative_ms == total


def test_schedule_names_the_retry_no_tier_can_hold():
    policy = ExponentialBackoff(initial="2h", max_delay="48h", max_attempts=6)
    with pytest.raises(DelayTooLong, match="retry 5 "):
        policy.schedule(DEFAULT_LADDER)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": "2m", "max_delay": "1m"},
        {"initial": 0},
        {"initial": "soon"},
        {"multiplier": 0.5},
        {"jitter": 1.5},
        {"max_attempts": 0},
        {"unknown": 1},
    ],
)
def test_invalid_exponential_policies_are_refused(kwargs):
    with pytest.raises(ValueError):
        ExponentialBackoff(**kwargs)


def test_schedule_policy_refuses_a_conflicting_max_attempts():
    with pytest.raises(ValueError, match="disagrees"):
        ScheduleBackoff(delays=["1s", "2s"], max_attempts=5)


def test_cli_retry_plan_shows_the_tiers_and_flags_too_short_delays(capsys):
    assert main(["retry-plan", "-f", str(TOPOLOGY), "--initial", "1ms", "--max-attempts", "3"]) == 0
    out = capsys.readouterr().out
    assert ["2", "1ms", "30s", "29s999ms", "30s"] in [line.split() for line in out.splitlines()]
    assert "2 retries ask for less than the smallest tier (30s)" in out


def test_cli_retry_plan_rejects_a_bad_policy(capsys):
    assert main(["retry-plan", "-f", str(TOPOLOGY), "--initial", "2m", "--max-delay", "1m"]) == 2
    assert "max_delay 1m is shorter than initial 2m" in capsys.readouterr().err


# Constructors: typed durations, positional or not, and clear refusals (issue 48) -----

POLICY_DURATIONS = [
    (FixedBackoff, "delay", False),
    (ExponentialBackoff, "initial", False),
    (ExponentialBackoff, "max_delay", False),
    (ScheduleBackoff, "delays", True),
]


def _build(cls, field, listed, value):
    kwargs = {field: [value] if listed else value}
    if field == "max_delay":
        kwargs["initial"] = "1ms"
    return cls(**kwargs)


@pytest.mark.parametrize(("cls", "field", "listed"), POLICY_DURATIONS)
@pytest.mark.parametrize("value", ["90s", timedelta(seconds=90)])
def test_every_policy_duration_takes_strings_and_timedeltas(cls, field, listed, value):
    policy = _build(cls, field, listed, value)
    assert policy.base_delay_ms(1) == (1 if field == "max_delay" else 90_000)
    assert getattr(policy, field) == ((90_000,) if listed else 90_000)


@pytest.mark.parametrize(("cls", "field", "listed"), POLICY_DURATIONS)
@pytest.mark.parametrize(
    ("value", "says"),
    [
        (90, "bare number"),
        (1.5, "bare number"),
        (-5, "bare number"),
        ("-5s", "must not be negative"),
        (timedelta(seconds=-5), "must not be negative"),
        (0, "bare number"),
        ("0s", "at least 1ms"),
        (timedelta(0), "at least 1ms"),
        (True, "is a bool"),
        (None, "NoneType is not accepted"),
        (b"1s", "bytes is not accepted"),
    ],
)
def test_every_policy_duration_refuses_clearly(cls, field, listed, value, says):
    with pytest.raises(InvalidDelay, match=says) as caught:
        _build(cls, field, listed, value)
    assert field in str(caught.value) and cls.__name__ in str(caught.value)


def test_the_one_delay_of_fixed_and_schedule_back_off_may_be_positional():
    assert FixedBackoff("1s").delay == 1000
    assert FixedBackoff(timedelta(minutes=2), max_attempts=3).delay == 120_000
    assert ScheduleBackoff(["1s", timedelta(seconds=2)]).delays == (1000, 2000)
    with pytest.raises(InvalidDelay, match="FixedBackoff delay 1 is a bare number"):
        FixedBackoff(1)


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: ExponentialBackoff("1s"), r'keyword arguments: ExponentialBackoff\(initial="30s"'),
        (lambda: FixedBackoff("1s", 3), r"one positional argument, delay"),
        (lambda: FixedBackoff("1s", delay="2s"), "delay given twice"),
        (lambda: ScheduleBackoff("1s"), r'a list of durations, not the string .*\["10s", "30s"\]'),
        (lambda: ScheduleBackoff(delays="1s 2s"), r"a list of durations, not the string"),
    ],
)
def test_positional_misuse_is_refused_clearly(build, says):
    with pytest.raises(InvalidInput, match=says):
        build()


@pytest.mark.parametrize(
    ("cls", "field"),
    [
        (FixedBackoff, "max_attempts"),
        (ExponentialBackoff, "max_attempts"),
        (ExponentialBackoff, "multiplier"),
        (ExponentialBackoff, "jitter"),
        (ScheduleBackoff, "max_attempts"),
    ],
)
@pytest.mark.parametrize("value", [True, False, None, "many", -1])
def test_policy_numbers_refuse_bools_none_and_nonsense(cls, field, value):
    kwargs = {field: value}
    if cls is ScheduleBackoff:
        kwargs["delays"] = ["1s"]
    with pytest.raises(InvalidInput, match=f"{cls.__name__}.*{field}"):
        cls(**kwargs)


def test_policy_numbers_take_ints():
    assert FixedBackoff(max_attempts=3).max_attempts == 3
    assert ExponentialBackoff(multiplier=3, jitter=0).multiplier == 3.0
