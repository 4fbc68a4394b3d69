"""The memory broker's AMQP model: routing, TTL at the head, dead-lettering, declarations."""

from __future__ import annotations

import pytest

from delayq import Topology
from delayq.errors import (
    InvalidInput,
    PublishRejected,
    TopologyConflict,
    TopologyMissing,
    Unroutable,
)
from delayq.sync import apply_topology
from delayq.testing import MemoryBroker, broker_for, topic_matches
from delayq.topology.declarations import BindingDecl, ExchangeDecl, QueueDecl, build_declarations
from delayq.topology.report import ApplyStatus


@pytest.mark.parametrize(
    ("binding", "key", "matches"),
    [
        ("job.*", "job.email", True),
        ("job.*", "job", False),
        ("job.*", "job.email.now", False),
        ("job.#", "job", True),
        ("job.#", "job.email.now", True),
        ("#", "", True),
        ("#", "anything.at.all", True),
        ("*", "", False),
        ("", "", True),
        ("", "job", False),
        ("*.email", "email", False),
        ("#.email", "email", True),
        ("#.email", "a.b.email", True),
        ("a.#.z", "a.z", True),
        ("a.#.z", "a.b.c.z", True),
        ("a.#.z", "a.b.c", False),
        ("a.*.#", "a", False),
        ("a.*.#", "a.b", True),
        ("job.email", "job.email", True),
        ("job.email", "job.emails", False),
    ],
)
def test_topic_matching_follows_rabbitmq(binding: str, key: str, matches: bool) -> None:
    assert topic_matches(binding, key) is matches


def _broker(*decls: ExchangeDecl | QueueDecl | BindingDecl) -> MemoryBroker:
    broker = MemoryBroker()
    for decl in decls:
        broker.declare(decl)
    return broker


def test_the_default_exchange_routes_by_queue_name() -> None:
    with _broker(QueueDecl("q1"), QueueDecl("q2")) as broker:
        assert broker.publish("", "q2", b"x") == ["q2"]
        with pytest.raises(Unroutable):
            broker.publish("", "nope", b"x")
        assert broker.publish("", "nope", b"x", mandatory=False) == []


def test_a_missing_exchange_is_topology_missing() -> None:
    with MemoryBroker() as broker, pytest.raises(TopologyMissing, match="apply"):
        broker.publish("nowhere", "k", b"x")


def test_the_alternate_exchange_takes_only_what_the_own_bindings_miss() -> None:
    with _broker(
        ExchangeDecl("ae", "fanout"),
        ExchangeDecl("x", "topic", {"alternate-exchange": "ae"}),
        ExchangeDecl("empty", "topic"),
        QueueDecl("parked"),
        QueueDecl("work"),
        BindingDecl("ae", "parked"),
        BindingDecl("x", "work", "job.*"),
        # An exchange-to-exchange binding counts as a match even if nothing follows it.
        BindingDecl("x", "empty", "void.#", destination_type="exchange"),
    ) as broker:
        assert broker.publish("x", "job.a", b"1") == ["work"]
        assert broker.publish("x", "other", b"2") == ["parked"]
        with pytest.raises(Unroutable):
            broker.publish("x", "void.here", b"3")


def test_exchange_to_exchange_bindings_reach_each_queue_once() -> None:
    with _broker(
        ExchangeDecl("a", "topic"),
        ExchangeDecl("b", "fanout"),
        QueueDecl("q"),
        BindingDecl("a", "b", "#", destination_type="exchange"),
        BindingDecl("a", "q", "k"),
        BindingDecl("b", "q"),
        BindingDecl("b", "a", destination_type="exchange"),  # a cycle is harmless
    ) as broker:
        assert broker.publish("a", "k", b"x") == ["q"]
        assert broker.depth("q") == 1


def test_ttl_expires_heads_in_due_order_and_keeps_the_routing_key() -> None:
    with _broker(
        ExchangeDecl("dest", "direct"),
        QueueDecl("out"),
        BindingDecl("dest", "out", "k"),
        QueueDecl("slow", {"x-message-ttl": 5000, "x-dead-letter-exchange": "dest"}),
        QueueDecl("fast", {"x-message-ttl": 1000, "x-dead-letter-exchange": "dest"}),
    ) as broker:
        broker.publish("", "slow", b"slow", message_id="s")
        broker.publish("", "fast", b"fast", message_id="f")
        broker.advance("999ms")
        assert broker.depth("out") == 0
        broker.advance("1ms")
        assert [m.message_id for m in broker.messages("out")] == []  # key was "fast"
        assert broker.dropped[-1].reason == "expired: unroutable"
    with _broker(
        ExchangeDecl("dest", "topic"),
        QueueDecl("out"),
        BindingDecl("dest", "out", "#"),
        QueueDecl("slow", {"x-message-ttl": 5000, "x-dead-letter-exchange": "dest"}),
        QueueDecl("fast", {"x-message-ttl": 1000, "x-dead-letter-exchange": "dest"}),
    ) as broker:
        broker.publish("", "slow", b"slow", message_id="s")
        broker.publish("", "fast", b"fast", message_id="f")
        broker.publish("", "fast", b"fast2", message_id="f2")
        broker.advance("10s")
        out = broker.messages("out")
        assert [m.message_id for m in out] == ["f", "f2", "s"]
        assert [m.routing_key for m in out] == ["fast", "fast", "slow"]
        assert broker.now_ms - out[0].enqueued_at_ms == 9000  # dead-lettered at +1 s


def test_dead_letter_routing_key_and_x_death_count() -> None:
    with _broker(
        QueueDecl("dlq"),
        QueueDecl("loop", {"x-message-ttl": 100, "x-dead-letter-exchange": ""}),
        QueueDecl(
            "work",
            {
                "x-message-ttl": 100,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "loop",
            },
        ),
    ) as broker:
        broker.publish("", "work", b"x")
        broker.advance("100ms")
        [moved] = broker.messages("loop")
        assert moved.routing_key == "loop"
        assert moved.headers["x-death"][0]["queue"] == "work"
        assert moved.headers["x-first-death-queue"] == "work"
        broker.advance("100ms")  # back into "loop" by its own name, counted again
        broker.advance("100ms")
        [again] = broker.messages("loop")
        deaths = {d["queue"]: d["count"] for d in again.headers["x-death"]}
        assert deaths == {"loop": 2, "work": 1}
        assert again.headers["x-death"][0]["queue"] == "loop"  # newest first


def test_max_length_rejects_or_drops_the_head() -> None:
    with _broker(
        QueueDecl("strict", {"x-max-length": 1, "x-overflow": "reject-publish"}),
        QueueDecl("lossy", {"x-max-length": 1}),
    ) as broker:
        broker.publish("", "strict", b"1")
        with pytest.raises(PublishRejected):
            broker.publish("", "strict", b"2")
        broker.publish("", "lossy", b"1")
        broker.publish("", "lossy", b"2")
        assert [m.body for m in broker.messages("lossy")] == [b"2"]
        assert broker.dropped[-1].reason == "maxlen"


def test_applying_a_topology_declares_what_the_real_provisioning_does() -> None:
    topology = Topology(
        namespace="shop",
        ladder=["1m", "5m"],
        strategy="exact",
        destinations=[{"queue": "emails", "bindings": ["email.*"]}],
    )
    with MemoryBroker() as broker:
        report = apply_topology(topology, broker.url)
        decls = build_declarations(topology)
        assert len(report.results) == len(decls)
        names = {d.name for d in decls if not isinstance(d, BindingDecl)}
        assert names == set(broker.queues()) | set(broker.exchanges())
        again = broker.apply(topology)
        assert again.count(ApplyStatus.CREATED) == 0 and again.ok


def test_a_changed_ttl_is_a_conflict() -> None:
    with _broker(QueueDecl("q", {"x-message-ttl": 1000})) as broker:
        result = broker.declare(QueueDecl("q", {"x-message-ttl": 2000}))
        assert result.status is ApplyStatus.CONFLICT
        assert isinstance(result.conflict, TopologyConflict)
        assert result.conflict.argument == "x-message-ttl"
        assert (result.conflict.current, result.conflict.wanted) == ("1000", "2000")


def test_brokers_are_found_by_url_until_closed() -> None:
    broker = MemoryBroker("lookup-test")
    assert broker.url == "memory://lookup-test"
    assert broker_for(broker.url) is broker
    with pytest.raises(InvalidInput, match="already open"):
        MemoryBroker("lookup-test")
    broker.close()
    with pytest.raises(TopologyMissing, match="lookup-test"):
        broker_for("memory://lookup-test")


def test_advance_moves_the_clock_even_when_nothing_is_due() -> None:
    with MemoryBroker(start=0) as broker:
        broker.advance("15m")
        assert broker.now_ms == 900_000 and broker.elapsed_ms == 900_000
        assert broker.run_until_idle()
        assert broker.now_ms == 900_000


def test_an_unrouted_replay_whose_key_is_still_unbound_is_not_counted_as_replayed() -> None:
    # As `delayq unrouted replay` against RabbitMQ (tests/misuse/test_pipeline.py): the copy
    # goes round through the alternate exchange into <ns>.unrouted again.
    topology = Topology(
        namespace="park", ladder=["1m"], destinations=[{"queue": "work", "bindings": ["job.#"]}]
    )
    with MemoryBroker() as broker:
        broker.apply(topology)
        for message_id, key in (("a", "nobody.yet"), ("b", "job.bound")):
            broker.publish(topology.ready_exchange, key, b"x", message_id=message_id,
                           headers={"delayq-routing-key": key})
        assert [m.message_id for m in broker.unrouted(topology)] == ["a"]
        broker.publish(topology.unrouted, "", b"y", message_id="c",
                       headers={"delayq-routing-key": "job.late"})
        assert broker.replay_unrouted(topology) == ["c"]  # before: ["a", "c"]
        assert [m.message_id for m in broker.unrouted(topology)] == ["a"]
        assert [m.message_id for m in broker.messages("work")] == ["b", "c"]
