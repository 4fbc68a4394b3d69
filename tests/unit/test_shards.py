"""Tier shards: names, the stable hash, declarations, routing and stats (no broker)."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest

from delayq.errors import InvalidInput, InvalidTopology
from delayq.ops.depths import Depth, stats_json, stats_queues, stats_rows, stats_table
from delayq.ops.grant import consumer_grant, producer_grant
from delayq.topology.declarations import QueueDecl, apply_marker, build_declarations
from delayq.topology.definitions import export_definitions
from delayq.topology.model import Topology
from delayq.topology.route import Router
from delayq.topology.shards import MAX_SHARDS, shard_names, shard_of

SRC = Path(__file__).resolve().parents[2] / "src"


def shop(shards: int | None = None, **changes: object) -> Topology:
    data: dict[str, object] = {
        "namespace": "shop",
        "ladder": ["1s", "5s"],
        "destinations": [{"queue": "work", "bindings": ["job.*"]}],
        **changes,
    }
    if shards is not None:
        data["shards"] = shards
    return Topology.model_validate(data)


# The hash -----------------------------------------------------------------------------


def test_the_shard_of_an_id_is_pinned_across_versions() -> None:
    # CRC-32 of the UTF-8 id: these values must never change, or a re-send after an
    # upgrade would wait in another shard than its first copy.
    assert [shard_of(f"order-{i}", 4) for i in range(8)] == [
        shard_of(f"order-{i}", 4) for i in range(8)
    ]
    assert [shard_of(key, 4) for key in ("order-42", "a", "é", "bench-0")] == [2, 3, 2, 1]
    assert shard_of("anything", 1) == 0
    assert shard_of("", 4) == 0


def test_the_shard_of_an_id_is_the_same_in_another_process() -> None:
    # Python's hash() of a str changes with PYTHONHASHSEED; the shard must not.
    ids = [f"id-{i}" for i in range(50)]
    code = f"from delayq.topology.shards import shard_of\nprint([shard_of(i, 7) for i in {ids!r}])"
    outputs = set()
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(SRC)}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(out.stdout.strip())
    assert outputs == {str([shard_of(i, 7) for i in ids])}


@pytest.mark.parametrize("shards", [2, 3, 4, 8])
def test_ids_spread_evenly_over_the_shards(shards: int) -> None:
    counts = collections.Counter(shard_of(f"msg-{i}", shards) for i in range(40_000))
    expected = 40_000 / shards
    assert set(counts) == set(range(shards))
    assert all(abs(n - expected) < 0.05 * expected for n in counts.values()), counts


def test_uuid_ids_spread_evenly_too() -> None:
    import uuid

    counts = collections.Counter(shard_of(str(uuid.uuid4()), 4) for _ in range(20_000))
    assert all(abs(n - 5_000) < 400 for n in counts.values()), counts


def test_shard_names() -> None:
    assert shard_names("shop.tier.5s", 1) == ("shop.tier.5s",)
    names = shard_names("shop.tier.5s", 3)
    assert names == ("shop.tier.5s", "shop.tier.5s.s1", "shop.tier.5s.s2")


# The model ------------------------------------------------------------------------------


def test_one_shard_declares_exactly_the_unsharded_topology() -> None:
    unsharded, one = shop(), shop(1)
    assert build_declarations(one) == build_declarations(unsharded)
    assert apply_marker(one) == apply_marker(unsharded)
    assert export_definitions(one) == export_definitions(unsharded)
    queues = [d.name for d in build_declarations(one) if isinstance(d, QueueDecl)]
    assert queues == [
        "shop.unrouted",
        "shop.tier.1s",
        "shop.tier.5s",
        "shop.retry.1s",
        "shop.retry.5s",
        "shop.retry.1s.direct",
        "shop.retry.5s.direct",
        "work.dlq",
        "work",
    ]
    assert not any(
        "x-queue-leader-locator" in d.arguments
        for d in build_declarations(one)
        if isinstance(d, QueueDecl)
    )


def test_shards_add_queues_beside_the_unsharded_ones() -> None:
    one, four = build_declarations(shop(1)), build_declarations(shop(4))
    by_name = {d.name: d for d in four if isinstance(d, QueueDecl)}
    for decl in one[:-1]:  # shard 0 is today's queue, arguments and all; the marker differs
        assert decl in four
    assert [n for n in by_name if n.startswith("shop.tier.5s")] == [
        "shop.tier.5s",
        "shop.tier.5s.s1",
        "shop.tier.5s.s2",
        "shop.tier.5s.s3",
    ]
    assert by_name["shop.tier.5s.s2"].arguments == {
        **by_name["shop.tier.5s"].arguments,
        "x-queue-leader-locator": "balanced",
    }
    assert "shop.retry.1s.direct.s3" in by_name
    assert "shop.retry.1s.s1" not in by_name  # the legacy fanout retry tiers stay one
    assert apply_marker(shop(4)) != apply_marker(shop(1))  # publishers of either K check theirs


def test_classic_shards_carry_no_leader_locator() -> None:
    # RabbitMQ 3.10 refuses x-queue-leader-locator on a classic queue.
    decls = build_declarations(shop(3, queue_type="classic"))
    assert not any(
        "x-queue-leader-locator" in d.arguments for d in decls if isinstance(d, QueueDecl)
    )


def test_shards_survive_a_dump_and_a_namespace_copy() -> None:
    topology = shop(4)
    assert topology.with_namespace("other").shards == 4
    assert Topology.model_validate(topology.model_dump(mode="json")) == topology


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0, "from 1 to 64"),
        (-2, "from 1 to 64"),
        (MAX_SHARDS + 1, "not 65"),
        (10**9, "from 1 to 64"),
        ("4", "not '4' (str)"),
        (2.0, "not 2.0 (float)"),
        (True, "not True (bool)"),
        (None, "not None (NoneType)"),
        ([2], "(list)"),
    ],
)
def test_a_bad_shard_count_is_refused_with_the_reason(value: object, words: str) -> None:
    with pytest.raises(InvalidTopology, match="shards: must be") as caught:
        Topology.model_validate({"namespace": "shop", "shards": value})
    assert words in str(caught.value)


# Routing --------------------------------------------------------------------------------


def test_the_router_picks_the_ids_shard_in_every_tier() -> None:
    topology = shop(4)
    router = Router(topology)
    for i in range(20):
        message_id = f"order-{i}"
        shard = shard_of(message_id, 4)
        assert router.shard(message_id) == shard
        for delay_ms, tier in ((500, 0), (3_000, 1)):
            route = router.to_destinations(delay_ms, "job.a", message_id=message_id)
            assert route.exchange == topology.tier_shards(topology.ladder.tiers[tier])[shard]
            assert route.routing_key == "job.a"
            retry = router.to_queue(delay_ms, "work", message_id)
            assert retry.exchange == topology.retry_shards(topology.ladder.tiers[tier])[shard]
            assert retry.routing_key == "work"
    assert router.to_destinations(0, "job.a", message_id="x").exchange == "shop.ready"
    assert router.to_queue(0, "work", "x").exchange == "shop.direct"


def test_a_sharded_publish_without_an_id_is_refused_a_retry_goes_to_shard_0() -> None:
    router = Router(shop(4))
    with pytest.raises(InvalidInput, match="by message id"):
        router.to_destinations(500, "job.a")
    assert router.to_queue(500, "work").exchange == "shop.retry.1s.direct"
    assert Router(shop()).to_destinations(500, "job.a").exchange == "shop.tier.1s"


def test_the_exact_strategy_is_not_sharded() -> None:
    topology = shop(4, strategy="exact")
    route = Router(topology).to_destinations(3_000, "job.a", message_id="order-1")
    assert route.exchange.startswith("shop.level.")


def test_the_publishers_factory_routes_by_its_message_id() -> None:
    from delayq.message.factory import MessageFactory

    factory = MessageFactory(shop(4))
    for i in range(10):
        built = factory.build({"n": i}, "job.a", "3s", message_id=f"order-{i}")
        assert (
            built.exchange
            == shop(4).tier_shards(shop(4).ladder.tiers[1])[shard_of(f"order-{i}", 4)]
        )
        assert built.receipt.exchange == built.exchange
    generated = {factory.build({}, "job.a", "3s").exchange for _ in range(60)}
    assert len(generated) == 4  # generated ids spread too


# Stats and grants -----------------------------------------------------------------------


def test_stats_show_a_sharded_tiers_total_then_each_shard() -> None:
    topology = shop(2)
    rows = stats_rows(topology)
    assert [(r.label, r.role) for r in rows[:3]] == [
        ("shop.tier.1s [2 shards]", "tier"),
        ("shop.tier.1s", "tier shard"),
        ("shop.tier.1s.s1", "tier shard"),
    ]
    names = stats_queues(rows)
    assert len(names) == len(set(names)) and "shop.retry.5s.direct.s1" in names
    depths = {name: Depth(ready=3, unacked=1, consumers=0) for name in names}
    depths["shop.tier.1s.s1"] = Depth(ready=10, unacked=2, consumers=0)
    table = stats_table(rows, depths, "management API").plain()
    total_line = next(line for line in table.splitlines() if "[2 shards]" in line)
    assert total_line.split()[4:7] == ["16", "13", "3"]
    document = stats_json(rows, depths, "management API")
    assert '"shards": [\n        "shop.tier.1s",\n        "shop.tier.1s.s1"\n      ]' in document
    depths["shop.tier.1s.s1"] = None
    assert "missing" in next(
        line for line in stats_table(rows, depths, "x").plain().splitlines() if "[2 shards]" in line
    )


def test_unsharded_stats_rows_are_unchanged() -> None:
    rows = stats_rows(shop())
    assert all(not r.shards and r.label == r.queue for r in rows)
    assert [r.queue for r in rows[:2]] == ["shop.tier.1s", "shop.tier.5s"]


def test_grants_cover_the_shards_only_when_there_are_shards() -> None:
    import re

    unsharded, sharded = shop(), shop(4)
    assert producer_grant(unsharded, "p").permissions.write == (
        producer_grant(shop(1), "p").permissions.write
    )
    write = re.compile(producer_grant(sharded, "p").permissions.write)
    for name in ("shop.tier.1s", "shop.tier.1s.s3", "shop.ready"):
        assert write.fullmatch(name), name
    assert not write.fullmatch("shop.tier.1s.x3")
    assert not re.fullmatch(producer_grant(unsharded, "p").permissions.write, "shop.tier.1s.s1")
    retry = re.compile(consumer_grant(sharded, "c").permissions.write)
    assert retry.fullmatch("shop.retry.5s.direct.s2")


def test_leftover_shards_are_those_at_or_above_the_count_of_known_tiers_only() -> None:
    from delayq.ops.verify import check_leftover_shards
    from delayq.topology.shards import leftover_shards

    names = ["a.tier.1s", "a.tier.1s.s1", "a.tier.1s.s2", "a.tier.1s.s02", "a.tier.1s.sx",
             "a.tier.1s.s2.x", "b.tier.1s.s5", "a.tier.5s.s3"]  # fmt: skip
    assert leftover_shards(["a.tier.1s"], 2, names) == ["a.tier.1s.s2"]
    assert leftover_shards(["a.tier.1s", "a.tier.5s"], 1, names) == [
        "a.tier.1s.s1", "a.tier.1s.s2", "a.tier.5s.s3"
    ]  # fmt: skip
    assert leftover_shards(["a.tier.1s"], 3, names) == []
    topology = Topology(namespace="a", ladder=["1s", "5s"], shards=2)
    check = check_leftover_shards(topology, {"a.tier.1s.s1": 3, "a.tier.5s.s3": 7})
    assert check.status.value == "FAIL" and "a.tier.5s.s3" in check.detail
    assert "holding 7 messages" in check.detail
    assert check_leftover_shards(topology, {"a.tier.1s.s1": 3}).status.value == "OK"
    assert check_leftover_shards(topology, None).status.value == "SKIPPED"
