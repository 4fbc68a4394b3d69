"""Connection loss while publishing: re-sent on a fresh connection, or a clear error."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from delayq import ConnectionFailed, Message, PublishUnconfirmed
from delayq.local.node import LocalNode
from delayq.retrying import DEFAULT_RECONNECT_WITHIN_S


def _close_connections_repeatedly(node: LocalNode, times: int, every_s: float) -> threading.Thread:
    def run() -> None:
        for _ in range(times):
            time.sleep(every_s)
            node.ctl("close_all_connections", "delayq connection-loss test", check=False)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_single_publishes_survive_connections_being_closed(
    driver_for, local_rabbitmq_node, make_topology, collect
):
    url = local_rabbitmq_node.url
    topo = make_topology(["1s"])
    driver = driver_for(url)
    driver.apply(topo)
    closer = _close_connections_repeatedly(local_rabbitmq_node, times=3, every_s=0.4)
    receipts = []
    deadline = time.monotonic() + 30
    while closer.is_alive() and time.monotonic() < deadline:
        n = len(receipts)
        receipts.append(driver.publish(topo, {"n": n}, "job.loss", "0s", message_id=f"loss-{n}"))
    closer.join()
    assert len(receipts) > 10
    inbox = collect(f"{topo.namespace}.work", url=url)
    inbox.wait(len(receipts), timeout_s=15)
    seen = Counter(a.message_id for a in inbox.settle(0.5))
    missing = {r.message_id for r in receipts} - set(seen)
    assert not missing, f"{len(missing)} confirmed messages were lost"


def test_publish_many_resends_what_was_not_confirmed(
    driver_for, local_rabbitmq_node, make_topology, collect
):
    url = local_rabbitmq_node.url
    topo = make_topology(["1s"])
    driver = driver_for(url)
    driver.apply(topo)
    batch = [Message(b"x" * 256, "job.loss", "0s", message_id=f"bulk-{n}") for n in range(30_000)]
    closer = _close_connections_repeatedly(local_rabbitmq_node, times=2, every_s=0.5)
    receipts = driver.publish_many(topo, batch)
    closer.join()
    assert len(receipts) == len(batch)
    inbox = collect(f"{topo.namespace}.work", url=url)
    inbox.wait(len(batch), timeout_s=60)
    seen = Counter(a.message_id for a in inbox.settle(1.0))
    missing = {m.message_id for m in batch} - set(seen)
    assert not missing, f"{len(missing)} confirmed messages were lost"


@pytest.fixture
def stoppable_node():
    node = LocalNode()
    node.start()
    yield node
    node.cleanup()


def test_a_broker_that_goes_away_gives_a_clear_error_in_bounded_time(
    driver_for, stoppable_node, make_topology
):
    url = stoppable_node.url
    topo = make_topology(["1s"])
    driver = driver_for(url)
    driver.apply(topo)
    driver.publish(topo, b"before", "job.a", "1s")
    stoppable_node.stop()
    started = time.monotonic()
    with pytest.raises((PublishUnconfirmed, ConnectionFailed)) as caught:
        driver.publish(topo, b"after", "job.a", "1s", message_id="m-after")
    # Connected before, the publisher waits for the broker up to reconnect_within (30 s by
    # default: a restart is ridden through; its last round begins when the budget ends),
    # then says so; bounded.
    waited = time.monotonic() - started
    assert DEFAULT_RECONNECT_WITHIN_S - 1 < waited < DEFAULT_RECONNECT_WITHIN_S + 15
    assert "guest:guest" not in str(caught.value)
    if isinstance(caught.value, PublishUnconfirmed):
        assert caught.value.message_id == "m-after"
