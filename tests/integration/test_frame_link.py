"""The frame link (``AsyncPublisher``'s own AMQP frames) against a real broker.

Every outcome the aio-pika link reported is reported the same: acks as receipts,
nacks as ``PublishRejected``, returns as ``Unroutable``, a lost connection's messages
re-sent (or ``PublishUnconfirmed``), a blocked broker as ``PublishBlocked``; never a
message reported confirmed that the broker did not ack.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest

from delayq import (
    ConnectionFailed,
    ConnectionRejected,
    Message,
    PublishBatchError,
    PublishBlocked,
    PublisherInUse,
    PublishRejected,
    Receipt,
    Topology,
    TopologyMissing,
    TopologyNotApplied,
    Unroutable,
)
from delayq.aio import AsyncPublisher
from delayq.aio._framelink import FrameLink
from delayq.local.node import LocalNode
from delayq.sync import apply_topology

from .conftest import Collector


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def publish_many(url: str, topo: Topology, batch: list[Message], **kw: Any) -> Any:
    """Receipts, or the PublishBatchError the batch raised."""
    window = kw.pop("window", 1000)
    async with AsyncPublisher(url, topo, **kw) as pub:
        assert isinstance(pub.link, FrameLink)
        try:
            return await pub.publish_many(batch, window=window)
        except PublishBatchError as exc:
            return exc


@pytest.fixture
def applied(rabbitmq_url: str, make_topology: Callable[..., Topology]) -> Topology:
    topo = make_topology(["1s", "2s"])
    apply_topology(topo, rabbitmq_url)
    return topo


def delete_queue(url: str, name: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        connection.channel().queue_delete(name)
    finally:
        connection.close()


# Acks --------------------------------------------------------------------------------


def test_a_batch_is_confirmed_and_arrives_as_the_aio_pika_link_sent_it(
    rabbitmq_url: str, applied: Topology, collect: Callable[..., Collector]
) -> None:
    inbox = collect(f"{applied.namespace}.work")
    batch = [
        Message({"n": n}, "job.a", "0s", headers={"tenant": "t1", "n": n}, message_id=f"ok-{n}")
        for n in range(3_000)
    ]
    receipts = run(publish_many(rabbitmq_url, applied, batch, window=200))
    assert [r.message_id for r in receipts] == [m.message_id for m in batch]
    arrived = inbox.wait(3_000, timeout_s=60)
    assert sorted(a.message_id for a in arrived) == sorted(m.message_id for m in batch)
    one = next(a for a in arrived if a.message_id == "ok-7")
    assert one.headers["tenant"] == "t1" and one.headers["n"] == 7
    assert one.headers["delayq-routing-key"] == "job.a"
    assert one.content_type == "application/json" and one.body == b'{"n":7}'


def test_concurrent_publishes_and_batches_share_one_connection(
    rabbitmq_url: str, applied: Topology, collect: Callable[..., Collector]
) -> None:
    inbox = collect(f"{applied.namespace}.work")

    async def scenario() -> list[str]:
        async with AsyncPublisher(rabbitmq_url, applied) as pub:
            singles = [pub.publish(b"s", "job.a", "0s", message_id=f"s-{n}") for n in range(50)]
            batches = [
                pub.publish_many(
                    [Message(b"b", "job.a", "0s", message_id=f"b{k}-{n}") for n in range(300)],
                    window=50,
                )
                for k in range(4)
            ]
            done = await asyncio.gather(*singles, *batches)
            ids = [r.message_id for r in done[:50]]
            for receipts in done[50:]:
                ids += [r.message_id for r in receipts]
            return ids

    ids = run(scenario())
    assert len(ids) == len(set(ids)) == 50 + 4 * 300
    arrived = {a.message_id for a in inbox.wait(len(ids), timeout_s=60)}
    assert arrived == set(ids)


def test_a_body_larger_than_frame_max_is_split_and_arrives_whole(
    rabbitmq_url: str, applied: Topology, collect: Callable[..., Collector]
) -> None:
    inbox = collect(f"{applied.namespace}.work")
    bodies = [os.urandom(size) for size in (131_072 - 8, 131_072 - 7, 300_001, 1_000_000)]

    async def scenario() -> None:
        async with AsyncPublisher(rabbitmq_url, applied) as pub:
            await pub.publish(bodies[0], "job.a", "0s", message_id="big-0")
            await pub.publish_many(
                [Message(b, "job.a", "0s", message_id=f"big-{i}") for i, b in enumerate(bodies)][1:]
            )

    run(scenario())
    arrived = {a.message_id: a.body for a in inbox.wait(4, timeout_s=30)}
    assert arrived == {f"big-{i}": b for i, b in enumerate(bodies)}


# Nacks and returns ---------------------------------------------------------------------


def test_a_full_tier_nacks_and_they_are_reported_rejected(
    rabbitmq_url: str, make_topology: Callable[..., Topology]
) -> None:
    topo = make_topology(["1h"], tier_max_length=50)
    apply_topology(topo, rabbitmq_url)
    batch = [Message(b"x", "job.full", "1h", message_id=f"full-{n}") for n in range(80)]
    error = run(publish_many(rabbitmq_url, topo, batch, window=10))
    assert isinstance(error, PublishBatchError)
    confirmed = {r.message_id for r in error.receipts if r is not None}
    assert all(isinstance(e, PublishRejected) for e in error.failures.values())
    assert {batch[i].message_id for i in error.failures} == {
        m.message_id for m in batch
    } - confirmed
    # A quorum queue checks its length as it commits: with 10 in flight, a few more than
    # 50 may be taken. What was acked is exactly what the tier holds.
    assert 50 <= len(confirmed) <= 50 + 10
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    tier = topo.tier_name(topo.ladder.tiers[0])
    held = connection.channel().queue_declare(tier, passive=True).method.message_count
    connection.close()
    assert held == len(confirmed)

    async def one_more() -> None:
        async with AsyncPublisher(rabbitmq_url, topo) as pub:
            await pub.publish(b"x", "job.full", "1h", message_id="full-single")

    with pytest.raises(PublishRejected, match="full-single"):
        run(one_more())


def test_returns_are_reported_unroutable_exactly_for_the_returned(
    rabbitmq_url: str, applied: Topology, collect: Callable[..., Collector]
) -> None:
    delete_queue(rabbitmq_url, applied.tier_name(applied.ladder.tiers[0]))  # the 1s tier
    inbox = collect(f"{applied.namespace}.work")
    # Alternating tiers, and the same id twice in a row: a return names the first of them
    # not yet returned (returns come in publish order, before their confirms).
    batch = [
        Message(b"x", "job.a", "1s" if n % 2 else "2s", message_id=f"r-{n // 4}")
        for n in range(400)
    ]
    error = run(publish_many(rabbitmq_url, applied, batch, window=64))
    assert isinstance(error, PublishBatchError)
    assert set(error.failures) == {n for n in range(400) if n % 2}
    assert all(isinstance(e, Unroutable) for e in error.failures.values())
    assert [r is None for r in error.receipts] == [bool(n % 2) for n in range(400)]
    assert len(inbox.wait(200, timeout_s=30)) == 200

    async def single() -> Receipt:
        async with AsyncPublisher(rabbitmq_url, applied) as pub:
            return await pub.publish(b"x", "job.a", "1s", message_id="r-single")

    with pytest.raises(Unroutable) as caught:
        run(single())
    assert caught.value.message_id == "r-single"


# A connection closed under a batch ------------------------------------------------------


def test_a_broker_closing_the_connection_mid_batch_loses_nothing(
    local_rabbitmq_node: LocalNode,
    make_topology: Callable[..., Topology],
    collect: Callable[..., Collector],
) -> None:
    url = local_rabbitmq_node.url
    topo = make_topology(["1s"])
    apply_topology(topo, url)
    queue = f"{topo.namespace}.work"
    batch = [Message(b"c" * 200, "job.cut", "0s", message_id=f"cut-{n}") for n in range(20_000)]
    closes: list[str] = []

    def close_when_publishing() -> None:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            depth = connection.channel().queue_declare(queue, passive=True).method.message_count
            if depth > 2_000:
                break
            time.sleep(0.01)
        connection.close()
        closes.append(local_rabbitmq_node.ctl("close_all_connections", "frame link test"))

    closer = threading.Thread(target=close_when_publishing, daemon=True)
    closer.start()
    result = run(publish_many(url, topo, batch, retry_backoff_s=0.05))
    closer.join(60)
    assert closes, "the connections were never closed"
    # Re-sent on a fresh connection: all confirmed (some perhaps twice: same ids).
    assert not isinstance(result, PublishBatchError), result
    inbox = collect(queue, url=url)
    deadline = time.monotonic() + 60
    wanted = {m.message_id for m in batch}
    while not wanted <= {a.message_id for a in inbox.wait(0, timeout_s=0)}:
        assert time.monotonic() < deadline, "confirmed messages did not arrive"
        time.sleep(0.1)


# A blocked broker ------------------------------------------------------------------------


def _alarm(node: LocalNode, on: bool, timeout_s: float = 30.0) -> None:
    node.ctl("set_vm_memory_high_watermark", "0.000001" if on else "0.4")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ("memory" in node.ctl("eval", "rabbit_alarm:get_alarms().")) == on:
            return
        time.sleep(0.2)
    raise AssertionError(f"the memory alarm did not {'rise' if on else 'clear'}")


@pytest.fixture
def alarmed(local_rabbitmq_node: LocalNode) -> Iterator[LocalNode]:
    _alarm(local_rabbitmq_node, on=True)
    try:
        yield local_rabbitmq_node
    finally:
        _alarm(local_rabbitmq_node, on=False)


def test_a_blocked_broker_fails_what_is_unconfirmed_with_publish_blocked(
    local_rabbitmq_node: LocalNode, make_topology: Callable[..., Topology]
) -> None:
    url = local_rabbitmq_node.url
    topo = make_topology(["1s"])
    apply_topology(topo, url)
    _alarm(local_rabbitmq_node, on=True)
    try:
        batch = [Message(b"x", "job.b", "1s", message_id=f"blk-{n}") for n in range(30)]
        started = time.monotonic()
        error = run(publish_many(url, topo, batch, confirm_timeout_s=2))
        waited_s = time.monotonic() - started

        async def single() -> None:
            async with AsyncPublisher(url, topo, confirm_timeout_s=1) as pub:
                await pub.publish(b"x", "job.b", "1s", message_id="blk-single")

        with pytest.raises(PublishBlocked, match="blk-single"):
            run(single())
    finally:
        _alarm(local_rabbitmq_node, on=False)
    assert isinstance(error, PublishBatchError)
    assert set(error.failures) == set(range(30))
    assert all(isinstance(e, PublishBlocked) for e in error.failures.values())
    assert waited_s < 2 + 5, waited_s  # the bound, with a loaded machine's slack
    receipts = run(publish_many(url, topo, batch))  # cleared: the same ids go through
    assert len(receipts) == 30


def test_a_block_is_bounded_by_blocked_timeout_s_on_both_publishers_and_said_alike(
    local_rabbitmq_node: LocalNode, make_topology: Callable[..., Topology]
) -> None:
    """A memory alarm under concurrent publishes (the web guide's case): every waiting
    publish of either publisher fails with PublishBlocked after ``blocked_timeout_s``
    (not the 60 s confirm timeout, not PublishUnconfirmed for some of them)."""
    from delayq.errors import PublishUnconfirmed
    from delayq.sync import Publisher

    url = local_rabbitmq_node.url
    topo = make_topology(["1s"])
    apply_topology(topo, url)
    outcomes: list[BaseException | None] = []
    lock = threading.Lock()
    _alarm(local_rabbitmq_node, on=True)
    try:
        with Publisher(url, topo, blocked_timeout_s=3) as pub:

            def one(n: int) -> None:
                try:
                    pub.publish(b"x", "job.b", "1s", message_id=f"sync-blk-{n}")
                    error: BaseException | None = None
                except PublishUnconfirmed as exc:
                    error = exc
                with lock:
                    outcomes.append(error)

            threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
            started = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            sync_s = time.monotonic() - started

        async def concurrent() -> list[BaseException | None]:
            async with AsyncPublisher(url, topo, blocked_timeout_s=3) as apub:
                found = await asyncio.gather(
                    *(apub.publish(b"x", "job.b", "1s", message_id=f"async-blk-{n}")
                      for n in range(4)),
                    return_exceptions=True,
                )  # fmt: skip
                return [None if not isinstance(r, BaseException) else r for r in found]

        started = time.monotonic()
        async_outcomes = run(concurrent())
        async_s = time.monotonic() - started
    finally:
        _alarm(local_rabbitmq_node, on=False)
    assert len(outcomes) == 4 and all(isinstance(e, PublishBlocked) for e in outcomes), outcomes
    assert all(isinstance(e, PublishBlocked) for e in async_outcomes), async_outcomes
    assert sync_s < 3 + 10 and async_s < 3 + 10, (sync_s, async_s)  # not the 60 s confirm


# Misuse ----------------------------------------------------------------------------------


def _publish_one(url: str, topo: Topology, **kw: Any) -> Receipt:
    async def go() -> Receipt:
        async with AsyncPublisher(url, topo, **kw) as pub:
            return await pub.publish(b"x", "job.a", "1s")

    return run(go())  # type: ignore[no-any-return]


def test_wrong_credentials_and_vhost_fail_at_once_with_connection_failed(
    rabbitmq_url: str, applied: Topology
) -> None:
    bad_password = rabbitmq_url.replace("guest:guest@", "guest:s3cret-pw@")
    with pytest.raises(ConnectionRejected, match="refused the credentials") as caught:
        _publish_one(bad_password, applied, connect_attempts=3, retry_backoff_s=0)
    assert "s3cret-pw" not in str(caught.value)
    with pytest.raises(ConnectionRejected, match="vhost"):
        _publish_one(rabbitmq_url.rstrip("/") + "/no-such-vhost", applied)


def test_nothing_listening_fails_with_connection_failed_and_nothing_sent() -> None:
    topo = Topology(namespace="nolisten", ladder=["1s"], external_bindings=["job.#"])
    with pytest.raises(ConnectionFailed, match="cannot connect"):
        _publish_one("amqp://guest:guest@127.0.0.1:1/", topo, connect_attempts=1)
    with pytest.raises(ConnectionFailed, match="cannot connect"):
        run(
            publish_many(
                "amqp://guest:guest@127.0.0.1:1/",
                topo,
                [Message(b"x", "job.a", "1s")],
                connect_attempts=1,
            )
        )


def test_an_unapplied_or_deleted_topology_is_refused_before_anything_is_sent(
    rabbitmq_url: str, make_topology: Callable[..., Topology], applied: Topology
) -> None:
    never = make_topology(["1s"])
    with pytest.raises(TopologyNotApplied):
        _publish_one(rabbitmq_url, never)
    with pytest.raises(TopologyNotApplied):
        run(publish_many(rabbitmq_url, never, [Message(b"x", "job.a", "1s")]))
    # The marker is there but a tier exchange is gone: its check refuses the batch.
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    connection.channel().exchange_delete(applied.tier_name(applied.ladder.tiers[0]))
    connection.close()
    with pytest.raises(TopologyMissing):
        run(publish_many(rabbitmq_url, applied, [Message(b"x", "job.a", "1s")]))
    with pytest.raises(TopologyMissing):
        _publish_one(rabbitmq_url, applied)


def test_a_closed_publisher_reconnects_at_its_next_publish(
    rabbitmq_url: str, applied: Topology
) -> None:
    async def scenario() -> list[Receipt]:
        pub = AsyncPublisher(rabbitmq_url, applied)
        first = await pub.publish(b"x", "job.a", "1s")
        await pub.aclose()
        await pub.aclose()  # twice is fine
        again = await pub.publish_many([Message(b"y", "job.a", "1s")])
        await pub.aclose()
        return [first, *again]

    assert len(run(scenario())) == 2


@pytest.mark.parametrize(
    ("query", "expected"), [("?heartbeat=0", 0), ("?heartbeat=7", 7), ("", 60)]
)
def test_the_url_heartbeat_is_what_the_broker_lists_for_both_publishers(
    local_rabbitmq_node: LocalNode,
    make_topology: Callable[..., Topology],
    query: str,
    expected: int,
) -> None:
    """Issue 29: ``?heartbeat=0`` turned heartbeats off on pika's link only; the frame
    link took the broker's 60 s. The broker's own list of connections is the judge."""
    import uuid

    from delayq.sync import Publisher

    node = local_rabbitmq_node
    user = f"hb-{uuid.uuid4().hex[:8]}"
    node.ctl("add_user", user, "pw")
    node.ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")
    try:
        url = f"amqp://{user}:pw@127.0.0.1:{node.port}/{query}"
        topo = make_topology(["1s"])
        apply_topology(topo, node.url)

        async def open_async() -> AsyncPublisher:
            publisher = AsyncPublisher(url, topo)
            await publisher.connect()
            return publisher

        loop = asyncio.new_event_loop()
        try:
            publisher = loop.run_until_complete(open_async())
            with Publisher(url, topo) as sync_publisher:
                sync_publisher.publish({"n": 1}, "job.a", "1s")
                rows = node.ctl("list_connections", "user", "timeout", "--no-table-headers", "-q")
                timeouts = [int(line.split("\t")[1]) for line in rows.splitlines() if user in line]
            loop.run_until_complete(publisher.aclose())
        finally:
            loop.close()
        assert timeouts == [expected, expected]
    finally:
        node.ctl("delete_user", user, check=False)


def test_a_publisher_used_by_a_second_running_loop_refuses_it_and_sends_nothing_twice(
    rabbitmq_url: str, applied: Topology, collect: Callable[..., Collector]
) -> None:
    """Two threads' event loops driving one publisher at once tore its connection down
    and resent each other's messages (an outside tester: 352 duplicates in 5,000, no
    error). The second running loop is refused; loops one after another are fine."""
    inbox = collect(f"{applied.namespace}.work")
    pub = AsyncPublisher(rabbitmq_url, applied)
    first_up, second_done = threading.Event(), threading.Event()

    async def first() -> None:
        for n in range(10):
            await pub.publish(b"a", "job.a", "0s", message_id=f"a-{n}")
        first_up.set()
        assert await asyncio.to_thread(second_done.wait, 60)  # this loop runs meanwhile
        await asyncio.gather(
            *(pub.publish(b"a", "job.a", "0s", message_id=f"a-{n}") for n in range(10, 20))
        )

    async def second() -> None:
        with pytest.raises(PublisherInUse, match="belongs to another event loop"):
            await pub.publish(b"b", "job.a", "0s", message_id="b-0")
        with pytest.raises(PublisherInUse):
            await pub.publish_many([Message(b"b", "job.a", "0s", message_id="b-1")])

    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: errors.extend(_raised(lambda: run(first()))))
    thread.start()
    try:
        assert first_up.wait(60)
        run(second())
    finally:
        second_done.set()
        thread.join(60)
    assert errors == []

    async def after() -> None:  # the first loop has ended: this one may take over
        await pub.publish(b"c", "job.a", "0s", message_id="c-0")
        await pub.aclose()

    run(after())
    sent = {f"a-{n}" for n in range(20)} | {"c-0"}
    arrived = sorted(a.message_id for a in inbox.wait_for_ids(sent, timeout_s=60))
    assert arrived == sorted(sent)  # each once, none of the second loop's


def _raised(call: Callable[[], Any]) -> list[BaseException]:
    try:
        call()
    except BaseException as exc:
        return [exc]
    return []
