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


def test_a_stop_is_graceful_and_a_node_that_does_not_stop_is_killed_in_time(tmp_path):
    """``LocalNode.start`` reads the end of the boot from the node's log and ``stop`` sends
    the Erlang VM SIGTERM (no ``rabbitmqctl`` for either): RabbitMQ closes its listeners and
    message stores in order; a VM that cannot act on it (frozen here) is killed once
    ``timeout_s`` has passed, and the next start finds the data kept."""
    import os
    import signal
    import time

    import pika

    from delayq.local import probes

    node = LocalNode(tmp_path / "node")

    def no_ctl(*args: str, **_kwargs: object) -> str:
        raise AssertionError(f"rabbitmqctl {args} was run")

    node.ctl = no_ctl  # type: ignore[method-assign]  # start and stop need none
    node.start()
    try:
        params = pika.URLParameters(node.url)
        with pika.BlockingConnection(params) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare("kept", durable=True, arguments={"x-queue-type": "quorum"})
            channel.basic_publish("", "kept", b"x", pika.BasicProperties(delivery_mode=2))
        node.stop()
        log = next((tmp_path / "node" / "log").glob("delayq-*@localhost.log")).read_text()
        assert "Stopping message store" in log, log[-2000:]
        assert not node.running

        node.start()
        assert node._process is not None
        vm = probes.vm_of(node._process.pid)
        assert vm is not None
        os.kill(vm, signal.SIGSTOP)  # frozen: SIGTERM stays pending
        started = time.monotonic()
        node.stop(timeout_s=3)
        assert not node.running and time.monotonic() - started < 20

        node.start()  # the kill lost nothing confirmed
        with pika.BlockingConnection(params) as connection:
            declared = connection.channel().queue_declare("kept", durable=True, passive=True)
            assert declared.method.message_count == 1
    finally:
        node.cleanup()
