"""Durations: timedelta or "1h30m"-style strings in, whole milliseconds out."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.durations import ACCEPTED_FORMS, format_ms, to_ms, to_timedelta
from delayq.errors import InvalidDelay, InvalidInput

# --- accepted strings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        ("0s", 0),
        ("500ms", 500),
        ("90s", 90_000),
        ("15m", 900_000),
        ("1h30m", 5_400_000),
        ("24h", 86_400_000),
        ("2d", 172_800_000),
        ("1d2h3m4s5ms", 93_784_005),
        ("1m500ms", 60_500),
    ],
)
def test_to_ms_parses_unit_strings(text: str, expected_ms: int) -> None:
    assert to_ms(text) == expected_ms


def test_to_ms_ignores_surrounding_and_inner_spaces() -> None:
    assert to_ms(" 1h 30m ") == 5_400_000


def test_to_ms_reads_ms_as_milliseconds_not_minutes_then_seconds() -> None:
    assert to_ms("1ms") == 1


# --- accepted timedeltas -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected_ms"),
    [
        (timedelta(0), 0),
        (timedelta(milliseconds=500), 500),
        (timedelta(minutes=15), 900_000),
        (timedelta(days=2), 172_800_000),
        (timedelta(days=1, hours=1, milliseconds=7), 90_000_007),
    ],
)
def test_to_ms_converts_timedelta(value: timedelta, expected_ms: int) -> None:
    assert to_ms(value) == expected_ms


@pytest.mark.parametrize(
    ("value", "expected_ms"),
    [
        (timedelta(microseconds=1), 1),
        (timedelta(microseconds=999), 1),
        (timedelta(microseconds=1_001), 2),
        (timedelta(seconds=1, microseconds=1), 1_001),
    ],
)
def test_to_ms_rounds_sub_millisecond_timedelta_up(value: timedelta, expected_ms: int) -> None:
    assert to_ms(value) == expected_ms


@given(st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=10_000)))
def test_to_ms_of_timedelta_is_the_ceiling_in_ms(value: timedelta) -> None:
    ms = to_ms(value)
    assert isinstance(ms, int)
    assert timedelta(milliseconds=ms) >= value
    assert timedelta(milliseconds=ms) - value < timedelta(milliseconds=1)


def test_to_ms_returns_int_for_strings() -> None:
    assert type(to_ms("1h")) is int


# --- rejected values -----------------------------------------------------------------------------

REJECTED = [
    pytest.param(5, id="bare-int"),
    pytest.param(0, id="bare-zero"),
    pytest.param(1.5, id="bare-float"),
    pytest.param(True, id="bool"),
    pytest.param(math.nan, id="nan"),
    pytest.param(None, id="none"),
    pytest.param(b"1s", id="bytes"),
    pytest.param(["1s"], id="list"),
    pytest.param(timedelta(seconds=-1), id="negative-timedelta"),
    pytest.param(timedelta(microseconds=-1), id="negative-microsecond"),
    pytest.param("-1s", id="negative-string"),
    pytest.param(" -5m", id="negative-string-with-space"),
    pytest.param("", id="empty"),
    pytest.param("   ", id="blank"),
    pytest.param("abc", id="garbage"),
    pytest.param("1x", id="unknown-unit"),
    pytest.param("1.5s", id="fraction"),
    pytest.param("s", id="unit-without-number"),
    pytest.param("10", id="number-without-unit"),
    pytest.param("1h30", id="trailing-number"),
    pytest.param("1S", id="upper-case-unit"),
    pytest.param("+1s", id="plus-sign"),
]


@pytest.mark.parametrize("value", REJECTED)
def test_to_ms_rejects(value: object) -> None:
    with pytest.raises(InvalidDelay):
        to_ms(value)


def test_invalid_delay_is_an_invalid_input_and_a_value_error() -> None:
    with pytest.raises(InvalidInput):
        to_ms("abc")
    with pytest.raises(ValueError):
        to_ms("abc")


@pytest.mark.parametrize(
    "value",
    [5, 1.5, True, math.nan, None, "", "abc", "1x", "1.5s", "s", object()],
    ids=lambda value: "object" if type(value) is object else repr(value),  # stable for xdist
)
def test_rejection_message_names_the_accepted_forms(value: object) -> None:
    with pytest.raises(InvalidDelay) as info:
        to_ms(value)
    message = str(info.value)
    assert ACCEPTED_FORMS in message
    assert "timedelta" in message
    assert "1h30m" in message


def test_bare_number_message_says_it_has_no_unit() -> None:
    with pytest.raises(InvalidDelay, match="no unit"):
        to_ms(30)


def test_negative_message_says_negative() -> None:
    with pytest.raises(InvalidDelay, match="negative"):
        to_ms(timedelta(seconds=-3))


def test_what_names_the_value_in_the_message() -> None:
    with pytest.raises(InvalidDelay, match=r"^tier 'abc'"):
        to_ms("abc", what="tier")


# --- format_ms -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ms", "label"),
    [
        (0, "0s"),
        (1, "1ms"),
        (500, "500ms"),
        (30_000, "30s"),
        (90_000, "1m30s"),
        (5_400_000, "1h30m"),
        (86_400_000, "24h"),
        (172_800_000, "48h"),
        (3_723_004, "1h2m3s4ms"),
    ],
)
def test_format_ms_labels(ms: int, label: str) -> None:
    assert format_ms(ms) == label


def test_format_ms_rejects_negative() -> None:
    with pytest.raises(ValueError):
        format_ms(-1)


@given(st.integers(min_value=0, max_value=10**10))
def test_format_ms_round_trips_through_to_ms(ms: int) -> None:
    assert to_ms(format_ms(ms)) == ms


@given(st.integers(min_value=0, max_value=10**10))
def test_to_timedelta_is_the_inverse_of_to_ms(ms: int) -> None:
    assert to_ms(to_timedelta(ms)) == ms
