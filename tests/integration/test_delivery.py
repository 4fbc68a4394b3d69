"""Delayed messages arrive on time, never early, and never wait behind each other."""

from __future__ import annotations

from collections import Counter

import pytest

from delayq import Message
from delayq.message.envelope import (
    H_ATTEMPT,
    H_DELAY_MS,
    H_DUE_AT,
    H_PUBLISHED_AT,
    H_ROUTING_KEY,
    H_TIER,
    H_TIER_MS,
)

TOLERANCE_MS = 1_000
"""A message must arrive within this long after its tier's TTL (the issue's bound)."""


def test_every_tier_delivers_no_earlier_than_its_ttl_and_within_a_second(
    driver, make_topology, collect
):
    topo = make_topology(["1s", "2s", "4s", "8s"])
    driver.apply(topo)
    inbox = collect(f"{topo.namespace}.work")
    asks = {"1s": "1s", "2s": "1500ms", "4s": "4s", "8s": "5s"}
    receipts = {
        tier: driver.publish(topo, {"tier": tier}, "job.timing", delay)
        for tier, delay in asks.items()
    }
    arrivals = {a.message_id: a for a in inbox.wait(len(receipts), timeout_s=20)}
    for tier, receipt in receipts.items():
        assert receipt.tier == tier
        arrival = arrivals.get(receipt.message_id)
        assert arrival is not None, f"the {tier} message never arrived"
        waited_ms = arrival.at_ms - receipt.published_at_ms
        assert receipt.tier_ms <= waited_ms <= receipt.tier_ms + TOLERANCE_MS, (
            f"tier {tier}: arrived after {waited_ms:.0f} ms"
        )
        assert waited_ms >= receipt.delay_ms  # never early
        assert receipt.lateness.total_seconds() * 1000 == receipt.tier_ms - receipt.delay_ms


def test_a_short_delay_does_not_wait_behind_a_long_one(driver, make_topology, collect):
    topo = make_topology(["1s", "8s"])
    driver.apply(topo)
    inbox = collect(f"{topo.namespace}.work")
    long = driver.publish(topo, b"long", "job.hol", "8s")
    short = driver.publish(topo, b"short", "job.hol", "1s")
    first = inbox.wait(1, timeout_s=5)
    assert [a.message_id for a in first] == [short.message_id]
    waited = first[0].at_ms - short.published_at_ms
    assert 1_000 <= waited <= 1_000 + TOLERANCE_MS, f"the 1 s message took {waited:.0f} ms"
    both = inbox.wait(2, timeout_s=12)
    assert [a.message_id for a in both] == [short.message_id, long.message_id]


def test_zero_delay_is_delivered_immediately(driver, make_topology, collect):
    topo = make_topology(["1s"])
    driver.apply(topo)
    inbox = collect(f"{topo.namespace}.work")
    receipt = driver.publish(topo, {"hello": "now"}, "job.now", "0s")
    assert receipt.tier is None and receipt.exchange == topo.ready_exchange
    [arrival] = inbox.wait(1, timeout_s=5)
    assert arrival.message_id == receipt.message_id
    assert arrival.at_ms - receipt.published_at_ms < 1_000
    assert arrival.body == b'{"hello":"now"}'
    assert arrival.content_type == "application/json"


def test_headers_and_properties_on_the_wire(driver, make_topology, collect):
    topo = make_topology(["1s"])
    driver.apply(topo)
    inbox = collect(f"{topo.namespace}.work")
    receipt = driver.publish(
        topo, "text body", "job.props", "700ms", message_id="order-42", headers={"tenant": "acme"}
    )
    [arrival] = inbox.wait(1, timeout_s=5)
    headers = arrival.headers
    assert arrival.message_id == "order-42" == receipt.message_id
    assert arrival.routing_key == "job.props"  # survives dead-lettering
    assert arrival.content_type == "text/plain; charset=utf-8"
    assert headers["tenant"] == "acme"
    assert headers[H_DELAY_MS] == 700
    assert headers[H_TIER] == "1s" and headers[H_TIER_MS] == 1_000
    assert headers[H_DUE_AT] - headers[H_PUBLISHED_AT] == 1_000
    assert headers[H_ATTEMPT] == 1
    assert headers[H_ROUTING_KEY] in ("job.props", b"job.props")


def test_publish_many_ten_thousand_each_confirmed_and_delivered_once(
    driver, make_topology, collect
):
    topo = make_topology(["1s", "2s"])
    driver.apply(topo)
    inbox = collect(f"{topo.namespace}.work")
    delays = ["0s", "500ms", "1s", "2s"]
    batch = [
        Message(b"x" * 64, f"job.bulk.{n % 7}", delays[n % 4], message_id=f"bulk-{n}")
        for n in range(10_000)
    ]
    receipts = driver.publish_many(topo, batch)
    assert [r.message_id for r in receipts] == [m.message_id for m in batch]
    inbox.wait(10_000, timeout_s=60)
    arrivals = inbox.settle(1.0)
    counts = Counter(a.message_id for a in arrivals)
    assert len(counts) == 10_000
    assert max(counts.values()) == 1, "a message was delivered twice"


@pytest.mark.parametrize("routing_key", ["job.same"])
def test_concurrent_tiers_keep_their_own_order(driver, make_topology, collect, routing_key):
    """Messages of one tier arrive in publish order (queue order is expiry order)."""
    topo = make_topology(["1s"])
    driver.apply(topo)
    inbox = collect(f"{topo.namespace}.work")
    receipts = [driver.publish(topo, {"n": n}, routing_key, "1s") for n in range(20)]
    arrivals = inbox.wait(20, timeout_s=10)
    assert [a.message_id for a in arrivals] == [r.message_id for r in receipts]
