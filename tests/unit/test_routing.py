"""Publishing refuses a routing key no binding of the topology matches (issue 12, item 8)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from delayq import (
    DelayqError,
    InvalidInput,
    InvalidRoutingKey,
    InvalidTopology,
    Message,
    Topology,
    UnboundRoutingKey,
    Unroutable,
)
from delayq.message.bulk import BulkPlanner, Row
from delayq.message.factory import MessageFactory
from delayq.testing import MemoryBroker
from delayq.topology.topic import BindingKeys, topic_matches

SHOP = Topology(
    namespace="shop",
    ladder=["1s", "5s"],
    destinations=[
        {"queue": "shop.emails", "bindings": ["email.*"]},
        {"queue": "shop.orders", "bindings": ["orders.#", "bad.debt"]},
    ],
)


def factory(topology: Topology = SHOP) -> MessageFactory:
    return MessageFactory(topology, clock_ms=lambda: 0, new_id=lambda: "id-1")


# --- the matcher -----------------------------------------------------------------------------


def test_the_testing_package_reuses_the_core_matcher() -> None:
    import delayq.testing

    assert delayq.testing.topic_matches is topic_matches


@pytest.mark.parametrize(
    ("keys", "routing_key", "match"),
    [
        (["email.*"], "email.welcome", "email.*"),
        (["email.*"], "email.welcome.again", None),
        (["email.*"], "emial.welcome", None),
        (["orders.#", "email.*"], "orders", "orders.#"),
        (["a.b", "#"], "anything.at.all", "#"),
        ([], "a", None),
    ],
)
def test_binding_keys_name_the_first_match(
    keys: list[str], routing_key: str, match: str | None
) -> None:
    bound = BindingKeys(keys)
    assert bound.match(routing_key) == match
    assert bound.match(routing_key) == match  # from the cache, the same answer


def test_the_cache_stays_bounded() -> None:
    bound = BindingKeys(["k.*"])
    for i in range(BindingKeys._CACHE_MAX + 10):
        bound.match(f"k.{i}")
    assert len(bound._seen) <= BindingKeys._CACHE_MAX


# --- the factory -----------------------------------------------------------------------------


@pytest.mark.parametrize("delay", ["0s", "1s", "4s"])
@pytest.mark.parametrize("strategy", ["tiered", "exact"])
def test_a_typo_raises_for_every_delay_and_strategy(delay: str, strategy: str) -> None:
    topology = Topology.model_validate({**SHOP.model_dump(), "exact": {"unit": "1s"}})
    with pytest.raises(UnboundRoutingKey) as caught:
        factory(topology).build(b"x", "emial.welcome", delay, strategy=strategy)
    assert "did you mean 'email.welcome' (bound by 'email.*')?" in str(caught.value)
    assert "shop.unrouted" in str(caught.value) and "external_bindings" in str(caught.value)
    assert factory(topology).build(b"x", "email.welcome", delay, strategy=strategy)


def test_the_error_is_unroutable_and_invalid_input_and_a_delayq_error() -> None:
    with pytest.raises(UnboundRoutingKey) as caught:
        factory().build(b"x", "bda.x", "1s")
    assert isinstance(caught.value, Unroutable)  # what the issue asks for
    assert isinstance(caught.value, InvalidInput)  # nothing was sent: the CLI exits 2
    assert isinstance(caught.value, DelayqError) and isinstance(caught.value, ValueError)


def test_other_input_errors_come_first() -> None:
    with pytest.raises(InvalidRoutingKey):
        factory().build(b"x", "email.*", "1s")  # a wildcard is not a routing key


def test_a_topology_without_destinations_refuses_every_key_and_says_why() -> None:
    with pytest.raises(UnboundRoutingKey, match="lists no destinations"):
        factory(Topology(namespace="shop")).build(b"x", "email.welcome", "30s")


def test_external_bindings_accept_keys_bound_outside_the_file() -> None:
    topology = Topology.model_validate({**SHOP.model_dump(), "external_bindings": ["audit.#"]})
    assert factory(topology).build(b"x", "audit.login", "1s").routing_key == "audit.login"
    with pytest.raises(UnboundRoutingKey):
        factory(topology).build(b"x", "audits.login", "1s")
    everything = Topology(namespace="shop", external_bindings=["#"])
    assert factory(everything).build(b"x", "any.key.at.all", "30s")


@pytest.mark.parametrize("bad", ["a..b", "a b", "", "a.#x"])
def test_external_bindings_are_checked_like_binding_keys(bad: str) -> None:
    with pytest.raises(InvalidTopology, match="external_bindings"):
        Topology(external_bindings=[bad])


def test_build_many_names_the_unbound_message_and_builds_nothing() -> None:
    batch = [Message(b"x", "email.a", "1s"), Message(b"y", "emial.b", "1s")]
    with pytest.raises(UnboundRoutingKey, match=r"message 1: routing key 'emial\.b'"):
        factory().build_many(batch)


def test_a_bulk_row_with_a_typo_becomes_a_rejection_with_the_reason() -> None:
    planned = BulkPlanner(SHOP, clock_ms=lambda: 0).plan(Row("k", "emial.b", None, delay="1s"))
    assert not isinstance(planned, type(factory().build(b"", "email.a", "1s")))
    assert planned.error == "UnboundRoutingKey"  # type: ignore[union-attr]
    assert "did you mean 'email.b' (bound by 'email.*')" in planned.reason  # type: ignore[union-attr]
    assert planned.tier == "1s"  # type: ignore[union-attr]


# --- the memory adapters (the same factory) -------------------------------------------------


def test_memory_publishers_refuse_the_typo_and_nothing_is_enqueued() -> None:
    with MemoryBroker() as broker:
        broker.apply(SHOP)
        pub = broker.publisher(SHOP)
        with pytest.raises(UnboundRoutingKey):
            pub.publish(b"x", "emial.a", "1s")
        with pytest.raises(UnboundRoutingKey):
            pub.publish_many([Message(b"x", "email.a", "1s"), Message(b"y", "nope", "0s")])

        async def run() -> Any:
            from delayq.aio import AsyncPublisher

            async with AsyncPublisher(broker.url, SHOP) as apub:
                await apub.publish(b"x", "emial.a", "0s")

        with pytest.raises(UnboundRoutingKey):
            asyncio.run(run())
        assert broker.pending() == 0
        assert all(broker.depth(q) == 0 for q in broker.queues())
