"""The Router: every routing decision of a topology in one place, and every user of a
delay (publishers, the delivery planner, bulk planning, retry plans) agreeing with it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.consume.delivery import Action, Delivery
from delayq.consume.planner import DeliveryPlanner
from delayq.consume.retry import FixedBackoff
from delayq.errors import DelayTooLong, InvalidInput, InvalidRoutingKey
from delayq.message.bulk import BulkPlanner, Rejection, Row
from delayq.message.factory import MessageFactory
from delayq.topology.cascade import Kind, Strategy, decode_key
from delayq.topology.model import Topology
from delayq.topology.route import EXACT_LABEL, IMMEDIATE, Router, Wait

DESTINATIONS = [{"queue": "shop.work", "bindings": ["job.#"]}]


def tiered() -> Topology:
    return Topology(namespace="shop", ladder=["1s", "5s", "1m"], destinations=DESTINATIONS)


def exact() -> Topology:
    return Topology(
        namespace="shop",
        ladder=["1s", "4s"],
        strategy="exact",
        exact={"unit": "250ms", "levels": 4},
        destinations=DESTINATIONS,
    )


def test_tiered_to_destinations_takes_the_smallest_tier_at_or_above() -> None:
    router = Router(tiered())
    assert router.to_destinations(1_001, "job.a") == (
        "shop.tier.5s",
        "job.a",
        Wait(Strategy.TIERED, "5s", 5_000, 1),
    )
    assert router.to_destinations(1_000, "job.a").exchange == "shop.tier.1s"
    assert router.to_destinations(0, "job.a") == ("shop.ready", "job.a", IMMEDIATE)
    with pytest.raises(DelayTooLong, match="largest tier"):
        router.to_destinations(60_001, "job.a")


def test_tiered_retries_go_to_one_queue_through_the_direct_exchanges() -> None:
    topo = tiered()
    router = Router(topo)
    assert router.to_queue(2_000, "shop.work") == (
        "shop.retry.5s.direct",
        "shop.work",
        Wait(Strategy.TIERED, "5s", 5_000, 1),
    )
    assert router.to_queue(0, "shop.work") == (topo.direct_exchange, "shop.work", IMMEDIATE)


def test_exact_routes_enter_the_cascade_at_the_highest_bit() -> None:
    router = Router(exact())
    route = router.to_destinations(700, "job.a")  # 3 units = 0b11
    assert route.exchange == "shop.level.1" and route.wait == Wait(Strategy.EXACT, "exact", 750, 2)
    assert decode_key(route.routing_key, 4).kind is Kind.ROUTE
    assert decode_key(route.routing_key, 4).target == "job.a"
    retry = router.to_queue(700, "shop.work")
    assert decode_key(retry.routing_key, 4).kind is Kind.ADDRESS
    assert decode_key(retry.routing_key, 4).target == "shop.work"
    # Immediate: as in the tiered strategy, but still labelled with its strategy.
    now = Wait(Strategy.EXACT, None, 0, 0)
    assert router.to_destinations(0, "job.a") == ("shop.ready", "job.a", now)
    assert router.to_queue(0, "shop.work") == (exact().direct_exchange, "shop.work", now)
    with pytest.raises(DelayTooLong, match="exact strategy's maximum"):
        router.to_queue(3_751, "shop.work")
    with pytest.raises(InvalidRoutingKey, match="too long for the exact strategy"):
        router.to_destinations(700, "k" * 250)


def test_a_publish_may_choose_its_strategy_but_only_one_the_topology_has() -> None:
    assert Router(tiered()).strategy() is Strategy.TIERED
    assert Router(exact()).strategy("tiered") is Strategy.TIERED
    assert Router(exact()).to_destinations(700, "job.a", Strategy.TIERED).exchange == (
        "shop.tier.1s"
    )
    with pytest.raises(InvalidInput, match="unknown strategy 'fast'"):
        Router(tiered()).strategy("fast")
    with pytest.raises(InvalidInput, match="no exact levels"):
        Router(tiered()).strategy("exact")


def test_the_longest_wait_is_said_in_words() -> None:
    assert Router(tiered()).longest() == (60_000, "the largest tier 1m")
    assert Router(exact()).longest() == (3_750, "the exact strategy's maximum 3s750ms")


def test_one_label_per_wait() -> None:
    assert IMMEDIATE.shown == "immediate"
    assert Router(exact()).wait(700).shown == EXACT_LABEL == "exact"
    assert Router(tiered()).wait(700).shown == "1s"


@given(delay_ms=st.integers(min_value=0, max_value=60_000), exact_strategy=st.booleans())
def test_every_user_of_a_delay_agrees_with_the_router(delay_ms: int, exact_strategy: bool) -> None:
    """A publish's receipt and headers, a retry's, a bulk rejection's tier and a retry
    plan's row all read the one Router; the wait is never shorter than the delay."""
    topo = exact() if exact_strategy else tiered()
    router = Router(topo)
    try:
        wait = router.wait(delay_ms)
    except DelayTooLong:
        with pytest.raises(DelayTooLong):
            MessageFactory(topo).build(b"x", "job.a", f"{delay_ms}ms")
        return
    assert wait.ms >= delay_ms and (wait.label is None) == (delay_ms == 0)
    sent = MessageFactory(topo).build(b"x", "job.a", f"{delay_ms}ms")
    receipt = sent.receipt
    assert (receipt.tier, receipt.tier_ms, receipt.hops, receipt.strategy) == (
        wait.label,
        wait.ms,
        wait.hops,
        wait.strategy,
    )
    assert (sent.exchange, sent.routing_key) == router.to_destinations(delay_ms, "job.a")[:2]
    if delay_ms:
        planner = DeliveryPlanner(
            topo, "shop.work", policy=FixedBackoff(delay=f"{delay_ms}ms", max_attempts=3)
        )
        delivery = Delivery(
            "shop.work", b"x", sent.routing_key, "m1", sent.content_type, sent.headers
        )
        decision = planner.failure(delivery, RuntimeError("down"))
        assert decision.action is Action.RETRY and decision.message is not None
        route = router.to_queue(delay_ms, "shop.work")
        assert (decision.message.exchange, decision.message.routing_key) == route[:2]
        assert decision.message.receipt.hops == route.wait.hops
        row = FixedBackoff(delay=f"{delay_ms}ms", max_attempts=2).schedule(router)[0]
        assert (row.tier, row.tier_ms, row.hops) == (wait.shown, wait.ms, wait.hops)
    # A bulk row rejected for another reason still shows where its delay would go.
    rejection = BulkPlanner(topo).plan(
        Row(key=None, routing_key="job.a", body=b"x", delay=f"{delay_ms}ms")
    )
    assert isinstance(rejection, Rejection) and rejection.tier == wait.shown
