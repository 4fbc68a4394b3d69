"""What pika can read but not write again is found before a message goes out."""

from __future__ import annotations

from typing import Any

import pytest

from delayq.message.carried import unwritable
from delayq.message.envelope import OutgoingMessage, Receipt


def message(headers: dict[Any, Any]) -> OutgoingMessage:
    receipt = Receipt("m1", "k", "ex", None, 0, 0, 0)
    return OutgoingMessage("ex", "k", b"", "application/json", "m1", 0, headers, receipt)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"a": "text", "b": b"bytes", "c": True, "d": None, "e": 2**63 - 1, "f": -(2**63)},
        {"t": {"inner": [1, "x", {"deep": b"y"}]}},
        {"a": [[{"b": [{"c": 1}]}]]},
    ],
)
def test_what_pika_writes_is_writable(headers: dict[Any, Any]) -> None:
    assert unwritable(message(headers)) is None


@pytest.mark.parametrize(
    "headers",
    [
        {b"\xff": 1},  # a name pika read as bytes (not UTF-8)
        {"t": {b"\xff": 1}},
        {"a": [1, {"b": [{b"\xfe": "x"}]}]},
        {"a": ({b"n": 1},)},
    ],
)
def test_a_name_that_is_not_text_anywhere_is_found(headers: dict[Any, Any]) -> None:
    assert unwritable(message(headers)) == "a header name is not UTF-8 text"


@pytest.mark.parametrize("value", [10**30, 1.5, {"inner": 1.5}])
def test_a_value_pika_reads_but_cannot_write_is_found_by_encoding(value: object) -> None:
    why = unwritable(message({"v": value}))  # a float pika read from a table, a huge int
    assert why is not None and why != "a header name is not UTF-8 text"


def test_a_table_nested_past_any_pika_writes_is_refused() -> None:
    table: dict[str, Any] = {}
    inner = table
    for _ in range(120):
        inner["n"] = {}
        inner = inner["n"]
    assert "more than 100 levels deep" in (unwritable(message(table)) or "")


def test_arrays_nested_past_the_limit_are_named_as_such() -> None:
    value: list[Any] = []
    for _ in range(120):
        value = [value]
    assert "more than 100 levels deep" in (unwritable(message({"a": value})) or "")
