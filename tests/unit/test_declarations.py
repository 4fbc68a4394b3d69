"""build_declarations and the definitions export."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.topology.declarations import (
    BindingDecl,
    Declaration,
    ExchangeDecl,
    QueueDecl,
    apply_marker,
    build_declarations,
    describe,
)
from delayq.topology.definitions import export_definitions, render_definitions
from delayq.topology.ladder import MAX_TIER_MS, Ladder
from delayq.topology.model import Topology

# Parked queues (the DLQs, <ns>.unrouted) carry a delivery limit no browse reaches:
# RabbitMQ 4.x would take 20 by default (tests/integration/test_parking.py browses 100 times).
PARKED = {"x-queue-type": "quorum", "x-delivery-limit": 2_147_483_647}


def make(queue_type: str = "quorum", ladder: list[str] | None = None, **extra: Any) -> Topology:
    return Topology.from_mapping(
        {
            "namespace": "shop",
            "queue_type": queue_type,
            "ladder": ladder or ["1s", "1m", "1h30m"],
            "destinations": [
                {"queue": "emails", "bindings": ["email.*", "email.#"], "delivery_limit": 7},
                {"queue": "sms", "bindings": ["sms"]},
            ],
            **extra,
        }
    )


QUORUM = make()
CLASSIC = make("classic")

ladders = st.lists(
    st.integers(min_value=1, max_value=MAX_TIER_MS), min_size=1, max_size=10, unique=True
).map(Ladder)


def _topology(ladder: Ladder, queue_type: str) -> Topology:
    return Topology.from_mapping(
        {
            "namespace": "ns",
            "ladder": ladder,
            "queue_type": queue_type,
            "destinations": [{"queue": "work", "bindings": ["work.#"]}],
        }
    )


topologies = st.builds(_topology, ladders, st.sampled_from(["quorum", "classic"]))
quorum_topologies = st.builds(_topology, ladders, st.just("quorum"))
classic_topologies = st.builds(_topology, ladders, st.just("classic"))


def queues(decls: tuple[Declaration, ...]) -> dict[str, QueueDecl]:
    return {d.name: d for d in decls if isinstance(d, QueueDecl)}


def exchanges(decls: tuple[Declaration, ...]) -> dict[str, ExchangeDecl]:
    return {d.name: d for d in decls if isinstance(d, ExchangeDecl)}


def bindings(decls: tuple[Declaration, ...]) -> list[BindingDecl]:
    return [d for d in decls if isinstance(d, BindingDecl)]


def tier_queues(topology: Topology) -> list[QueueDecl]:
    return [q for q in queues(build_declarations(topology)).values() if q.role == "tier"]


# --- order ---------------------------------------------------------------------------------------


_KIND_RANK = {"exchange": 0, "queue": 1, "binding": 2}


@pytest.mark.parametrize("topology", [QUORUM, CLASSIC], ids=["quorum", "classic"])
def test_exchanges_then_queues_then_bindings_then_the_marker(topology: Topology) -> None:
    *entities, marker = build_declarations(topology)
    ranks = [_KIND_RANK[d.kind] for d in entities]
    assert ranks == sorted(ranks)
    assert isinstance(marker, ExchangeDecl) and marker.role == "marker"


@given(topologies)
def test_order_holds_for_any_ladder(topology: Topology) -> None:
    *entities, marker = build_declarations(topology)
    ranks = [_KIND_RANK[d.kind] for d in entities]
    assert ranks == sorted(ranks)
    assert marker == apply_marker(topology)


def test_ready_exchange_is_declared_before_any_tier_queue() -> None:
    decls = build_declarations(QUORUM)
    names = [(d.kind, d.name) for d in decls]
    ready_at = names.index(("exchange", "shop.ready"))
    tier_at = [i for i, d in enumerate(decls) if isinstance(d, QueueDecl) and d.role == "tier"]
    assert tier_at
    assert ready_at < min(tier_at)


def test_alternate_exchange_is_declared_before_the_ready_exchange() -> None:
    names = [(d.kind, d.name) for d in build_declarations(QUORUM)]
    assert names.index(("exchange", "shop.unrouted")) < names.index(("exchange", "shop.ready"))


def test_every_binding_refers_to_declared_entities() -> None:
    decls = build_declarations(QUORUM)
    for binding in bindings(decls):
        assert binding.source in exchanges(decls)
        assert binding.destination in queues(decls)


def test_declaration_names_are_unique_per_kind() -> None:
    decls = build_declarations(QUORUM)
    keys = [(d.kind, d.name) for d in decls]
    assert len(keys) == len(set(keys))


# --- tier queues ---------------------------------------------------------------------------------


def test_one_tier_exchange_queue_and_binding_per_tier() -> None:
    decls = build_declarations(QUORUM)
    for name in ("shop.tier.1s", "shop.tier.1m", "shop.tier.1h30m"):
        assert exchanges(decls)[name].type == "fanout"
        assert queues(decls)[name].role == "tier"
        assert BindingDecl(name, name, "") in bindings(decls)


def test_quorum_tier_queue_arguments() -> None:
    tier = queues(build_declarations(QUORUM))["shop.tier.1m"]
    assert dict(tier.arguments) == {
        "x-queue-type": "quorum",
        "x-message-ttl": 60_000,
        "x-dead-letter-exchange": "shop.ready",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


@given(topologies)
def test_tier_ttl_is_the_tier_in_int_ms(topology: Topology) -> None:
    for queue, tier in zip(tier_queues(topology), topology.ladder.tiers, strict=True):
        assert queue.name == topology.tier_name(tier)
        assert type(queue.arguments["x-message-ttl"]) is int
        assert queue.arguments["x-message-ttl"] == tier.ttl_ms


@given(topologies)
def test_tiers_dead_letter_into_the_ready_exchange(topology: Topology) -> None:
    for queue in tier_queues(topology):
        assert queue.arguments["x-dead-letter-exchange"] == topology.ready_exchange


@given(topologies)
def test_tiers_have_no_expiry_and_keep_the_routing_key(topology: Topology) -> None:
    for queue in tier_queues(topology):
        assert "x-expires" not in queue.arguments
        assert "x-dead-letter-routing-key" not in queue.arguments


@given(quorum_topologies)
def test_quorum_tiers_dead_letter_at_least_once(topology: Topology) -> None:
    for queue in tier_queues(topology):
        assert queue.arguments["x-queue-type"] == "quorum"
        assert queue.arguments["x-dead-letter-strategy"] == "at-least-once"
        assert queue.arguments["x-overflow"] == "reject-publish"


@given(classic_topologies)
def test_classic_tiers_have_only_type_ttl_and_dead_letter_exchange(topology: Topology) -> None:
    for queue in tier_queues(topology):
        assert set(queue.arguments) == {
            "x-queue-type",
            "x-message-ttl",
            "x-dead-letter-exchange",
        }


@given(topologies)
def test_every_argument_value_is_str_or_int(topology: Topology) -> None:
    for decl in build_declarations(topology):
        for value in getattr(decl, "arguments", {}).values():
            assert type(value) in (str, int), (decl, value)


@given(topologies)
def test_everything_is_durable(topology: Topology) -> None:
    for decl in build_declarations(topology):
        if not isinstance(decl, BindingDecl):
            assert decl.durable


# --- ready / unrouted ----------------------------------------------------------------------------


def test_ready_exchange_is_topic_with_alternate_exchange() -> None:
    ready = exchanges(build_declarations(QUORUM))["shop.ready"]
    assert ready.type == "topic"
    assert dict(ready.arguments) == {"alternate-exchange": "shop.unrouted"}


def test_unrouted_exchange_queue_and_binding() -> None:
    decls = build_declarations(QUORUM)
    assert exchanges(decls)["shop.unrouted"].type == "fanout"
    assert dict(queues(decls)["shop.unrouted"].arguments) == PARKED
    assert BindingDecl("shop.unrouted", "shop.unrouted", "") in bindings(decls)


# --- destinations --------------------------------------------------------------------------------


def test_destination_queue_arguments_quorum() -> None:
    emails = queues(build_declarations(QUORUM))["emails"]
    assert emails.role == "destination"
    assert dict(emails.arguments) == {
        "x-queue-type": "quorum",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "emails.dlq",
        "x-delivery-limit": 7,
    }


def test_destination_has_a_dlq() -> None:
    dlq = queues(build_declarations(QUORUM))["emails.dlq"]
    assert dlq.role == "dlq"
    assert dict(dlq.arguments) == PARKED


def test_dlq_is_declared_before_its_destination_queue() -> None:
    names = [d.name for d in build_declarations(QUORUM) if isinstance(d, QueueDecl)]
    assert names.index("emails.dlq") < names.index("emails")


def test_destination_bindings_on_the_ready_exchange() -> None:
    found = [b for b in bindings(build_declarations(QUORUM)) if b.source == "shop.ready"]
    assert found == [
        BindingDecl("shop.ready", "emails", "email.*"),
        BindingDecl("shop.ready", "emails", "email.#"),
        BindingDecl("shop.ready", "sms", "sms"),
    ]


# --- classic -------------------------------------------------------------------------------------


def test_classic_tier_queue_arguments() -> None:
    tier = queues(build_declarations(CLASSIC))["shop.tier.1s"]
    assert dict(tier.arguments) == {
        "x-queue-type": "classic",
        "x-message-ttl": 1_000,
        "x-dead-letter-exchange": "shop.ready",
    }


def test_classic_destination_queue_arguments() -> None:
    emails = queues(build_declarations(CLASSIC))["emails"]
    assert dict(emails.arguments) == {
        "x-queue-type": "classic",
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "emails.dlq",
    }


@pytest.mark.parametrize("arg", ["x-dead-letter-strategy", "x-overflow", "x-delivery-limit"])
def test_classic_omits_quorum_only_arguments(arg: str) -> None:
    for queue in queues(build_declarations(CLASSIC)).values():
        assert arg not in queue.arguments


def test_classic_queues_are_classic() -> None:
    for queue in queues(build_declarations(CLASSIC)).values():
        assert queue.arguments["x-queue-type"] == "classic"


def test_topology_without_destinations_has_only_delayq_entities() -> None:
    decls = build_declarations(Topology.from_mapping({"namespace": "ns", "ladder": ["1s"]}))
    assert {(d.kind, d.name) for d in decls} == {
        ("exchange", "ns.unrouted"),
        ("exchange", "ns.ready"),
        ("exchange", "ns.direct"),
        ("exchange", "ns.tier.1s"),
        ("exchange", "ns.retry.1s"),
        ("exchange", "ns.retry.1s.direct"),
        ("queue", "ns.unrouted"),
        ("queue", "ns.tier.1s"),
        ("queue", "ns.retry.1s"),
        ("queue", "ns.retry.1s.direct"),
        ("binding", "ns.unrouted -> ns.unrouted [(any)]"),
        ("binding", "ns.tier.1s -> ns.tier.1s [(any)]"),
        ("binding", "ns.retry.1s -> ns.retry.1s [(any)]"),
        ("exchange", apply_marker(Topology(namespace="ns", ladder=["1s"])).name),
    }


@pytest.mark.parametrize("topology", [QUORUM, CLASSIC], ids=["quorum", "classic"])
def test_retry_tiers_dead_letter_through_the_namespaces_direct_exchange(
    topology: Topology,
) -> None:
    decls = build_declarations(topology)
    retry = {n: q for n, q in queues(decls).items() if q.role == "retry"}
    assert len(retry) == 2 * len(topology.ladder)
    for tier in topology.ladder.tiers:
        queue = retry[topology.retry_direct_name(tier)]
        assert queue.arguments["x-message-ttl"] == tier.ttl_ms
        # Not the default exchange: the routing keys (the queue's name, and any a CC
        # header adds) reach this topology's queues alone.
        assert queue.arguments["x-dead-letter-exchange"] == topology.direct_exchange
        assert "x-dead-letter-routing-key" not in queue.arguments  # the queue's own name
        assert exchanges(decls)[topology.retry_direct_name(tier)].type == "direct"
        # The fanout retry tiers of earlier versions stay, for their consumers.
        legacy = retry[topology.retry_name(tier)]
        assert legacy.arguments["x-dead-letter-exchange"] == ""
        assert exchanges(decls)[topology.retry_name(tier)].type == "fanout"


# --- describe ------------------------------------------------------------------------------------


def test_describe_lines() -> None:
    lines = [describe(d) for d in build_declarations(make(ladder=["1s"]))]
    assert "exchange shop.ready (topic, alternate-exchange='shop.unrouted')" in lines
    assert "exchange shop.unrouted (fanout)" in lines
    assert "binding  shop.ready -> sms key=sms" in lines
    assert any(line.startswith("queue    shop.tier.1s [tier] (") for line in lines)


# --- definitions ---------------------------------------------------------------------------------


def test_definitions_top_level_keys() -> None:
    assert set(export_definitions(QUORUM)) == {"vhosts", "exchanges", "queues", "bindings"}


def test_definitions_vhost() -> None:
    doc = export_definitions(make(vhost="/shop"))
    assert doc["vhosts"] == [{"name": "/shop"}]
    for section in ("exchanges", "queues", "bindings"):
        assert {entry["vhost"] for entry in doc[section]} == {"/shop"}


@pytest.mark.parametrize("topology", [QUORUM, CLASSIC], ids=["quorum", "classic"])
def test_definitions_match_the_declarations(topology: Topology) -> None:
    decls = build_declarations(topology)
    doc = export_definitions(topology)
    assert [(e["name"], e["type"], e["arguments"]) for e in doc["exchanges"]] == [
        (d.name, d.type, dict(d.arguments)) for d in decls if isinstance(d, ExchangeDecl)
    ]
    assert [(q["name"], q["arguments"]) for q in doc["queues"]] == [
        (d.name, dict(d.arguments)) for d in decls if isinstance(d, QueueDecl)
    ]
    assert [(b["source"], b["destination"], b["routing_key"]) for b in doc["bindings"]] == [
        (d.source, d.destination, d.routing_key) for d in decls if isinstance(d, BindingDecl)
    ]


def test_definitions_entities_are_durable_and_not_auto_deleted() -> None:
    doc = export_definitions(QUORUM)
    for entry in [*doc["exchanges"], *doc["queues"]]:
        assert entry["durable"] is True
        assert entry["auto_delete"] is False
    for exchange in doc["exchanges"]:
        assert exchange["internal"] is False


def test_definitions_bindings_target_queues() -> None:
    for binding in export_definitions(QUORUM)["bindings"]:
        assert binding["destination_type"] == "queue"
        assert binding["arguments"] == {}


def test_render_definitions_is_json_of_the_export() -> None:
    assert json.loads(render_definitions(QUORUM)) == export_definitions(QUORUM)


def test_render_definitions_is_stable() -> None:
    assert render_definitions(QUORUM) == render_definitions(make())


def test_render_definitions_sorts_keys() -> None:
    text = render_definitions(QUORUM)
    expected = json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert text == expected


def test_render_definitions_keeps_ttl_an_int() -> None:
    doc = json.loads(render_definitions(QUORUM))
    ttls = [
        q["arguments"]["x-message-ttl"] for q in doc["queues"] if q["name"].startswith("shop.tier.")
    ]
    assert ttls == [1_000, 60_000, 5_400_000]
    assert all(type(ttl) is int for ttl in ttls)
