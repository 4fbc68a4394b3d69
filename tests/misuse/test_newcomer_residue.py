"""What a newcomer ran into in issue 29, each now in the misuse suite too (the items were
tested elsewhere only): a Spark report that recommended a worse ladder, message limits
refused with pydantic's error, a heartbeat of 0 (or none at all), a deferral that blamed
another consumer for this one's claim, and a replayed message that forgot its history.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from delayq import (
    AsyncPublisher,
    DelayqError,
    FixedBackoff,
    InvalidInput,
    InvalidTopology,
    InvalidURL,
    Message,
    Publisher,
    Topology,
)
from delayq.consume.delivery import H_PREVIOUS_ATTEMPTS, H_REPLAYS
from delayq.local.node import LocalNode
from delayq.message.limits import MessageLimits
from delayq.stores.key_scope import KeyScope, scoped_key
from delayq.stores.memory import InMemoryStore
from delayq.sync import apply_topology, delete_topology, parking
from delayq.testing import MemoryBroker
from delayq.topology.fit import (
    DEFAULT_GRID_MS,
    ladder_overshoot,
    never_worse,
    recommend_on_grid,
)
from delayq.topology.ladder import Ladder
from tests.integration.test_replay_tracing import (  # noqa: F401 (traced: a fixture)
    Failing,
    _attrs,
    _outcomes,
    _spans,
    traced,
)
from tests.waiting import wait_for

DEAD_URL = "amqp://guest:guest@127.0.0.1:1/"  # refuses connections: nothing is contacted


# The Spark report's recommendation ------------------------------------------------------


@pytest.mark.parametrize("objective", ["mean", "p99"])
@pytest.mark.parametrize("max_tiers", [None, 2])
def test_the_report_keeps_a_ladder_that_every_grid_ladder_serves_worse(
    objective: str, max_tiers: int | None
) -> None:
    """Issue 29: delays of 1-5 s against a 1s 2s 3s 5s ladder, on the default grid
    (shortest value 15 s), were told "recommended ladder 15s, mean overshoot 745 %".
    The report's own steps (delayq.spark.report), without Spark: the current ladder is
    kept, on as many tiers as asked for and on as many as now, and the grid is named as
    too coarse for these delays."""
    requested = {1_000: 10, 2_000: 10, 3_000: 10, 4_000: 10, 5_000: 10}
    ladder = Ladder.parse(["1s", "2s", "3s", "5s"])
    current = ladder_overshoot(requested, [t.ttl_ms for t in ladder])
    wanted = max_tiers or len(ladder)
    on_grid = {"grid_ms": DEFAULT_GRID_MS, "min_top_ms": ladder.max_ms, "objective": objective}
    recommended = recommend_on_grid(requested, wanted, **on_grid)  # type: ignore[arg-type]
    same = recommend_on_grid(requested, len(ladder), **on_grid)  # type: ignore[arg-type]
    assert recommended.tiers_ms == (15_000,)  # what the grid alone would recommend

    kept, kept_same, why = never_worse(
        current, recommended, same, "", requested, DEFAULT_GRID_MS, objective
    )
    assert kept is None and kept_same is None, (kept, kept_same)
    assert "serves the delays seen worse than the current one" in why and "keep it" in why
    assert f"mean overshoot {current.mean_relative_overshoot:.1%}" in why, why
    assert "the grid's shortest value 15s is longer than 100% of the delays seen" in why
    assert "(1s to 5s)" in why and "--grid" in why, why


# Message limits ---------------------------------------------------------------------------


def test_message_limits_that_do_not_fit_a_frame_are_a_delayq_error_every_way_in(
    tmp_path: Any,
) -> None:
    """Issue 29: MessageLimits(max_header_bytes=1_000_000) raised pydantic's
    ValidationError, which `except DelayqError` does not catch."""
    ways: list[Callable[[], object]] = [
        lambda: MessageLimits(max_header_bytes=1_000_000),
        lambda: MessageLimits.model_validate({"max_header_bytes": 1_000_000}),
        lambda: MessageLimits().replace(max_header_bytes=1_000_000),
        lambda: MessageLimits(frame_max=8_192),  # no room left for delayq's own headers
    ]
    for way in ways:
        with pytest.raises(DelayqError) as info:
            way()
        assert isinstance(info.value, InvalidInput), type(info.value)
        assert not isinstance(info.value, ValidationError)
        assert "frame_max=" in str(info.value), info.value
    with pytest.raises(InvalidInput, match="max_header_bytes=1000000 does not fit"):
        MessageLimits(max_header_bytes=1_000_000)
    # In a topology: its own error, naming the field.
    with pytest.raises(InvalidTopology, match=r"limits: .*max_header_bytes=1000000"):
        Topology(namespace="limits", limits={"max_header_bytes": 1_000_000})  # type: ignore[arg-type]


# Heartbeats -------------------------------------------------------------------------------


@pytest.fixture
def heartbeat_user(local_rabbitmq_management_node: LocalNode) -> Iterator[str]:
    """A user of its own, so the broker's connection list shows this test's connections."""
    node = local_rabbitmq_management_node
    user = f"hb-{uuid.uuid4().hex[:8]}"
    node.ctl("add_user", user, "pw")
    node.ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")
    try:
        yield user
    finally:
        node.ctl("delete_user", user, check=False)


def test_heartbeat_0_turns_heartbeats_off_on_both_publishers_of_a_cluster_url(
    local_rabbitmq_management_node: LocalNode, heartbeat_user: str
) -> None:
    """Issue 29: ``?heartbeat=0`` turned heartbeats off on pika's link only. Here on a
    URL that lists its node twice (the query follows the host list): the broker's own
    list of connections shows both publishers without heartbeats."""
    node = local_rabbitmq_management_node
    ns = f"hb{uuid.uuid4().hex[:10]}"
    topology = Topology(namespace=ns, destinations=[{"queue": f"{ns}.work", "bindings": ["j.#"]}])  # type: ignore[list-item]
    apply_topology(topology, node.url)
    url = f"amqp://{heartbeat_user}:pw@127.0.0.1:{node.port},127.0.0.1:{node.port}/?heartbeat=0"

    async def open_async() -> AsyncPublisher:
        publisher = AsyncPublisher(url, topology)
        await publisher.connect()
        return publisher

    loop = asyncio.new_event_loop()
    try:
        async_publisher = loop.run_until_complete(open_async())
        try:
            with Publisher(url, topology) as publisher:
                publisher.publish({"n": 1}, "j.a", "0s")
                rows = node.ctl("list_connections", "user", "timeout", "--no-table-headers", "-q")
        finally:
            loop.run_until_complete(async_publisher.aclose())
    finally:
        loop.close()
        delete_topology(topology, node.url)
    timeouts = [int(line.split("\t")[1]) for line in rows.splitlines() if heartbeat_user in line]
    assert timeouts == [0, 0], rows


@pytest.mark.parametrize("value", ["-1", "abc", "65536", "1.5", "%C2%B2", "%D9%A3"])
def test_a_heartbeat_that_is_not_whole_seconds_is_a_clear_url_error_for_both_publishers(
    value: str,
) -> None:
    """Issue 29's heartbeat, misused: a negative, a word, too many seconds, a fraction,
    and digits Python reads but no broker does (``²`` crashed in int() with a bare
    ValueError; Arabic-Indic ``٣`` went to the client as is). Each is refused by both
    publishers before connecting, naming the URL (password hidden) and the way off."""
    url = f"amqp://guest:s3cret@127.0.0.1:1/?heartbeat={value}"
    topology = Topology(namespace="hb")
    for make in (Publisher, AsyncPublisher):
        with pytest.raises(InvalidURL) as info:
            make(url, topology)
        message = str(info.value)
        assert "must be whole seconds from 0 to 65535 (0 turns heartbeats off)" in message
        assert "127.0.0.1:1" in message and "s3cret" not in message, message


# Deferrals --------------------------------------------------------------------------------

SHOP = Topology(
    namespace="shop",
    ladder=["1m", "5m"],
    destinations=[{"queue": "orders", "bindings": ["order.*"]}],  # type: ignore[list-item]
)


def test_a_claim_left_by_a_stopped_consumer_is_not_blamed_on_this_one() -> None:
    """Issue 29: a busy key was always "claimed by another consumer". A consumer keyed by
    business key finds the key claimed in the shared store by one that stopped mid-way
    (its lease runs 6 minutes): each copy is deferred saying the claim is held elsewhere,
    for another message with the same business key, until the lease ends; then it is
    handled. (This consumer's own claim, another copy in hand: tests/integration/
    test_consumer.py::test_a_deferral_says_whose_claim_holds_the_key.)"""
    with MemoryBroker() as broker:
        broker.apply(SHOP)
        store = InMemoryStore()
        key = scoped_key("order-7", "orders", KeyScope.QUEUE)
        store.claim(key, lease_ms=6 * 60_000, now_ms=broker.now_ms)
        reasons: list[str] = []
        handled: list[int] = []

        class Reasons:
            def settled(self, event: Any) -> None:
                if event.outcome == "retry":
                    reasons.append(event.reason)

        broker.consumer(
            SHOP,
            "orders",
            lambda body: handled.append(broker.elapsed_ms),
            store=store,
            key=lambda body: body["order"],
            observers=[Reasons()],
        )
        broker.publisher(SHOP).publish({"order": "order-7"}, "order.paid", "0s")
        assert broker.run_until(lambda: bool(handled), max="30m")

    assert handled and handled[0] >= 6 * 60_000, handled  # not before the lease ended
    assert reasons, "never deferred"
    for reason in reasons:
        assert "the key's claim is held elsewhere" in reason, reason
        assert "another message with the same business key" in reason, reason
        assert "until its lease ends" in reason and "this consumer" not in reason, reason


# Replays ----------------------------------------------------------------------------------


def test_a_message_replayed_twice_counts_both_replays_and_keeps_every_attempt(
    make_topology: Callable[..., Topology],
    rabbitmq_url: str,
    start_consumer: Callable[..., Any],
    traced: tuple[Any, Any],  # noqa: F811 (the fixture imported above)
) -> None:
    """Issue 29: a DLQ replay showed in no trace and reset the attempt counter with no
    record of the attempts before it. Dead-lettered after 2 attempts, replayed, dead-
    lettered after 2 more, replayed again: the second replay says 2 replays and 4
    attempts before it; the dead letter in between kept the first replay's record, and
    so does every attempt after a replay (a retry included)."""
    provider, exporter = traced
    topology = make_topology(["1s", "2s"])
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    handle = start_consumer(
        topology,
        queue,
        Failing(4),
        policy=FixedBackoff(delay="1s", max_attempts=2),
        tracing=provider,
    )
    with Publisher(rabbitmq_url, topology, tracing=provider) as publisher:
        receipt = publisher.publish({"to": "a@b.c"}, "job.mail", "0s")

    def replay() -> None:
        report = parking.replay(
            rabbitmq_url,
            f"{queue}.dlq",
            topology,
            target=lambda p: ("", queue),
            tracing=provider,
        )
        assert report.replayed == [receipt.message_id], report

    wait_for(lambda: handle.stats.dead_lettered == 1, 30, "the first dead letter")
    replay()
    wait_for(lambda: handle.stats.dead_lettered == 2, 30, "the second dead letter")
    [parked] = parking.browse(rabbitmq_url, f"{queue}.dlq")
    history = (
        parked.delivery.headers.get(H_REPLAYS),
        parked.delivery.headers.get(H_PREVIOUS_ATTEMPTS),
    )
    assert history == (1, 2), parked.delivery.headers  # the dead letter kept its record
    replay()
    expected = ["retry", "dead-letter", "retry", "dead-letter", "ack"]
    wait_for(lambda: _outcomes(exporter) == expected, 30, lambda: str(_outcomes(exporter)))

    first, second = _spans(exporter, "replay")
    counts = [
        (_attrs(s)["delayq.replay_count"], _attrs(s)["delayq.previous_attempts"])
        for s in (first, second)
    ]
    assert counts == [(1, 2), (2, 4)]
    processes = _spans(exporter, "process")
    seen = [
        (
            _attrs(s)["delayq.attempt"],
            _attrs(s).get("delayq.replay_count"),
            _attrs(s).get("delayq.previous_attempts"),
        )
        for s in processes
    ]
    assert seen == [(1, None, None), (2, None, None), (1, 1, 2), (2, 1, 2), (1, 2, 4)], seen


# A batch's window (an outside tester, session 36) ----------------------------------------


@pytest.mark.parametrize("window", [0, -1, True, 2.5, "10", None])
def test_a_window_that_is_not_a_positive_int_is_refused_before_anything_is_sent(
    window: Any,
) -> None:
    """``window=0`` and ``-1`` were taken as 1 in silence; each is refused, by both
    publishers, before a connection is tried (the URL answers nothing)."""
    topology = Topology(namespace="w", ladder=["1m"], external_bindings=("job.#",))
    batch = [Message({"n": 1}, "job.a", "1m")]
    with pytest.raises(InvalidInput, match=f"window is how many .* not {re.escape(repr(window))}"):
        Publisher(DEAD_URL, topology).publish_many(batch, window=window)

    async def publish() -> None:
        await AsyncPublisher(DEAD_URL, topology).publish_many(batch, window=window)

    with pytest.raises(InvalidInput, match="an int of 1 or more"):
        asyncio.run(publish())
