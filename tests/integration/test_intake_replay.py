"""What the broker dead-lettered from an intake queue (a delivery limit, a rejection) comes
back through ``delayq dlq replay`` to its destination, under the id its bridge gives it.

Such a message is in the DLQ as its publisher sent it, plus the broker's ``x-death``: its
routing key is the DLQ's name, and a plugin publisher seldom sets a message id. The
replay sends it through the intake under the key of its oldest ``x-death`` entry, with
the id the bridge derives from its content, which a redelivery does not change."""

from __future__ import annotations

import json
from typing import Any

import pika
import pytest
import yaml

from delayq.cli import main
from delayq.intake.relay import intake_id
from delayq.sync import apply_topology
from delayq.sync.bridge import Bridge
from tests.amqp import depth
from tests.integration.intake_support import Running
from tests.waiting import wait_for


def _publish(url: str, exchange: str, key: str, body: bytes, headers: dict[str, Any]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(
            exchange, key, body, pika.BasicProperties(headers=headers, timestamp=1_700_000_000)
        )
    finally:
        connection.close()


def _reject_all(url: str, queue: str, count: int) -> None:
    """Reject ``count`` messages of ``queue`` without requeueing: the broker dead-letters
    them to the queue's DLQ, as at its delivery limit."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for _ in range(count):
            method, _props, _body = channel.basic_get(queue)
            assert method is not None
            channel.basic_reject(method.delivery_tag, requeue=False)
    finally:
        connection.close()


def test_what_the_broker_dead_lettered_from_an_intake_replays_to_its_destination_under_its_id(
    rabbitmq_url: str, make_topology: Any, collect: Any, tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    probe = make_topology()
    ns = probe.namespace
    topology = make_topology(
        destinations=[{"queue": f"{ns}x.work", "bindings": ["job.a"]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": "direct"}],
    )
    apply_topology(topology, rabbitmq_url)
    intake = topology.intakes[0]
    queue, dlq = intake.queue_name(topology.namespace), intake.dlq_name(topology.namespace)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    headers = {"x-delay": 1000, "tenant": "acme"}
    body = b'{"order": 7}'
    _publish(rabbitmq_url, intake.exchange, "job.a", body, headers)
    wait_for(lambda: depth(rabbitmq_url, queue) == 1, 30, "in the intake queue")
    _reject_all(rabbitmq_url, queue, 1)  # no bridge ran: the broker parks it
    wait_for(lambda: depth(rabbitmq_url, dlq) == 1, 30, "in the intake's DLQ")
    expected = intake_id(intake.exchange, "job.a", headers, {"timestamp": 1_700_000_000}, body)

    args = ["-f", str(path), "--url", rabbitmq_url]
    assert main(["dlq", "list", intake.exchange, *args, "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)["messages"]
    assert listed["message_id"] == expected

    arrived = collect(topology.destinations[0].queue)
    running = Running(Bridge(rabbitmq_url, topology))
    try:
        assert main(["dlq", "replay", intake.exchange, "--all", *args]) == 0
        out, err = capsys.readouterr()
        assert "replayed 1 of 1 parked message" in out, err
        [arrival] = arrived.wait(1, 30)
        assert (arrival.message_id, arrival.routing_key, arrival.body) == (
            expected, "job.a", body,
        )  # fmt: skip
        assert arrival.headers["tenant"] == "acme" and arrival.headers["x-delay"] == -1000
        assert arrival.headers["delayq-tier"] == "1s"  # its x-delay read again
        assert running.bridge.stats.parked == 0
        assert depth(rabbitmq_url, dlq) == 0
    finally:
        running.stop()

    # The same message through the bridge directly gets that very id (and so would a copy
    # the queue delivered again after a crash: x-delivery-count is not part of it).
    running = Running(Bridge(rabbitmq_url, topology))
    try:
        _publish(rabbitmq_url, intake.exchange, "job.a", body, headers)
        wait_for(lambda: len(arrived.arrivals) == 2, 30, "the direct copy")
        assert arrived.arrivals[1].message_id == expected
    finally:
        running.stop()


def test_a_parked_message_whose_headers_cannot_be_sent_again_stays_parked_and_the_rest_replay(
    rabbitmq_url: str, make_topology: Any, collect: Any, tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A header name that is not UTF-8, an x-delay pika reads as a 301-digit integer (a
    double of 1e300) it cannot write again: listed and shown with the reason, left parked
    by a replay that says so (exit 1), and the message beside them replayed."""
    import struct

    from tests.integration.test_intake_poison import RawHeaders, _pair

    probe = make_topology()
    ns = probe.namespace
    topology = make_topology(
        destinations=[{"queue": f"{ns}x.work", "bindings": ["job.a"]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": "direct"}],
    )
    apply_topology(topology, rabbitmq_url)
    intake = topology.intakes[0]
    queue, dlq = intake.queue_name(topology.namespace), intake.dlq_name(topology.namespace)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        ten = _pair(b"x-delay", b"I" + struct.pack(">i", 10))
        for mid, table in (
            ("bad-name", ten + _pair(b"\xff", b"t\x01")),
            ("huge-double", _pair(b"x-delay", b"d" + struct.pack(">d", 1e300))),
            ("good", ten),
        ):
            channel.basic_publish(
                intake.exchange, "job.a", mid.encode(), RawHeaders(table, message_id=mid)
            )
    finally:
        connection.close()
    wait_for(lambda: depth(rabbitmq_url, queue) == 3, 30, "in the intake queue")
    _reject_all(rabbitmq_url, queue, 3)
    wait_for(lambda: depth(rabbitmq_url, dlq) == 3, 30, "in the intake's DLQ")

    args = ["-f", str(path), "--url", rabbitmq_url]
    assert main(["dlq", "list", intake.exchange, *args, "--json"]) == 0
    listed = {m["message_id"]: m for m in json.loads(capsys.readouterr().out)["messages"]}
    assert set(listed) == {"bad-name", "huge-double", "good"}
    assert "unreadable-headers" in json.dumps(listed["bad-name"])
    for mid in listed:
        assert main(["dlq", "show", intake.exchange, mid, *args]) == 0
        capsys.readouterr()

    arrived = collect(topology.destinations[0].queue)
    running = Running(Bridge(rabbitmq_url, topology))
    try:
        assert main(["dlq", "replay", intake.exchange, "--all", *args]) == 1
        out, err = capsys.readouterr()
        assert "replayed 1 of 3 parked messages" in out, (out, err)
        assert "2 left in" in err and "bad-name" in err and "huge-double" in err
        [arrival] = arrived.wait(1, 30)
        assert arrival.message_id == "good"
        assert depth(rabbitmq_url, dlq) == 2
    finally:
        running.stop()
