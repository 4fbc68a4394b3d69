"""Parked messages survive being looked at, on every RabbitMQ version the suite runs.

Browsing a DLQ or ``<ns>.unrouted`` takes messages and gives them back. RabbitMQ 4.x
quorum queues count every such return against a delivery limit, 20 by default, and
delete the message past it: before delayq declared its parked queues with a limit of
their own, the 21st ``delayq dlq list`` deleted every parked message without a word.

* a DLQ and the unrouted queue browsed 100 times keep every message (both versions);
* a parked queue declared the old way (no ``x-delivery-limit``): on 4.x delayq refuses
  to browse it (:class:`~delayq.ParkedAtRisk`, nothing lost, nothing counted), on 3.x,
  which has no default limit, it browses it as before; replaying all of it works on both
  (a replay of everything returns nothing), and ``apply`` names the argument it lacks.
"""

from __future__ import annotations

import pika
import pytest
import yaml

from delayq import ParkedAtRisk, Topology
from delayq.sync import apply_topology, parking
from delayq.topology.declarations import PARKED_DELIVERY_LIMIT
from delayq.topology.report import ApplyStatus
from tests.amqp import depth
from tests.integration.test_parking import delayq
from tests.versions import nack_counts

BROWSES = 100
PARKED = 3


def _park(url: str, exchange: str, routing_key: str, count: int, prefix: str) -> list[str]:
    """Publish ``count`` persistent messages, confirmed, with ids ``prefix-<i>``."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        ids = [f"{prefix}-{i}" for i in range(count)]
        for message_id in ids:
            channel.basic_publish(
                exchange,
                routing_key,
                b'{"parked": true}',
                pika.BasicProperties(
                    message_id=message_id, delivery_mode=2, content_type="application/json"
                ),
                mandatory=True,
            )
        return ids
    finally:
        connection.close()


def test_a_dlq_and_the_unrouted_queue_browsed_100_times_keep_every_message(
    make_topology, rabbitmq_url, rabbitmq_version, tmp_path
):
    topology: Topology = make_topology(["1s"])
    apply_topology(topology, rabbitmq_url)
    dest = topology.destinations[0]
    in_dlq = _park(rabbitmq_url, "", dest.dlq, PARKED, "dead")
    # Due with a routing key no destination binds: the alternate exchange parks it.
    unrouted = _park(rabbitmq_url, topology.ready_exchange, "nobody.binds.this", PARKED, "lost")
    assert depth(rabbitmq_url, topology.unrouted) == PARKED

    for _ in range(BROWSES):
        seen_dlq = parking.browse(rabbitmq_url, dest.dlq, dead_letters_of=dest.queue)
        seen_unrouted = parking.browse(rabbitmq_url, topology.unrouted)
        assert [p.message_id for p in seen_dlq] == in_dlq
        assert [p.message_id for p in seen_unrouted] == unrouted

    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    listed = delayq(path, rabbitmq_url, "dlq", "list", dest.queue)
    assert listed.returncode == 0, listed.stderr
    assert all(message_id in listed.stdout for message_id in in_dlq)
    assert depth(rabbitmq_url, dest.dlq) == PARKED
    assert depth(rabbitmq_url, topology.unrouted) == PARKED
    # What counted the returns: the broker's own header, past 4.x's default limit of 20
    # (4.3 counts a browse's nack as an acquisition only: nothing to reach a limit).
    last = parking.browse(rabbitmq_url, dest.dlq)[0].delivery.headers
    if rabbitmq_version >= (4,) and nack_counts(rabbitmq_version):
        assert int(last["x-delivery-count"]) >= BROWSES + 1
    elif rabbitmq_version >= (4,):
        assert "x-delivery-count" not in last
        assert int(last["x-acquired-count"]) >= BROWSES + 1
    assert PARKED_DELIVERY_LIMIT > 1_000 * BROWSES


@pytest.fixture
def legacy_dlq(make_topology, rabbitmq_url):
    """A topology whose DLQ was declared as delayq did before (no x-delivery-limit), with
    messages parked in it."""
    topology: Topology = make_topology(["1s"])
    dest = topology.destinations[0]
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        connection.channel().queue_declare(
            dest.dlq, durable=True, arguments={"x-queue-type": "quorum"}
        )
    finally:
        connection.close()
    ids = _park(rabbitmq_url, "", dest.dlq, PARKED, "old")
    return topology, ids


def test_a_dlq_declared_without_the_limit_is_refused_on_4x_and_browsed_on_3x(
    legacy_dlq, rabbitmq_url, rabbitmq_version
):
    topology, ids = legacy_dlq
    dest = topology.destinations[0]
    if rabbitmq_version >= (4,):
        # 4.x: each browse would count toward the default limit of 20, so none is made.
        for _ in range(25):
            with pytest.raises(ParkedAtRisk) as refused:
                parking.browse(rabbitmq_url, dest.dlq)
        text = str(refused.value)
        assert dest.dlq in text and "default of 20" in text and "delayq topology apply" in text
        assert refused.value.current is None and refused.value.argument == "x-delivery-limit"
        assert depth(rabbitmq_url, dest.dlq) == PARKED
    else:
        # 3.x has no default limit: browsing such a queue loses nothing.
        for _ in range(25):
            assert [p.message_id for p in parking.browse(rabbitmq_url, dest.dlq)] == ids
        assert depth(rabbitmq_url, dest.dlq) == PARKED


def test_apply_accepts_the_old_dlq_and_a_full_replay_empties_it(legacy_dlq, rabbitmq_url):
    """An upgrade needs no redeclaration: apply takes the queue as it is (its marker is the
    same as before), and replaying all of it, which returns nothing, empties it on 4.x too;
    deleted and applied again, the queue has the limit."""
    topology, ids = legacy_dlq
    dest = topology.destinations[0]
    report = apply_topology(topology, rabbitmq_url)
    assert report.ok
    [result] = [r for r in report.results if r.declaration.name == dest.dlq]
    assert result.status is ApplyStatus.PRESENT and result.legacy

    holding = f"{topology.namespace}.holding"
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        connection.channel().queue_declare(holding, durable=True)
    finally:
        connection.close()
    replayed = parking.replay(rabbitmq_url, dest.dlq, topology, target=lambda _: ("", holding))
    assert sorted(replayed.replayed) == sorted(ids) and not replayed.returned
    assert depth(rabbitmq_url, dest.dlq) == 0 and depth(rabbitmq_url, holding) == PARKED

    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        channel.queue_delete(dest.dlq)
        channel.queue_delete(holding)
    finally:
        connection.close()
    again = apply_topology(topology, rabbitmq_url)
    [result] = [r for r in again.results if r.declaration.name == dest.dlq]
    assert result.status is ApplyStatus.CREATED and not result.legacy
    for _ in range(25):
        assert parking.browse(rabbitmq_url, dest.dlq) == []
