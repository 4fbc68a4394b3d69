"""Intakes of type topic and fanout on a real broker: each message the plugin's exchange
would have routed to several queues reaches each of them once, never early; a key no
destination binds is parked in the intake's DLQ with the reason, never dropped.

A fanout intake schedules a message published with the empty key (the usual for fanout
publishers) under the key ``fanout``, which every destination's ``#`` matches: through
the tiers and the exact cascade, and a consumer's retries and a DLQ replay keep it. A
direct or topic intake parks the empty key with the reason (see ``delayq.intake.relay``).
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import pika
import yaml

from delayq.cli import main
from delayq.consume.retry import FixedBackoff
from delayq.intake import FANOUT_KEY
from delayq.observe.deliveries import Settled
from delayq.stores.memory import InMemoryStore
from delayq.sync import Consumer, apply_topology
from delayq.sync.bridge import Bridge
from tests.integration.conftest import SyncConsumerHandle
from tests.integration.intake_support import Running, publish_plugin_style, settled
from tests.waiting import wait_for


def test_rabbitmq_matches_the_empty_key_by_hash_or_the_empty_binding_alone(
    rabbitmq_url: str,
) -> None:
    """What the plugin's topic exchange did with the empty key, checked on the broker
    (and what ``delayq.topology.topic`` models): ``#`` and ``""`` match it, ``*`` not."""
    exchange = f"probe-{uuid.uuid4().hex[:10]}"
    # binding key: (matches "", matches "a")
    bindings = {"#": (1, 1), "": (1, 0), "*": (0, 1), "#.#": (1, 1), "a.#": (0, 1)}
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        channel.exchange_declare(exchange, "topic", auto_delete=True)
        queues = {}
        for key in bindings:
            queue = channel.queue_declare("", exclusive=True).method.queue
            channel.queue_bind(queue, exchange, key)
            queues[key] = queue
        channel.confirm_delivery()
        channel.basic_publish(exchange, "", b"{}")
        channel.basic_publish(exchange, "a", b"{}")  # after it: a binding's count is final
        got = {k: channel.queue_declare(q, passive=True).method.message_count
               for k, q in queues.items()}  # fmt: skip
        assert got == {k: sum(v) for k, v in bindings.items()}
        channel.exchange_delete(exchange)
    finally:
        connection.close()


def _two_destinations(make_topology: Any, kind: str, a: str, b: str, **extra: Any) -> Any:
    probe = make_topology()  # for a fresh namespace
    ns = probe.namespace
    return make_topology(
        destinations=[{"queue": f"{ns}x.a", "bindings": [a]},
                      {"queue": f"{ns}x.b", "bindings": [b]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": kind}],
        **extra,
    )  # fmt: skip


def _messages(keys: dict[str, str], per_key: int) -> list[dict[str, Any]]:
    delays = [0, 500, 1500]
    return [
        {"id": f"{name}-{n}", "routing_key": key, "body": b"{}",
         "headers": {"x-delay": delays[n % len(delays)]}, "delay": delays[n % len(delays)]}
        for name, key in keys.items()
        for n in range(per_key)
    ]  # fmt: skip


def _check_arrivals(
    got: list[Any], messages: list[dict[str, Any]], want: dict[str, set[str]]
) -> None:
    """Each message at each queue of ``want[its name]`` exactly once, never early."""
    sent = {m["id"]: m for m in messages}
    reached = Counter((a.message_id, a.queue) for a in got)
    expected = Counter(
        (m["id"], queue) for m in messages for queue in want[m["id"].rsplit("-", 1)[0]]
    )
    assert reached == expected, (reached - expected, expected - reached)
    for arrival in got:
        m = sent[arrival.message_id]
        assert arrival.at_ms >= m["sent_ms"] + m["delay"], f"{arrival.message_id} early"
        assert arrival.headers["x-delay"] == -m["delay"]


def test_a_topic_intake_reaches_every_queue_a_pattern_binds_and_parks_what_none_binds(
    rabbitmq_url: str, make_topology: Any, collect: Any
) -> None:
    topology = _two_destinations(make_topology, "topic", "order.*", "*.created")
    apply_topology(topology, rabbitmq_url)
    a, b = (d.queue for d in topology.destinations)
    intake = topology.intakes[0]
    arrived = collect(a, b)
    parked = collect(intake.dlq_name(topology.namespace))
    running = Running(Bridge(rabbitmq_url, topology, prefetch=100))
    try:
        keys = {"both": "order.created", "a": "order.paid", "b": "invoice.created",
                "none": "invoice.paid", "empty": ""}  # fmt: skip
        messages = _messages(keys, 30)
        publish_plugin_style(rabbitmq_url, intake.exchange, messages)
        want = {"both": {a, b}, "a": {a}, "b": {b}, "none": set(), "empty": set()}
        got = settled(arrived, rabbitmq_url, topology, 30 * 4, 60)
        _check_arrivals(got, messages, want)
        assert {x.routing_key for x in got} == {"order.created", "order.paid", "invoice.created"}

        dead = parked.wait(60, 30)
        assert Counter(x.message_id.rsplit("-", 1)[0] for x in dead) == {"none": 30, "empty": 30}
        for x in dead:
            assert x.headers["delayq-dead-letter-reason"] == "unschedulable"
            said = str(x.headers["delayq-error-message"])
            if x.message_id.startswith("none"):
                assert "routing key 'invoice.paid' matches no binding" in said
            else:
                assert "routing key is empty: a topic intake routes by the key" in said
    finally:
        running.stop()
    stats = running.bridge.stats
    assert (stats.forwarded, stats.parked, stats.returned) == (90, 60, 0)


def test_a_fanout_intake_reaches_every_queue_once_whatever_the_key(
    rabbitmq_url: str, make_topology: Any, collect: Any
) -> None:
    """The empty key (as fanout publishers send) and a non-empty one, through the tiers
    and through the exact cascade: each message at both queues bound ``#``, once."""
    topology = _two_destinations(
        make_topology, "fanout", "#", "#", exact={"unit": "250ms", "levels": 4}
    )
    exact = topology.model_copy(
        update={"intakes": (topology.intakes[0].model_copy(update={"strategy": "exact"}),)}
    )
    apply_topology(topology, rabbitmq_url)
    a, b = (d.queue for d in topology.destinations)
    arrived = collect(a, b)
    parked = collect(topology.intakes[0].dlq_name(topology.namespace))
    tiered = Running(Bridge(rabbitmq_url, topology, prefetch=100))
    try:
        messages = _messages({"empty": "", "keyed": "order.created"}, 30)
        publish_plugin_style(rabbitmq_url, topology.intakes[0].exchange, messages)
        want = {"empty": {a, b}, "keyed": {a, b}}
        got = settled(arrived, rabbitmq_url, topology, 60 * 2, 60)
        _check_arrivals(got, messages, want)
        for x in got:  # what consumers see
            key = FANOUT_KEY if x.message_id.startswith("empty") else "order.created"
            assert (x.routing_key, x.headers["delayq-routing-key"]) == (key, key)
            assert x.headers["delayq-tier"] != "exact"
    finally:
        tiered.stop()
    assert not parked.arrivals

    # The same intake bridged by the exact cascade: its keys end in the fanout key.
    cascade = Running(Bridge(rabbitmq_url, exact, prefetch=100))
    try:
        messages = _messages({"xempty": "", "xkeyed": "order.created"}, 10)
        publish_plugin_style(rabbitmq_url, topology.intakes[0].exchange, messages)
        got = settled(arrived, rabbitmq_url, topology, 60 * 2 + 20 * 2, 60)
        got = [x for x in got if x.message_id.startswith("x")]
        _check_arrivals(got, messages, {"xempty": {a, b}, "xkeyed": {a, b}})
        for x in got:
            key = FANOUT_KEY if x.message_id.startswith("xempty") else "order.created"
            assert x.headers["delayq-routing-key"] == key
            if x.headers["delayq-tier"] == "exact":  # 4 bits, r, the key
                assert x.routing_key.split(".", 5)[4:] == ["r", key], x.routing_key
            else:  # a delay of 0: straight to the ready exchange
                assert x.routing_key == key
        assert {x.headers["delayq-tier"] for x in got} == {"exact", "immediate"}
    finally:
        cascade.stop()
    assert not parked.arrivals


class _Seen:
    """An observer: each settled delivery's id, attempt, routing key and outcome."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str, str]] = []
        self.lock = threading.Lock()

    def settled(self, event: Settled) -> None:
        with self.lock:
            self.events.append(
                (str(event.message_id), event.attempt, event.routing_key, event.outcome)
            )

    def of(self, message_id: str) -> list[tuple[int, str, str]]:
        with self.lock:
            return [(at, key, out) for mid, at, key, out in self.events if mid == message_id]


class Poison(Exception):
    """Not retried: the message goes to the destination's DLQ."""


def test_a_fanout_message_sent_with_the_empty_key_keeps_its_key_through_retry_and_replay(
    rabbitmq_url: str, make_topology: Any, tmp_path: Any
) -> None:
    topology = _two_destinations(make_topology, "fanout", "#", "#")
    apply_topology(topology, rabbitmq_url)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    queue = topology.destinations[0].queue
    calls: Counter[str] = Counter()
    replayed = threading.Event()

    def handle(body: dict[str, Any]) -> None:
        calls[body["id"]] += 1
        if body["id"] == "retried" and calls["retried"] == 1:
            raise RuntimeError("the first attempt fails")
        if body["id"] == "poison" and not replayed.is_set():
            raise Poison("dead-lettered until replayed")

    seen = _Seen()
    consumer = SyncConsumerHandle(
        Consumer(rabbitmq_url, topology, queue, handle, store=InMemoryStore(),
                 policy=FixedBackoff(delay="1s", max_attempts=3), non_retryable=(Poison,),
                 observers=[seen])
    )  # fmt: skip
    running = Running(Bridge(rabbitmq_url, topology))
    try:
        publish_plugin_style(rabbitmq_url, topology.intakes[0].exchange, [
            {"id": mid, "routing_key": "", "body": f'{{"id": "{mid}"}}'.encode(),
             "headers": {"x-delay": 500}}
            for mid in ("retried", "poison")
        ])  # fmt: skip
        wait_for(lambda: len(seen.of("retried")) == 2, 30, lambda: f"retried: {seen.events}")
        assert seen.of("retried") == [(1, FANOUT_KEY, "retry"), (2, FANOUT_KEY, "ack")]
        wait_for(lambda: seen.of("poison"), 30, lambda: f"poison: {seen.events}")
        assert seen.of("poison") == [(1, FANOUT_KEY, "dead-letter")]

        replayed.set()
        code = main(["dlq", "replay", queue, "--all", "-f", str(path), "--url", rabbitmq_url])
        assert code == 0
        wait_for(lambda: len(seen.of("poison")) == 2, 30, lambda: f"poison: {seen.events}")
        assert seen.of("poison")[1] == (1, FANOUT_KEY, "ack")
    finally:
        running.stop()
        consumer.stop()
