"""The link seam: links chosen by URL scheme, and links brought by the user
(the import graph it keeps clean is tests/unit/test_import_graph.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import pytest

from delayq import Message, Topology
from delayq.aio import AsyncPublisher
from delayq.consume.delivery import Delivery
from delayq.errors import InvalidInput, PublishRejected, UnboundRoutingKey
from delayq.links import (
    ASYNC_LINKS,
    LINKS,
    AsyncLink,
    Link,
    LinkOptions,
    OnDelivery,
    Settle,
    gate_for,
    open_async_link,
    open_link,
    serves_amqp,
)
from delayq.message.envelope import OutgoingMessage
from delayq.observe.publishes import Published, PublishOutcome
from delayq.sync import Consumer, Publisher
from delayq.testing import MemoryBroker
from delayq.topology.report import ApplyReport

TOPOLOGY = Topology(
    namespace="ln",
    ladder=["1m", "5m"],
    destinations=[{"queue": "work", "bindings": ["job.#"]}],
)
URL = "amqp://guest:guest@127.0.0.1:1/"


class RecordingLink:
    """A user's link: keeps what it is asked to send, refuses what ``refuse`` names."""

    clock_ms: Callable[[], int] | None = None

    def __init__(self, refuse: str = "") -> None:
        self.sent: list[OutgoingMessage] = []
        self.calls: list[str] = []
        self.refuse = refuse

    def connect(self) -> None:
        self.calls.append("connect")

    def send(self, msg: OutgoingMessage) -> None:
        self.calls.append("send")
        if self.refuse and self.refuse in msg.routing_key:
            raise PublishRejected("refused on purpose", msg.message_id)
        self.sent.append(msg)

    def send_batch(self, msgs: list[OutgoingMessage], window: int) -> None:
        self.calls.append(f"send_batch/{window}")
        self.sent.extend(msgs)

    def send_stream(self, msgs: Iterable[OutgoingMessage], settle: Settle, window: int) -> None:
        self.calls.append(f"send_stream/{window}")
        for index, msg in enumerate(msgs):
            self.sent.append(msg)
            settle(index, msg, None)

    def apply(self, topology: Topology, *, raise_on_conflict: bool = True) -> ApplyReport:
        raise NotImplementedError

    def close(self) -> None:
        self.calls.append("close")


class AsyncRecordingLink:
    clock_ms: Callable[[], int] | None = None

    def __init__(self) -> None:
        self.sent: list[OutgoingMessage] = []

    async def connect(self) -> None: ...

    async def send(self, msg: OutgoingMessage) -> None:
        self.sent.append(msg)

    async def send_batch(self, msgs: list[OutgoingMessage], window: int) -> None:
        self.sent.extend(msgs)

    async def apply(self, topology: Topology, *, raise_on_conflict: bool = True) -> ApplyReport:
        raise NotImplementedError

    async def close(self) -> None: ...


class Outcomes:
    def __init__(self) -> None:
        self.seen: list[PublishOutcome] = []

    def published(self, event: Published) -> None:
        self.seen.append(event.outcome)


def test_the_registry_names_a_link_per_scheme_by_import_path() -> None:
    assert set(LINKS) == set(ASYNC_LINKS) == {"amqp", "amqps", "memory"}
    assert LINKS["amqp"] == LINKS["amqps"] == "delayq.sync._link:PikaLink"
    assert ASYNC_LINKS["memory"] == "delayq.testing.links:AsyncMemoryLink"
    assert ASYNC_LINKS["amqp"] == ASYNC_LINKS["amqps"] == "delayq.aio._framelink:FrameLink"


def test_amqp_urls_open_the_client_links_without_io() -> None:
    gate = gate_for(TOPOLOGY, URL)
    link = open_link(URL, gate, LinkOptions())
    assert type(link).__name__ == "PikaLink" and isinstance(link, Link)
    async_link = open_async_link(URL, gate, LinkOptions())
    assert type(async_link).__name__ == "FrameLink" and isinstance(async_link, AsyncLink)
    assert serves_amqp(URL) and serves_amqp("amqps://h/") and not serves_amqp("memory://x")


def test_memory_urls_open_the_memory_links(memory_broker: MemoryBroker) -> None:
    from delayq.testing.links import AsyncMemoryLink, MemoryLink

    gate = gate_for(TOPOLOGY, memory_broker.url)
    link = open_link(memory_broker.url, gate, LinkOptions())
    assert isinstance(link, MemoryLink) and link.broker is memory_broker
    assert link.clock_ms == memory_broker.clock_ms
    assert isinstance(open_async_link(memory_broker.url, gate, LinkOptions()), AsyncMemoryLink)


def test_a_link_that_cannot_be_loaded_is_a_delayq_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(LINKS, "memory", "delayq.no_such_module:Link")
    with pytest.raises(InvalidInput, match="cannot be loaded"):
        Publisher("memory://x", TOPOLOGY)


def test_a_users_link_gets_every_built_message() -> None:
    link = RecordingLink()
    publisher = Publisher(topology=TOPOLOGY, link=link)
    assert publisher.link is link
    publisher.connect()
    receipt = publisher.publish({"n": 1}, "job.a", "90s")
    assert receipt.tier == "5m"
    assert link.sent[0].message_id == receipt.message_id and link.sent[0].receipt.tier == "5m"
    publisher.publish_many([Message({"n": 2}, "job.b", "30s")], window=1)
    settled: list[int] = []
    publisher.send_many(
        [publisher.factory.build({"n": 3}, "job.c", "1m")],
        settle=lambda i, m, e: settled.append(i),
        window=7,
    )
    publisher.close()
    assert link.calls == ["connect", "send", "send_batch/1", "send_stream/7", "close"]
    assert settled == [0] and len(link.sent) == 3


def test_a_failing_link_surfaces_its_error_and_observers_see_it() -> None:
    outcomes = Outcomes()
    link = RecordingLink(refuse="job.bad")
    publisher = Publisher(topology=TOPOLOGY, link=link, observers=[outcomes])
    publisher.publish("ok", "job.good", "1m")
    with pytest.raises(PublishRejected, match="refused on purpose"):
        publisher.publish("no", "job.bad", "1m")
    assert outcomes.seen == [PublishOutcome.CONFIRMED, PublishOutcome.REJECTED]


def test_bad_input_never_reaches_the_link() -> None:
    link = RecordingLink()
    publisher = Publisher(topology=TOPOLOGY, link=link)
    with pytest.raises(InvalidInput):
        publisher.publish("x", "job.a", 90)  # a bare number: which unit?
    with pytest.raises(UnboundRoutingKey):
        publisher.publish("x", "nobody.binds.this", "1m")
    assert link.sent == []


def test_an_async_users_link() -> None:
    link = AsyncRecordingLink()

    async def run() -> None:
        publisher = AsyncPublisher(topology=TOPOLOGY, link=link)
        assert publisher.link is link
        await publisher.publish("x", "job.a", "2m")
        await publisher.publish_many([Message("y", "job.b", "1m")])
        await publisher.aclose()

    asyncio.run(run())
    assert [m.receipt.tier for m in link.sent] == ["5m", "1m"]


def test_a_users_clock_wins_over_the_links() -> None:
    link = RecordingLink()
    link.clock_ms = lambda: 5_000
    receipt = Publisher(topology=TOPOLOGY, link=link).publish("x", "job.a", "1m")
    assert receipt.published_at_ms == 5_000
    mine = Publisher(topology=TOPOLOGY, link=link, clock_ms=lambda: 9_000)
    assert mine.publish("x", "job.a", "1m").published_at_ms == 9_000


class ListSettler:
    def __init__(self, log: list[str], n: int) -> None:
        self.log, self.n = log, n

    @property
    def current(self) -> bool:
        return True

    def ack(self) -> None:
        self.log.append(f"ack {self.n}")

    def requeue(self) -> None:
        self.log.append(f"requeue {self.n}")


class ListFeed:
    """A user's inline feed: the test pushes deliveries, the consumer handles them."""

    inline = True
    consuming = True
    clock_ms: Callable[[], int] | None = None

    def __init__(self) -> None:
        self.settled: list[str] = []
        self._on_delivery: OnDelivery | None = None

    def open(self, topology: Topology, queue: str, prefetch: int, on_delivery: OnDelivery) -> None:
        self._on_delivery = on_delivery

    def push(self, n: int, body: bytes) -> None:
        assert self._on_delivery is not None
        delivery = Delivery(
            queue="work",
            body=body,
            routing_key="job.a",
            message_id=f"m{n}",
            content_type="application/json",
            headers={},
        )
        self._on_delivery(ListSettler(self.settled, n), delivery)

    def resubscribe(self, prefetch: int) -> None: ...
    def pump(self, time_limit_s: float) -> None: ...
    def unsubscribe(self) -> None: ...
    def ready(self) -> int:
        return 0

    def sleep(self, seconds: float) -> None: ...
    def wake(self) -> None: ...
    def close(self) -> None: ...


def test_a_users_feed_and_link_drive_a_consumer_with_no_broker() -> None:
    feed, link = ListFeed(), RecordingLink()
    seen: list[object] = []

    def handler(body: dict[str, int]) -> None:
        seen.append(body)
        if body["n"] == 2:
            raise RuntimeError("try later")

    consumer = Consumer(URL, TOPOLOGY, "work", handler, feed=feed, link=link)
    assert consumer.feed is feed and consumer.inline
    consumer.run()  # an inline feed: run only opens it
    feed.push(1, b'{"n": 1}')
    feed.push(2, b'{"n": 2}')
    feed.push(3, b"not json")
    assert seen == [{"n": 1}, {"n": 2}]
    assert feed.settled == ["ack 1", "ack 2", "ack 3"]  # each after its republish
    retry, dead = link.sent
    assert retry.routing_key == "work" and retry.headers["delayq-attempt"] == 2
    assert dead.routing_key == "work.dlq"
    stats = consumer.stats
    assert (stats.handled, stats.retried, stats.dead_lettered) == (1, 1, 1)
