"""Delays live in the broker: parked messages survive a broker restart."""

from __future__ import annotations

from collections import Counter

import pytest

from delayq import Message
from delayq.local.node import LocalNode

# A message whose tier expires it while the node is still starting its queues goes to the
# tier's dead-letter worker before the work queue takes it; the worker sends it again
# only after dead_letter_worker_publisher_confirm_timeout (180 s on RabbitMQ 3.10.8).
# Seen in CI on a loaded machine (every message of the 10 s tier, none lost, all late):
# the wait allows for that, and docs/operations/deployment.md says how to shorten it.
DEAD_LETTER_RESEND_S = 180


@pytest.mark.timeout(DEAD_LETTER_RESEND_S + 180)
def test_parked_messages_survive_a_broker_restart(
    driver_for, local_rabbitmq_node: LocalNode, make_topology, collect
):
    url = local_rabbitmq_node.url
    topo = make_topology(["10s", "20s"])
    driver = driver_for(url)
    driver.apply(topo)
    batch = [
        Message({"n": n}, f"job.r.{n}", ["8s", "15s"][n % 2], message_id=f"restart-{n}")
        for n in range(500)
    ]
    receipts = driver.publish_many(topo, batch)
    assert len(receipts) == 500
    driver.close()

    local_rabbitmq_node.restart()  # graceful stop and start, data kept

    inbox = collect(f"{topo.namespace}.work", url=url)
    inbox.wait(500, timeout_s=DEAD_LETTER_RESEND_S + 60)
    arrivals = inbox.settle(0.5)
    counts = Counter(a.message_id for a in arrivals)
    assert set(counts) == {m.message_id for m in batch}, (
        f"{500 - len(counts)} parked messages were lost in the restart"
    )
    for arrival in arrivals:  # never early, even across a restart
        receipt = next(r for r in receipts if r.message_id == arrival.message_id)
        assert arrival.at_ms - receipt.published_at_ms >= receipt.tier_ms
