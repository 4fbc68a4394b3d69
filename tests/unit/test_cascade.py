"""The exact strategy's pure core: bits to key, key to hops and destination, levels as
declarations, and the routes both publishers and the consumers' retries take."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.consume.delivery import Action, Delivery, Retry
from delayq.consume.planner import DeliveryPlanner
from delayq.consume.retry import FixedBackoff
from delayq.errors import DelayTooLong, InvalidInput, InvalidRoutingKey, InvalidTopology
from delayq.message.envelope import H_ROUTING_KEY, H_TIER_MS
from delayq.message.factory import MessageFactory
from delayq.topology.cascade import (
    MAX_LEVELS,
    Kind,
    Strategy,
    decode_key,
    default_levels,
    delivery_binding_key,
    encode_key,
    entry_level,
    hops,
    key_overhead,
    level_binding_keys,
    plan_cascade,
    units_for,
)
from delayq.topology.declarations import BindingDecl, ExchangeDecl, QueueDecl, build_declarations
from delayq.topology.model import Topology
from delayq.topology.route import Router

WORD = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=8)
TARGETS = st.lists(WORD, min_size=1, max_size=6).map(".".join)


def topic_matches(binding: str, key: str) -> bool:
    """RabbitMQ's topic matching: '*' one word, '#' zero or more words."""
    pattern = "^"
    for i, word in enumerate(binding.split(".")):
        if word == "#":
            pattern += r"(?:[^.]*(?:\.[^.]*)*)?" if i == 0 else r"(?:\.[^.]*)*"
        else:
            pattern += ("" if i == 0 else r"\.") + ("[^.]*" if word == "*" else re.escape(word))
    return re.fullmatch(pattern + "$", key) is not None


@given(
    st.integers(1, MAX_LEVELS).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, 2**n - 1))),
    st.sampled_from(list(Kind)),
    TARGETS,
)
def test_a_key_decodes_to_its_units_kind_and_exact_target(nu, kind, target):
    levels, units = nu
    key = encode_key(units, levels, kind, target)
    assert decode_key(key, levels).units == units
    assert decode_key(key, levels).kind is kind
    assert decode_key(key, levels).target == target  # dots and all
    assert len(key) == key_overhead(levels) + len(target)  # bounded: no growth


@given(
    st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, 2**n - 1))), TARGETS
)
def test_the_level_bindings_walk_a_key_through_exactly_its_set_bits(nu, target):
    """Simulate the topic bindings: enter at the highest set bit, wait where the bit is
    1, pass on where it is 0; the waits add up to the delay in units."""
    levels, units = nu
    key = encode_key(units, levels, Kind.ROUTE, target)
    level, waited, visited = entry_level(units), 0, 0
    while level >= 0:
        to_queue, onwards = level_binding_keys(level, levels)
        assert topic_matches(to_queue, key) != topic_matches(onwards, key)  # exactly one
        if topic_matches(to_queue, key):
            waited += 2**level
            visited += 1
        level -= 1
    assert waited == units
    assert visited == hops(units)
    route = delivery_binding_key(levels, Kind.ROUTE, target)
    address = delivery_binding_key(levels, Kind.ADDRESS, target)
    assert topic_matches(route, key) and not topic_matches(address, key)


def test_destination_bindings_with_wildcards_match_behind_the_bits_and_never_an_address():
    key = encode_key(5, 4, Kind.ROUTE, "orders.eu.created")
    assert topic_matches(delivery_binding_key(4, Kind.ROUTE, "orders.#"), key)
    assert topic_matches(delivery_binding_key(4, Kind.ROUTE, "#"), key)
    assert topic_matches(delivery_binding_key(4, Kind.ROUTE, "*.eu.*"), key)
    assert not topic_matches(delivery_binding_key(4, Kind.ROUTE, "orders.*"), key)
    address = encode_key(5, 4, Kind.ADDRESS, "shop.work")
    assert not topic_matches(delivery_binding_key(4, Kind.ROUTE, "#"), address)
    assert topic_matches(delivery_binding_key(4, Kind.ADDRESS, "shop.work"), address)
    assert not topic_matches(delivery_binding_key(4, Kind.ADDRESS, "shop.work2"), address)


@given(st.integers(1, 10**9), st.integers(1, 10**6))
def test_rounding_is_up_never_early_and_less_than_one_unit_late(delay_ms, unit_ms):
    units = units_for(delay_ms, unit_ms)
    assert units * unit_ms >= delay_ms
    assert units * unit_ms - delay_ms < unit_ms


def test_plan_immediate_exact_and_too_long():
    assert plan_cascade(0, 1000, 5, Kind.ROUTE, "a") is None
    plan = plan_cascade(10_001, 1000, 5, Kind.ROUTE, "a.b")
    assert plan is not None
    assert (plan.units, plan.level, plan.hops, plan.wait_ms) == (11, 3, 3, 11_000)
    assert plan.routing_key == "0.1.0.1.1.r.a.b"
    assert plan_cascade(31_000, 1000, 5, Kind.ROUTE, "a") is not None
    with pytest.raises(DelayTooLong, match="exact strategy's maximum 31s"):
        plan_cascade(31_001, 1000, 5, Kind.ROUTE, "a")


@pytest.mark.parametrize("bad", ["", "1.0.r", "1.0.1.x.a", "2.0.1.r.a", "1.0.r.a"])
def test_decode_refuses_what_encode_never_makes(bad):
    with pytest.raises(ValueError):
        decode_key(bad, 3)


def test_default_levels_cover_the_ladder_and_are_capped():
    assert default_levels(86_400_000, 1000) == 17  # 24h: 2**17 - 1 >= 86,400
    assert 2**17 - 1 >= 86_400 > 2**16 - 1
    assert default_levels(1000, 1000) == 1
    assert default_levels(2**31 - 1, 1) == MAX_LEVELS
    assert Topology().exact_levels == 17


def exact_topology(**kwargs) -> Topology:
    return Topology(
        namespace="shop",
        ladder=["1s", "4s"],
        strategy="exact",
        exact={"unit": "250ms", "levels": 4},
        destinations=[
            {"queue": "shop.work", "bindings": ["job.#"]},
            {"queue": "shop.audit", "bindings": ["#"]},
        ],
        **kwargs,
    )


def test_levels_are_plain_declarations():
    decls = build_declarations(exact_topology())
    exchanges = {d.name: d for d in decls if isinstance(d, ExchangeDecl)}
    queues = {d.name: d for d in decls if isinstance(d, QueueDecl)}
    bindings = [d for d in decls if isinstance(d, BindingDecl)]
    assert exchanges["shop.delivery"].arguments == {"alternate-exchange": "shop.unrouted"}
    for k in range(4):
        assert exchanges[f"shop.level.{k}"].type == "topic"
        args = queues[f"shop.level.{k}"].arguments
        assert args["x-message-ttl"] == 250 * 2**k
        assert args["x-dead-letter-exchange"] == (
            "shop.delivery" if k == 0 else f"shop.level.{k - 1}"
        )
        assert args["x-dead-letter-strategy"] == "at-least-once"
        assert queues[f"shop.level.{k}"].role == "level"
    onwards = [b for b in bindings if b.destination_type == "exchange"]
    assert [(b.source, b.destination, b.routing_key) for b in onwards] == [
        ("shop.level.0", "shop.delivery", "*.*.*.0.#"),  # bit 0 is the last one
        ("shop.level.1", "shop.level.0", "*.*.0.#"),
        ("shop.level.2", "shop.level.1", "*.0.#"),
        ("shop.level.3", "shop.level.2", "0.#"),
    ]
    on_delivery = {(b.destination, b.routing_key) for b in bindings if b.source == "shop.delivery"}
    assert on_delivery == {
        ("shop.work", "*.*.*.*.r.job.#"),
        ("shop.work", "*.*.*.*.q.shop.work"),
        ("shop.audit", "*.*.*.*.r.#"),
        ("shop.audit", "*.*.*.*.q.shop.audit"),
    }
    # exchanges come first, so every dead-letter target exists before its queue
    first_queue = next(i for i, d in enumerate(decls) if isinstance(d, QueueDecl))
    assert all(isinstance(d, ExchangeDecl) for d in decls[:first_queue])
    assert not any(
        d.name.startswith("shop.level") for d in build_declarations(Topology(namespace="shop"))
    )


def test_topology_refuses_bad_cascades():
    with pytest.raises(InvalidTopology, match="levels"):
        Topology.from_mapping({"exact": {"levels": 29}})
    with pytest.raises(InvalidTopology, match="longer than the maximum TTL"):
        Topology.from_mapping({"exact": {"unit": "1h", "levels": 20}})
    with pytest.raises(InvalidTopology, match="cascade key"):
        Topology.from_mapping(
            {
                "exact": {"unit": "10ms", "levels": 28},  # 28 bits: 197 bytes left of 255
                "destinations": [{"queue": "q" * 198, "bindings": ["a"]}],
            }
        )
    ok = {
        "exact": {"unit": "10ms", "levels": 28},
        "destinations": [{"queue": "q" * 197, "bindings": ["a"]}],
    }
    assert Topology.from_mapping(ok).exact_levels == 28
    with pytest.raises(InvalidTopology, match="reserves"):
        Topology.from_mapping({"destinations": [{"queue": "delayq.level.1", "bindings": ["a"]}]})


def test_publish_routes_through_the_highest_set_level_and_says_so():
    factory = MessageFactory(exact_topology(), clock_ms=lambda: 1_000_000)
    msg = factory.build(b"x", "job.a.b", timedelta(milliseconds=1_300))  # 5.2 -> 6 units
    assert msg.exchange == "shop.level.2"
    assert msg.routing_key == "0.1.1.0.r.job.a.b"
    receipt = msg.receipt
    assert receipt.strategy is Strategy.EXACT and receipt.hops == 2
    assert receipt.routing_key == "job.a.b" and msg.headers[H_ROUTING_KEY] == "job.a.b"
    assert receipt.tier_ms == 1_500 == msg.headers[H_TIER_MS]
    assert receipt.due_at.timestamp() * 1000 == 1_001_500
    now = factory.build(b"x", "job.a", "0s")
    assert (now.exchange, now.routing_key, now.receipt.hops) == ("shop.ready", "job.a", 0)
    tiered = factory.build(b"x", "job.a", "3s", strategy="tiered")
    assert (tiered.exchange, tiered.receipt.strategy, tiered.receipt.hops) == (
        "shop.tier.4s",
        Strategy.TIERED,
        1,
    )
    with pytest.raises(DelayTooLong):
        factory.build(b"x", "job.a", "3751ms")  # 16 units > 2**4 - 1
    with pytest.raises(InvalidInput, match="unknown strategy"):
        factory.build(b"x", "job.a", "1s", strategy="fast")
    with pytest.raises(InvalidRoutingKey, match="too long for the exact strategy"):
        factory.build(b"x", "k" * 250, "1s")
    with pytest.raises(InvalidInput, match="no exact levels"):
        MessageFactory(Topology()).build(b"x", "a", "1s", strategy="exact")


def test_retries_go_through_the_cascade_addressed_to_the_failing_queue_and_stay_bounded():
    topo = exact_topology()
    planner = DeliveryPlanner(topo, "shop.work", policy=FixedBackoff(delay="700ms", max_attempts=9))
    factory = MessageFactory(topo)
    first = factory.build(b"x", "job.a.b", "1s")
    delivery = Delivery(
        "shop.work", b"x", first.routing_key, "m1", first.content_type, first.headers
    )
    keys = []
    for _ in range(5):  # each retry's key is rebuilt from the queue name: no growth
        decision = planner.failure(delivery, RuntimeError("down"))
        assert decision.action is Action.RETRY and decision.message is not None
        msg = decision.message
        keys.append(msg.routing_key)
        assert msg.exchange == "shop.level.1"  # 700 ms -> 3 units = 0b11
        assert decode_key(msg.routing_key, 4).target == "shop.work"
        assert decode_key(msg.routing_key, 4).kind is Kind.ADDRESS
        assert msg.receipt.strategy is Strategy.EXACT and msg.receipt.hops == 2
        assert msg.headers[H_ROUTING_KEY] == "job.a.b"
        delivery = Delivery("shop.work", b"x", msg.routing_key, "m1", None, msg.headers)
    assert len(set(keys)) == 1
    with pytest.raises(InvalidInput, match="exact strategy's maximum"):
        DeliveryPlanner(topo, "shop.work", policy=FixedBackoff(delay="1h"))
    # A handler's own Retry is only known at run time: dead-lettered, not lost.
    assert planner.failure(delivery, Retry("1h")).action is Action.DEAD_LETTER


def test_export_and_stats_cover_the_levels():
    from delayq.ops.depths import stats_rows
    from delayq.topology.definitions import export_definitions

    topo = exact_topology()
    doc = export_definitions(topo)
    onwards = [b for b in doc["bindings"] if b["destination_type"] == "exchange"]
    assert {(b["source"], b["destination"]) for b in onwards} == {
        ("shop.level.0", "shop.delivery"),
        *((f"shop.level.{k}", f"shop.level.{k - 1}") for k in range(1, 4)),
    }
    assert {q["name"] for q in doc["queues"]} >= {f"shop.level.{k}" for k in range(4)}
    levels = [row.queue for row in stats_rows(topo) if row.role == "level"]
    assert levels == [f"shop.level.{k}" for k in range(4)]
    assert not [row for row in stats_rows(Topology()) if row.role == "level"]


def test_a_policy_schedule_through_the_cascade_waits_whole_units_not_tiers():
    router = Router(exact_topology())
    rows = FixedBackoff(delay="1300ms", max_attempts=3).schedule(router)
    assert [(r.requested_ms, r.tier_ms, r.tier, r.hops, r.cumulative_ms) for r in rows] == [
        (1300, 1500, "exact", 2, 1500),  # 5.2 units -> 6 = 0b110
        (1300, 1500, "exact", 2, 3000),
    ]
    # The same label a published message's receipt and x-delayq-tier header carry.
    sent = MessageFactory(exact_topology()).build(b"x", "job.a", "1300ms")
    assert (sent.receipt.tier, sent.receipt.hops) == ("exact", 2)
    with pytest.raises(DelayTooLong, match="retry 1"):
        FixedBackoff(delay="4s", max_attempts=2).schedule(router)
