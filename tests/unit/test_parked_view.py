"""What `dlq list|show` print, without a broker: decoded values, reasons, masked headers."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from pika.compat import long

from delayq.consume.delivery import Delivery
from delayq.ops.parked import ParkedMessage
from delayq.ops.parked_view import (
    MASK,
    is_sensitive,
    message_detail,
    message_summary,
    plain,
    render_detail,
    render_list,
    sensitive_patterns,
)

NOW = 1_795_460_800_000
TIER_DEATH = {
    "count": long(1),
    "reason": "expired",
    "queue": "ns.tier.5s",
    "time": datetime(2026, 11, 23, tzinfo=timezone.utc),
    "exchange": "ns.tier.5s",
    "routing-keys": ["orders.paid"],
}


def _parked(headers, body=b'{"a":1}', dead_letters_of="orders"):
    delivery = Delivery(
        queue="orders.dlq",
        body=body,
        routing_key="orders.dlq",
        message_id="m-1",
        content_type="application/json",
        headers={"delayq-routing-key": "orders.paid", **headers},
    )
    return ParkedMessage(delivery, None, dead_letters_of)


def test_values_are_decoded_not_python_reprs():
    assert plain(long(1795460784958)) == 1795460784958
    assert repr(long(5)) == "5L"  # what `dlq show` printed before
    assert plain(b"caf\xc3\xa9") == "café"
    assert plain(b"\xff\x00") == "base64:/wA="
    assert plain([{"time": datetime(2026, 1, 2, tzinfo=timezone.utc)}]) == [
        {"time": "2026-01-02T00:00:00+00:00"}
    ]
    parked = _parked({"n": long(1795460784958), "raw": b"bytes", "x-death": [TIER_DEATH]})
    text = render_detail(message_detail(parked, NOW))
    assert "n = 1795460784958 " not in text  # not a timestamp header: no date appended
    assert "header        n = 1795460784958\n" in text
    assert "header        raw = bytes\n" in text
    assert "1795460784958L" not in text and "b'" not in text and "datetime.datetime" not in text
    assert "routing_key   orders.paid\n" in text  # the original, not the DLQ's
    assert 'body          {"a":1}\n' in text


def test_control_characters_and_binary_bodies_cannot_garble_the_terminal():
    text = render_detail(message_detail(_parked({"evil": "a\x1b[2Jb"}, body=b"\x00\xff"), NOW))
    assert "\x1b" not in text and "\x00" not in text
    assert '"a\\u001b[2Jb"' in text
    assert "(2 bytes, not UTF-8; base64) AP8=" in text


def test_the_broker_reason_is_the_destination_death_not_the_first_death():
    """x-first-death-* names the tier expiry every delayed message goes through."""
    limit = {**TIER_DEATH, "reason": "delivery_limit", "queue": "orders", "exchange": "ns.ready"}
    parked = _parked({"x-death": [limit, TIER_DEATH], "x-first-death-reason": "expired"})
    assert parked.reason == "delivery limit (orders)"
    assert parked.death is not None and parked.death.reason == "delivery_limit"
    for reason, word in (
        ("expired", "expired"),
        ("maxlen", "max length"),
        ("rejected", "rejected"),
    ):
        assert _parked({"x-death": [{**limit, "reason": reason}]}).reason == f"{word} (orders)"
    # Only the tier's death: it is not why the message is parked.
    assert _parked({"x-death": [TIER_DEATH]}).reason == "-"
    # delayq's own reason wins: the consumer dead-lettered it with its own headers.
    own = _parked({"x-death": [limit], "delayq-dead-letter-reason": b"exhausted"})
    assert own.reason == "exhausted" and own.death is None
    # Not a DLQ (<ns>.unrouted takes no dead letters): no broker reason.
    assert _parked({"x-death": [limit]}, dead_letters_of=None).reason == "-"


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "proxy-authorization",
        "Cookie",
        "Set-Cookie",
        "X-Api-Key",
        "api_key",
        "db_password",
        "x-auth-token",
        "client-secret",
        "X-Session-Id",
    ],
)
def test_sensitive_header_names_are_masked(name):
    assert is_sensitive(name)
    detail = message_detail(_parked({name: "hunter2"}), NOW)
    assert detail["headers"][name] == MASK and detail["masked_headers"] == [name]
    assert "hunter2" not in json.dumps(detail) and "hunter2" not in render_detail(detail)
    revealed = message_detail(_parked({name: "hunter2"}), NOW, reveal=True)
    assert revealed["headers"][name] == "hunter2" and revealed["masked_headers"] == []


@pytest.mark.parametrize("name", ["content-kind", "tenant", "delayq-attempt", "x-death"])
def test_ordinary_headers_are_shown(name):
    assert not is_sensitive(name)


def test_more_headers_can_be_masked():
    patterns = sensitive_patterns(["Tenant", " ", "x_customer"])
    assert is_sensitive("tenant-id", patterns) and is_sensitive("X-Customer-Email", patterns)
    detail = message_detail(_parked({"tenant-id": "acme"}), NOW, patterns=patterns)
    assert detail["headers"]["tenant-id"] == MASK


def test_list_rows_and_table():
    parked = _parked({"delayq-failed-at": NOW - 90_000, "delayq-attempt": 3})
    row = message_summary(parked, NOW)
    assert row == {
        "message_id": "m-1",
        "routing_key": "orders.paid",
        "attempts": 3,
        "parked_at": "2026-11-23T19:05:10.000+00:00",
        "age_ms": 90_000,
        "reason": "-",
        "error": "-",
    }
    table = render_list(
        [row, {**row, "message_id": "m-2", "reason": "delivery limit (orders)"}], 10
    )
    assert "orders.paid" in table and "1m30s" in table and "delivery limit (orders)" in table
    assert table.endswith("# 2 shown (at most 10)\n")


def test_an_id_is_found_by_the_cut_form_list_prints_or_by_a_prefix() -> None:
    from delayq.errors import InvalidInput
    from delayq.ops.parked import find_id

    ids = ["order-42-reminder", "order-42-refund", "x...", "x...y"]
    assert find_id("order-42-rem…", ids) == "order-42-reminder"
    assert find_id("order-42-ref...", ids) == "order-42-refund"
    assert find_id("order-42-refund", ids) == "order-42-refund"
    assert find_id("x...", ids) == "x..."  # the whole id first, though it ends in "..."
    assert find_id("nothing", ids) is None
    assert find_id("", ids) is None and find_id("…", ids) is None
    with pytest.raises(InvalidInput, match=r"ambiguous.*order-42-reminder, order-42-refund"):
        find_id("order-42-re…", ids)
