"""The contract: the same scenarios on the memory broker and on a real RabbitMQ.

If the memory broker drifted from RabbitMQ (routing, TTL, dead-lettering, the
alternate exchange, x-death) or from the real adapters (tier choice, retry
headers, DLQ reasons, duplicates), one side of these tests would fail.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from delayq.consume.delivery import H_DEAD_LETTER_REASON, H_ERROR_MESSAGE, H_ERROR_TYPE, Reject
from delayq.consume.retry import FixedBackoff
from delayq.message.envelope import H_ATTEMPT, H_ROUTING_KEY
from delayq.stores.memory import InMemoryStore
from delayq.topology.route import Router
from delayq.topology.topic import BindingKeys

from .conftest import Bench


@dataclass
class Recorder:
    """What a handler saw: bodies with the bench's clock (virtual or wall) at arrival."""

    bench: Bench
    fail: Any = None
    seen: list[tuple[Any, int]] = field(default_factory=list)

    def __call__(self, body: Any) -> None:
        self.seen.append((body, self.bench.now_ms()))
        if self.fail is not None:
            error = self.fail(body, len(self.seen))
            if error is not None:
                raise error

    @property
    def bodies(self) -> list[Any]:
        return [body for body, _ in self.seen]


def test_tier_choice_and_arrival_in_due_order(bench: Bench) -> None:
    topology = bench.topology(("1s", "2s", "4s"))
    queue = topology.destinations[0].queue
    recorder = Recorder(bench)
    bench.consume(topology, queue, recorder)
    receipts = {
        name: bench.publish(topology, {"name": name}, "job.run", delay)
        for name, delay in [("3s", "3s"), ("1500ms", "1500ms"), ("now", "0s"), ("1s", "1s")]
    }

    assert {name: r.tier for name, r in receipts.items()} == {
        "3s": "4s",
        "1500ms": "2s",
        "now": None,
        "1s": "1s",
    }
    assert bench.run_until(lambda: len(recorder.seen) == 4, within="20s")
    assert [b["name"] for b in recorder.bodies] == ["now", "1s", "1500ms", "3s"]
    for body, arrived_ms in recorder.seen:
        receipt = receipts[body["name"]]
        # Never early; late by at most the tier's rounding (plus the real broker's slack).
        assert arrived_ms >= receipt.published_at_ms + receipt.delay_ms
        assert arrived_ms <= receipt.published_at_ms + receipt.tier_ms + bench.slack_ms


def test_retries_then_the_dlq_after_max_attempts(bench: Bench) -> None:
    topology = bench.topology(("1s", "2s"))
    queue = topology.destinations[0].queue
    recorder = Recorder(bench, fail=lambda body, n: ValueError(f"attempt {n} failed"))
    consumer = bench.consume(
        topology, queue, recorder, policy=FixedBackoff(delay="1s", max_attempts=3)
    )
    receipt = bench.publish(topology, {"order": 7}, "job.bill", "0s")

    assert bench.run_until(lambda: len(bench.peek(f"{queue}.dlq")) == 1, within="20s")
    assert recorder.bodies == [{"order": 7}] * 3
    times = [at for _, at in recorder.seen]
    assert all(later - earlier >= 1000 for earlier, later in itertools.pairwise(times))
    [parked] = bench.peek(f"{queue}.dlq")
    assert parked.message_id == receipt.message_id
    assert parked.headers[H_DEAD_LETTER_REASON] == "exhausted"
    assert parked.headers[H_ATTEMPT] == 3
    assert parked.headers[H_ERROR_TYPE] == "builtins.ValueError"
    assert parked.headers[H_ERROR_MESSAGE] == "attempt 3 failed"
    assert parked.headers[H_ROUTING_KEY] == "job.bill"
    # The dead letter is in the DLQ before the consumer has its confirm (and counts it).
    assert bench.run_until(lambda: consumer.stats.dead_lettered == 1, within="10s")
    assert consumer.stats.retried == 2 and consumer.stats.dead_lettered == 1


def test_a_retry_goes_to_the_failing_queue_alone(bench: Bench) -> None:
    topology = bench.topology(
        ("1s", "2s"),
        destinations=[
            {"queue": "flaky", "bindings": ["job.#"]},
            {"queue": "steady", "bindings": ["job.*"]},
        ],
    )
    flaky_queue, steady_queue = (d.queue for d in topology.destinations)
    flaky = Recorder(bench, fail=lambda body, n: RuntimeError("once") if n == 1 else None)
    steady = Recorder(bench)
    bench.consume(topology, flaky_queue, flaky, policy=FixedBackoff(delay="1s", max_attempts=3))
    bench.consume(topology, steady_queue, steady)
    bench.publish(topology, "hello", "job.greet", "1s")

    assert bench.run_until(lambda: len(flaky.seen) == 2, within="20s")
    bench.settle(1.5)  # a retry leaking to the other queue would show up by now
    assert flaky.bodies == ["hello", "hello"]
    assert steady.bodies == ["hello"]
    assert bench.peek(f"{flaky_queue}.dlq") == []


def test_reject_goes_straight_to_the_dlq(bench: Bench) -> None:
    topology = bench.topology(("1s",))
    queue = topology.destinations[0].queue
    recorder = Recorder(bench, fail=lambda body, n: Reject("bad order"))
    bench.consume(topology, queue, recorder, policy=FixedBackoff(delay="1s", max_attempts=5))
    bench.publish(topology, {"order": -1}, "job.bill", "0s")

    assert bench.run_until(lambda: len(bench.peek(f"{queue}.dlq")) == 1, within="10s")
    [parked] = bench.peek(f"{queue}.dlq")
    assert parked.headers[H_DEAD_LETTER_REASON] == "non-retryable"
    assert parked.headers[H_ERROR_MESSAGE] == "bad order"
    assert len(recorder.seen) == 1


def test_unrouted_messages_are_parked_when_due(bench: Bench) -> None:
    # The topology says queues outside it bind nobody.#: the publisher sends those keys.
    topology = bench.topology(("1s", "2s"), external_bindings=["nobody.#"])
    bench.apply(topology)
    late = bench.publish(topology, {"lost": True}, "nobody.listens", "1s")
    now = bench.publish(topology, {"lost": "now"}, "nobody.at.all", "0s")

    assert bench.run_until(lambda: len(bench.peek(topology.unrouted)) == 2, within="10s")
    parked = {p.message_id: p for p in bench.peek(topology.unrouted)}
    assert parked[now.message_id].routing_key == "nobody.at.all"
    assert "x-death" not in parked[now.message_id].headers
    expired = parked[late.message_id]
    # The routing key survives dead-lettering; RabbitMQ records where it expired.
    assert expired.routing_key == "nobody.listens"
    [death] = expired.headers["x-death"]
    assert death["queue"] == f"{topology.namespace}.tier.1s"
    assert death["reason"] == "expired"
    assert death["count"] == 1
    assert list(death["routing-keys"]) == ["nobody.listens"]
    assert isinstance(death["time"], datetime)  # an AMQP timestamp, second resolution
    assert late.published_at_ms // 1000 <= death["time"].timestamp() <= bench.now_ms() / 1000


def test_duplicates_are_skipped(bench: Bench) -> None:
    topology = bench.topology(("1s",))
    queue = topology.destinations[0].queue
    recorder = Recorder(bench)
    consumer = bench.consume(topology, queue, recorder, store=InMemoryStore())
    bench.publish(topology, {"pay": 10}, "job.pay", "0s", message_id="payment-1")
    bench.publish(topology, {"pay": 10}, "job.pay", "1s", message_id="payment-1")

    assert bench.run_until(lambda: consumer.stats.duplicates == 1, within="10s")
    bench.settle(0.5)
    assert recorder.bodies == [{"pay": 10}]
    assert consumer.stats.handled == 1


def test_exact_strategy_delivers_on_the_unit(bench: Bench) -> None:
    topology = bench.topology(("1s", "4s"), strategy="exact", exact={"unit": "250ms"})
    queue = topology.destinations[0].queue
    recorder = Recorder(bench)
    bench.consume(topology, queue, recorder)
    receipt = bench.publish(topology, "tick", "job.tick", "1750ms")

    assert receipt.tier_ms == 1750 and receipt.hops == 3  # 250 + 500 + 1000
    assert bench.run_until(lambda: len(recorder.seen) == 1, within="10s")
    [(_, arrived_ms)] = recorder.seen
    assert arrived_ms >= receipt.published_at_ms + 1750
    assert arrived_ms <= receipt.published_at_ms + 1750 + bench.slack_ms


def test_expiry_happens_at_the_head_only(bench: Bench) -> None:
    """Why delayq never mixes delays in one queue: a short TTL behind a long one waits."""
    topology = bench.topology(("1s",))
    queue = topology.destinations[0].queue  # no consumer; dead-letters to its DLQ
    bench.apply(topology)
    bench.publish_raw(queue, b"long", "long", expiration_ms=2500)
    bench.publish_raw(queue, b"short", "short", expiration_ms=300)

    bench.settle(1.5)
    assert bench.peek(f"{queue}.dlq") == []  # "short" is long past its TTL, behind "long"
    assert bench.run_until(lambda: len(bench.peek(f"{queue}.dlq")) == 2, within="10s")
    parked = bench.peek(f"{queue}.dlq")
    assert [p.message_id for p in parked] == ["long", "short"]
    assert [p.headers["x-death"][0]["reason"] for p in parked] == ["expired"] * 2
    assert [p.headers["x-death"][0]["original-expiration"] for p in parked] == ["2500", "300"]
    assert parked[0].routing_key == f"{queue}.dlq"  # x-dead-letter-routing-key


TOPIC_BINDINGS = {"one": "a.*", "any": "a.#", "tail": "#.z", "mid": "*.b.*", "exact": "a.b.c"}
TOPIC_ROUTES = {
    "a": {"any"},
    "a.b": {"one", "any"},
    "a.b.c": {"any", "mid", "exact"},
    "x.b.z": {"tail", "mid"},
    "z": {"tail"},
    "a.z": {"one", "any", "tail"},
    "b": set(),
    "x.y": set(),
}


def test_topic_bindings_route_as_rabbitmq_does(bench: Bench) -> None:
    # The publishers' own check (delayq.topology.topic) agrees with the broker about every key...
    bound = BindingKeys(TOPIC_BINDINGS.values())
    assert {key for key in TOPIC_ROUTES if bound.match(key)} == {
        key for key, names in TOPIC_ROUTES.items() if names
    }
    # ...so the unbound keys are sent only as keys said to be bound elsewhere.
    unbound = [key for key, names in TOPIC_ROUTES.items() if not names]
    topology = bench.topology(
        ("1s",),
        destinations=[{"queue": name, "bindings": [key]} for name, key in TOPIC_BINDINGS.items()],
        external_bindings=unbound,
    )
    bench.apply(topology)
    for key in TOPIC_ROUTES:
        bench.publish(topology, key, key, "0s", message_id=key)
    queues = {d.queue.rsplit(".", 1)[1]: d.queue for d in topology.destinations}
    expected = sum(len(names) or 1 for names in TOPIC_ROUTES.values())

    def arrived() -> int:
        return sum(len(bench.peek(q)) for q in [*queues.values(), topology.unrouted])

    assert bench.run_until(lambda: arrived() == expected, within="10s")
    got: dict[str, set[str]] = {key: set() for key in TOPIC_ROUTES}
    for name, queue in queues.items():
        for parked in bench.peek(queue):
            got[str(parked.message_id)].add(name)
    assert got == TOPIC_ROUTES
    assert sorted(str(p.message_id) for p in bench.peek(topology.unrouted)) == ["b", "x.y"]


def test_sharded_tiers_deliver_and_retry_through_every_shard(bench: Bench) -> None:
    # shards: 3 spreads the tier (and the retry tier) over three queues by message id:
    # each publish lands in the shard the Router names, and every shard dead-letters
    # where the tier does, so every message arrives on time, retries included.
    topology = bench.topology(("1s", "2s"), shards=3)
    queue = topology.destinations[0].queue
    router = Router(topology)
    recorder = Recorder(bench, fail=lambda body, n: RuntimeError("once") if body % 2 else None)
    bench.consume(topology, queue, recorder, policy=FixedBackoff(delay="1s", max_attempts=3))
    receipts = [
        bench.publish(topology, i, "job.run", "1s", message_id=f"order-{i}") for i in range(12)
    ]

    shards = topology.tier_shards(topology.ladder.tiers[0])
    assert [r.exchange for r in receipts] == [shards[router.shard(f"order-{i}")] for i in range(12)]
    assert {r.exchange for r in receipts} == set(shards)
    assert bench.run_until(lambda: len(recorder.seen) == 18, within="30s")
    assert sorted(recorder.bodies) == sorted([*range(12), *range(1, 12, 2)])
    for body, arrived_ms in recorder.seen[:12]:
        receipt = receipts[body]
        assert arrived_ms >= receipt.published_at_ms + receipt.delay_ms
    assert bench.peek(f"{queue}.dlq") == []
