"""A cancelled (or outdated, rescheduled) message in the delivery flow and the consumers.

The flow stepped by hand (as in ``test_flow.py``), then the sync and async consumers
on the memory broker with a real store: a cancelled message is acked as
``cancelled``, counted, recorded and logged, and never handled, retried or
dead-lettered. See ``docs/concepts/cancel.md``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from delayq import Topology
from delayq.consume.delivery import Action
from delayq.consume.flow import Ack, Publish
from delayq.message.envelope import H_GENERATION
from delayq.observe.deliveries import Settled
from delayq.observe.metrics import PrometheusObserver
from delayq.observe.records import DeliveryRecorder
from delayq.stores.base import Claim, ClaimStatus
from delayq.stores.key_scope import KeyScope, scoped_key
from delayq.stores.memory import InMemoryStore
from delayq.testing import MemoryBroker
from tests.unit.test_flow import _answers, _context, _delivery, _kinds, _walk

# --- the flow -------------------------------------------------------------------------------------


def test_a_cancelled_key_is_acked_as_cancelled_without_handler_or_republish(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="delayq.consumer"):
        steps, end = _walk(_context(), _delivery(), _answers(claim=ClaimStatus.CANCELLED))
    assert _kinds(steps) == ["Claim"]  # no RunHandler, no Publish: never retried nor DLQ'd
    assert isinstance(end, Ack) and end.decision.action is Action.CANCELLED
    assert end.decision.message is None and end.handler_ms is None
    assert any("m-1" in r.getMessage() and "cancelled" in r.getMessage() for r in caplog.records)


def test_the_claim_carries_the_copys_generation() -> None:
    steps, _ = _walk(_context(), _delivery(headers={H_GENERATION: 42}), _answers())
    claim = steps[0]
    assert isinstance(claim, Claim) and claim.generation == 42
    steps, _ = _walk(_context(), _delivery(), _answers())
    assert isinstance(steps[0], Claim) and steps[0].generation == 0


def test_a_64_bit_generation_as_pika_decodes_it_is_the_copys_generation() -> None:
    """pika decodes a header above 2**31 (a generation is epoch ms) as ``pika.compat.long``,
    an int subclass: read as 0, every rescheduled copy met its own mark on RabbitMQ and was
    cancelled (found by tests/integration/test_cli_cancel.py)."""
    from pika.compat import long

    generation = 1_795_600_550_213
    steps, _ = _walk(_context(), _delivery(headers={H_GENERATION: long(generation)}), _answers())
    claim = steps[0]
    assert isinstance(claim, Claim) and claim.generation == generation
    assert type(claim.generation) is int


@pytest.mark.parametrize("bad", [True, -1, "7", 7.0, None, b"7", 2**53, 2**60])
def test_a_malformed_generation_counts_as_never_rescheduled(bad: object) -> None:
    steps, _ = _walk(_context(), _delivery(headers={H_GENERATION: bad}), _answers())
    claim = steps[0]
    assert isinstance(claim, Claim) and claim.generation == 0


def test_a_retry_and_a_dead_letter_of_a_rescheduled_copy_keep_its_generation() -> None:
    steps, end = _walk(
        _context(), _delivery(headers={H_GENERATION: 3}), _answers(handler=RuntimeError("x"))
    )
    publish = steps[-1]
    assert isinstance(publish, Publish) and publish.message.headers[H_GENERATION] == 3
    assert isinstance(end, Ack) and end.decision.action is Action.RETRY
    last = _delivery(headers={H_GENERATION: 3, "delayq-attempt": 3})
    steps, end = _walk(_context(), last, _answers(handler=RuntimeError("x")))
    publish = steps[-1]
    assert isinstance(publish, Publish) and publish.message.routing_key == "work.dlq"
    assert publish.message.headers[H_GENERATION] == 3


def test_without_a_store_nothing_is_looked_up() -> None:
    steps, end = _walk(_context(store=False), _delivery(headers={H_GENERATION: 3}), _answers())
    assert _kinds(steps) == ["RunHandler"]
    assert isinstance(end, Ack) and end.decision.action is Action.ACK


def test_a_store_answers_the_flow_cancelled_for_a_key_function_key_too() -> None:
    store = InMemoryStore()
    store.cancel(scoped_key("7", "work", KeyScope.QUEUE), now_ms=0)

    def answer(step: Any) -> Any:
        if isinstance(step, Claim):
            return store.claim(step.key, lease_ms=step.lease_ms, now_ms=step.now_ms)
        return _answers()(step)

    keyed = _context(key=lambda body: body["id"])
    _steps, end = _walk(keyed, _delivery(), answer)
    assert isinstance(end, Ack) and end.decision.action is Action.CANCELLED
    _steps, end = _walk(_context(), _delivery(), answer)  # keyed by message id: not cancelled
    assert isinstance(end, Ack) and end.decision.action is Action.ACK


# --- the consumers on the memory broker -----------------------------------------------------------

TOPOLOGY = Topology(
    namespace="shop",
    ladder=["1m", "5m", "15m"],
    destinations=[{"queue": "orders", "bindings": ["order.*"]}],
)


class _Seen:
    def __init__(self) -> None:
        self.events: list[Settled] = []

    def settled(self, event: Settled) -> None:
        self.events.append(event)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_cancelled_message_is_never_handled_parked_or_retrying(
    memory_broker: MemoryBroker, kind: str, tmp_path: Path
) -> None:
    handled: list[str] = []
    failed_once: set[str] = set()

    def handler(body: Any) -> None:
        if body == "flaky" and body not in failed_once:
            failed_once.add(body)
            raise RuntimeError("first attempt fails")
        handled.append(body)

    async def async_handler(body: Any) -> None:
        handler(body)

    store = InMemoryStore()
    seen = _Seen()
    recorder = DeliveryRecorder(tmp_path / "records")
    options: dict[str, Any] = {"store": store, "observers": [seen, recorder]}

    def cancel(message_id: str) -> None:
        key = scoped_key(message_id, "orders", KeyScope.QUEUE)
        assert store.cancel(key, now_ms=memory_broker.now_ms).marked

    async def scenario() -> Any:
        if kind == "sync":
            consumer = memory_broker.consumer(TOPOLOGY, "orders", handler, **options)
        else:
            consumer = await memory_broker.async_consumer(
                TOPOLOGY, "orders", async_handler, **options
            )
        publisher = memory_broker.publisher(TOPOLOGY)
        cancel("early")  # cancelled before it is even published: the mark waits
        publisher.publish("early", "order.x", "5m", message_id="early")
        publisher.publish("parked", "order.x", "5m", message_id="parked")
        publisher.publish("kept", "order.x", "5m", message_id="kept")
        publisher.publish("flaky", "order.x", "1m", message_id="flaky")
        await memory_broker.advance_async("90s")  # flaky failed once: its retry waits
        assert failed_once == {"flaky"} and handled == []
        cancel("parked")
        cancel("flaky")  # cancelled while waiting in a retry tier
        await memory_broker.advance_async("1h")
        return consumer

    consumer = asyncio.run(scenario())
    recorder.close()
    assert handled == ["kept"]
    assert consumer.stats.cancelled == 3 and consumer.stats.handled == 1
    assert consumer.stats.dead_lettered == 0 and consumer.stats.retried == 1
    assert memory_broker.messages("orders.dlq") == []
    outcomes = sorted((e.message_id, e.outcome) for e in seen.events if e.outcome != "retry")
    assert outcomes == [
        ("early", "cancelled"),
        ("flaky", "cancelled"),
        ("kept", "ack"),
        ("parked", "cancelled"),
    ]
    records = [
        json.loads(line)
        for path in sorted((tmp_path / "records").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert sorted(r["message_id"] for r in records if r["outcome"] == "cancelled") == [
        "early",
        "flaky",
        "parked",
    ]


def test_the_metrics_count_cancelled_deliveries(memory_broker: MemoryBroker) -> None:
    observer = PrometheusObserver()
    store = InMemoryStore()
    memory_broker.consumer(TOPOLOGY, "orders", lambda body: None, store=store, observers=[observer])
    store.cancel(scoped_key("gone", "orders", KeyScope.QUEUE), now_ms=memory_broker.now_ms)
    memory_broker.publisher(TOPOLOGY).publish("x", "order.x", "1m", message_id="gone")
    memory_broker.advance("5m")
    value = observer.registry.get_sample_value
    assert value("delayq_cancelled_total", {"queue": "orders"}) == 1
    assert value("delayq_delivered_total", {"queue": "orders", "outcome": "cancelled"}) == 1
    assert value("delayq_duplicates_total", {"queue": "orders"}) is None
