"""A broker restart is ridden through by default: a 50,000-message batch whose node is
restarted mid-way is confirmed whole, nothing lost, duplicates only from what was in
flight; a broker that does not come back within ``reconnect_within`` fails what is left,
naming what was never sent apart from what was in flight.

Each batch goes through :class:`tests.proxy.HoldingProxy`, which holds it after 10,000
publishes until the node begins to stop: the restart lands mid-batch by construction,
never by timing.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pika
import pytest

from delayq import Message, Publisher, PublishNotSent, PublishUnconfirmed
from delayq.aio import AsyncPublisher
from delayq.errors import PublishBatchError
from delayq.local.node import LocalNode
from delayq.sync import apply_topology
from delayq.topology.model import Topology
from tests.proxy import HoldingProxy
from tests.waiting import wait_for

COUNT = 50_000
HOLD_AFTER = 10_000
WINDOW = 1_000  # publish_many's default window: the most a lost connection has in flight


def _batch(tag: str) -> list[Message]:
    return [
        Message({"n": n}, f"job.restart.{n % 7}", "1h", message_id=f"{tag}-{n}")
        for n in range(COUNT)
    ]


def _publish(kind: str, url: str, topo: Topology, batch: list[Message], **options: Any) -> Any:
    """``publish_many`` with the publisher's defaults (and ``options``): its receipts, or
    the exception it raised."""
    try:
        if kind == "sync":
            with Publisher(url, topo, **options) as pub:
                return pub.publish_many(batch)

        async def run() -> Any:
            async with AsyncPublisher(url, topo, **options) as pub:
                return await pub.publish_many(batch)

        return asyncio.run(run())
    except Exception as exc:
        return exc


def _in_background(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


def _message_ids(url: str, queue: str) -> Counter[str]:
    """Every message id in ``queue``, counted, read and acked (the queue is left empty)."""
    ids: Counter[str] = Counter()
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1000)
        last_tag = acked = 0
        for method, properties, _body in channel.consume(queue, inactivity_timeout=2):
            if method is not None:
                ids[properties.message_id] += 1
                last_tag = method.delivery_tag
                if last_tag % 250 == 0:
                    channel.basic_ack(last_tag, multiple=True)
                    acked = last_tag
                continue
            if last_tag > acked:
                channel.basic_ack(last_tag, multiple=True)
                acked = last_tag
            if channel.queue_declare(queue, passive=True).method.message_count == 0:
                break
        channel.cancel()
        return ids
    finally:
        connection.close()


@pytest.fixture
def applied(local_rabbitmq_node: LocalNode, make_topology: Callable[..., Topology]) -> Topology:
    topo = make_topology(["1h"])
    apply_topology(topo, local_rabbitmq_node.url)
    return topo


@pytest.mark.timeout(420)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_batch_rides_through_a_broker_restart_with_the_defaults(
    kind: str, local_rabbitmq_node: LocalNode, applied: Topology
) -> None:
    node = local_rabbitmq_node
    batch = _batch(f"{kind}-restart")
    with HoldingProxy(node.url, hold_after=HOLD_AFTER) as proxy:
        thread, out = _in_background(lambda: _publish(kind, proxy.url, applied, batch))
        wait_for(proxy.holding.is_set, 120, "the batch held after 10,000 publishes")
        node.restart()  # graceful stop (the proxy lets the node close it) and start
        thread.join(120)
        assert not thread.is_alive(), "the batch did not end within 120 s of the restart"
    [result] = out
    assert not isinstance(result, BaseException), f"the batch failed: {result!r}"
    assert [r.message_id for r in result] == [m.message_id for m in batch]
    ids = _message_ids(node.url, applied.tier_name(applied.ladder.tiers[0]))
    assert set(ids) == {m.message_id for m in batch}, f"{COUNT - len(ids)} confirmed, lost"
    duplicates = sum(ids.values()) - COUNT
    assert duplicates <= WINDOW, f"{duplicates} duplicates: more than the in-flight window"


@pytest.mark.timeout(420)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_broker_gone_for_longer_fails_what_is_left_naming_what_was_never_sent(
    kind: str, local_rabbitmq_node: LocalNode, applied: Topology
) -> None:
    node = local_rabbitmq_node
    batch = _batch(f"{kind}-gone")
    try:
        with HoldingProxy(node.url, hold_after=HOLD_AFTER) as proxy:
            thread, out = _in_background(
                lambda: _publish(kind, proxy.url, applied, batch, reconnect_within="3s")
            )
            wait_for(proxy.holding.is_set, 120, "the batch held after 10,000 publishes")
            node.stop()
            thread.join(120)
            assert not thread.is_alive(), "the batch did not give up within 120 s"
    finally:
        node.start()
    [error] = out
    assert isinstance(error, PublishBatchError), repr(error)
    confirmed = [r for r in error.receipts if r is not None]
    failed = error.failures
    not_sent = [i for i, e in failed.items() if isinstance(e, PublishNotSent)]
    maybe = [i for i, e in failed.items() if type(e) is PublishUnconfirmed]
    assert len(confirmed) + len(failed) == COUNT
    assert len(confirmed) <= HOLD_AFTER
    assert len(maybe) <= WINDOW, f"{len(maybe)} reported unknown: more than was in flight"
    assert len(not_sent) == len(failed) - len(maybe) >= COUNT - HOLD_AFTER - WINDOW
    first = failed[not_sent[0]]
    assert "was never sent" in str(first) and "for 3 s" in str(first), str(first)
    assert "not at the broker" in str(first)
    # What the broker confirmed is there; what is reported never sent is not.
    ids = _message_ids(node.url, applied.tier_name(applied.ladder.tiers[0]))
    assert {r.message_id for r in confirmed} <= set(ids)
    assert not {batch[i].message_id for i in not_sent} & set(ids)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_single_publish_waits_out_a_restart_once_connected(
    kind: str, local_rabbitmq_node: LocalNode, applied: Topology
) -> None:
    """Connected, then the node stops: the next ``publish`` waits for it to come back."""
    node = local_rabbitmq_node
    tier = applied.tier_name(applied.ladder.tiers[0])

    def restart_then_publish(publish: Callable[[str], Any]) -> Any:
        publish("before")
        node.stop()
        starting = threading.Thread(target=node.start, daemon=True)
        starting.start()  # the node is down now; the publish below waits for it
        try:
            return publish("after")
        finally:
            starting.join(120)

    if kind == "sync":
        with Publisher(node.url, applied) as pub:
            receipt = restart_then_publish(
                lambda tag: pub.publish({"n": 1}, "job.one", "1h", message_id=f"one-{tag}")
            )
    else:

        async def run() -> Any:
            async with AsyncPublisher(node.url, applied) as pub:
                loop = asyncio.get_running_loop()

                def publish(tag: str) -> Any:
                    call = pub.publish({"n": 1}, "job.one", "1h", message_id=f"one-{tag}")
                    return asyncio.run_coroutine_threadsafe(call, loop).result(120)

                return await asyncio.to_thread(restart_then_publish, publish)

        receipt = asyncio.run(run())
    assert receipt.message_id == "one-after"
    assert _message_ids(node.url, tier) == Counter({"one-before": 1, "one-after": 1})
