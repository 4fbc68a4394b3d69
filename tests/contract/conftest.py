"""One facade, two brokers: the contract scenarios run on the memory broker and on RabbitMQ.

Everything a scenario does goes through the same delayq code on both sides
(``apply_topology``, ``Publisher`` / ``AsyncPublisher``, ``Consumer`` /
``AsyncConsumer`` given ``bench.url``); the facade only differs in how time
passes (the memory broker's virtual clock, or real waiting) and in how a
parked queue is peeked (the memory broker's inspection, or a raw pika
``basic.get``, independent of delayq). Real-broker variants are marked
``integration`` and fail, not skip, in CI without a broker.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pika
import pytest

from delayq import Receipt, Topology
from delayq.aio import AsyncConsumer, AsyncPublisher
from delayq.message.envelope import epoch_ms
from delayq.sync import Consumer, Publisher, apply_topology, delete_topology
from delayq.testing import MemoryBroker

KINDS = ["memory-sync", "memory-async", "rabbitmq-sync", "rabbitmq-async"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("bench") if callspec is not None else None
        if isinstance(kind, str) and kind.startswith("rabbitmq"):
            item.add_marker(pytest.mark.integration)


@dataclass(frozen=True)
class Parked:
    """A message found in a DLQ or the unrouted queue, as the broker holds it."""

    message_id: str | None
    routing_key: str
    headers: dict[str, Any]
    body: bytes


class Bench(Protocol):
    kind: str
    url: str
    slack_ms: int
    """How late past its tier a message may arrive here (0 on virtual time)."""

    def topology(self, ladder: tuple[str, ...] = ..., **kwargs: Any) -> Topology: ...
    def apply(self, topology: Topology) -> None: ...
    def publish(self, topology: Topology, *args: Any, **kwargs: Any) -> Receipt: ...
    def publisher(self, topology: Topology, **options: Any) -> BenchPublisher:
        """A publisher of its own (``store=``: the consumers' store, to cancel with)."""

    def consume(
        self, topology: Topology, queue: str, handler: Callable[[Any], Any], **kwargs: Any
    ) -> Any: ...
    def now_ms(self) -> int: ...
    def run_until(self, done: Callable[[], bool], within: str) -> bool: ...
    def settle(self, quiet_s: float) -> None: ...
    def peek(self, queue: str) -> list[Parked]: ...
    def publish_raw(self, queue: str, body: bytes, message_id: str, expiration_ms: int) -> None:
        """Straight into ``queue`` (default exchange) with a per-message TTL, no delayq."""

    def close(self) -> None: ...


def _unique_namespace() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


def _topology(ladder: tuple[str, ...], **kwargs: Any) -> Topology:
    ns = _unique_namespace()
    destinations = kwargs.pop("destinations", None)
    if destinations is None:
        destinations = [{"queue": f"{ns}.work", "bindings": ["job.#"]}]
    else:
        destinations = [{**d, "queue": f"{ns}.{d['queue']}"} for d in destinations]
    return Topology(namespace=ns, ladder=list(ladder), destinations=destinations, **kwargs)


class BenchPublisher:
    """A bench's ``Publisher`` or ``AsyncPublisher``, called alike: each method runs to
    its end (an async one on the bench's loop) and returns what the publisher returns."""

    def __init__(self, bench: _Base, publisher: Any) -> None:
        self._bench, self.publisher = bench, publisher

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.publisher, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            return self._bench.run(result) if self._bench.asynchronous else result

        return call


class _Base:
    kind = ""
    url = ""
    slack_ms = 0

    def __init__(self, asynchronous: bool) -> None:
        self.asynchronous = asynchronous
        self.loop = asyncio.new_event_loop() if asynchronous else None
        self.made: list[Topology] = []
        self.publishers: dict[str, Any] = {}
        self.consumers: list[Any] = []

    def run(self, coro: Any) -> Any:
        assert self.loop is not None
        return self.loop.run_until_complete(coro)

    def topology(self, ladder: tuple[str, ...] = ("1s", "2s", "4s"), **kwargs: Any) -> Topology:
        topology = _topology(ladder, **kwargs)
        self.made.append(topology)
        return topology

    def apply(self, topology: Topology) -> None:
        apply_topology(topology, self.url)

    def publish(self, topology: Topology, *args: Any, **kwargs: Any) -> Receipt:
        pub = self.publishers.get(topology.namespace)
        if pub is None:
            factory = AsyncPublisher if self.asynchronous else Publisher
            pub = self.publishers[topology.namespace] = factory(self.url, topology)
        if self.asynchronous:
            receipt: Receipt = self.run(pub.publish(*args, **kwargs))
            return receipt
        result: Receipt = pub.publish(*args, **kwargs)
        return result

    def publisher(self, topology: Topology, **options: Any) -> BenchPublisher:
        factory = AsyncPublisher if self.asynchronous else Publisher
        made = factory(self.url, topology, **options)
        self.publishers[f"{topology.namespace}#{len(self.publishers)}"] = made
        return BenchPublisher(self, made)


class MemoryBench(_Base):
    slack_ms = 0

    def __init__(self, asynchronous: bool) -> None:
        super().__init__(asynchronous)
        self.kind = f"memory-{'async' if asynchronous else 'sync'}"
        self.broker = MemoryBroker()
        self.url = self.broker.url

    def consume(
        self, topology: Topology, queue: str, handler: Callable[[Any], Any], **kwargs: Any
    ) -> Any:
        if self.asynchronous:

            async def async_handler(body: Any) -> Any:
                return handler(body)

            consumer: Any = AsyncConsumer(self.url, topology, queue, async_handler, **kwargs)
            self.run(consumer.start())
        else:
            consumer = Consumer(self.url, topology, queue, handler, **kwargs)
            consumer.start()
        self.consumers.append(consumer)
        return consumer

    def now_ms(self) -> int:
        return self.broker.now_ms

    def run_until(self, done: Callable[[], bool], within: str) -> bool:
        if self.asynchronous:
            return bool(self.run(self.broker.run_until_async(done, max=within)))
        return self.broker.run_until(done, max=within)

    def settle(self, quiet_s: float) -> None:
        if self.asynchronous:
            self.run(self.broker.advance_async(f"{int(quiet_s * 1000)}ms"))
        else:
            self.broker.advance(f"{int(quiet_s * 1000)}ms")

    def publish_raw(self, queue: str, body: bytes, message_id: str, expiration_ms: int) -> None:
        self.broker.publish("", queue, body, message_id=message_id, expiration_ms=expiration_ms)

    def peek(self, queue: str) -> list[Parked]:
        return [
            Parked(m.message_id, m.routing_key, dict(m.headers), m.body)
            for m in self.broker.messages(queue)
        ]

    def close(self) -> None:
        for consumer in self.consumers:
            if self.asynchronous:
                self.run(consumer.stop())
            else:
                consumer.close()
        if self.loop is not None:
            self.loop.close()
        self.broker.close()


class RabbitBench(_Base):
    slack_ms = 5000

    def __init__(self, url: str, asynchronous: bool) -> None:
        super().__init__(asynchronous)
        self.kind = f"rabbitmq-{'async' if asynchronous else 'sync'}"
        self.url = url
        self.threads: list[threading.Thread] = []
        self.async_thread: threading.Thread | None = None
        if self.loop is not None:
            # Async consumers live on this loop, run by a thread, as in an application.
            self.async_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self.async_thread.start()

    def run(self, coro: Any) -> Any:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def consume(
        self, topology: Topology, queue: str, handler: Callable[[Any], Any], **kwargs: Any
    ) -> Any:
        if self.asynchronous:

            async def async_handler(body: Any) -> Any:
                return handler(body)

            async def start() -> AsyncConsumer:
                consumer = AsyncConsumer(self.url, topology, queue, async_handler, **kwargs)
                await consumer.start()
                return consumer

            started: Any = self.run(start())
            self.consumers.append(started)
            return started
        consumer = Consumer(self.url, topology, queue, handler, **kwargs)
        consumer.start()
        thread = threading.Thread(
            target=consumer.run, kwargs={"install_signal_handlers": False}, daemon=True
        )
        thread.start()
        self.threads.append(thread)
        self.consumers.append(consumer)
        return consumer

    def now_ms(self) -> int:
        return epoch_ms()

    def run_until(self, done: Callable[[], bool], within: str) -> bool:
        from delayq.durations import to_ms

        deadline = time.monotonic() + to_ms(within) / 1000
        while time.monotonic() < deadline:
            if done():
                return True
            time.sleep(0.02)
        return done()

    def settle(self, quiet_s: float) -> None:
        time.sleep(quiet_s)

    def publish_raw(self, queue: str, body: bytes, message_id: str, expiration_ms: int) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            properties = pika.BasicProperties(
                message_id=message_id, expiration=str(expiration_ms), delivery_mode=2
            )
            channel.basic_publish("", queue, body, properties, mandatory=True)
        finally:
            connection.close()

    def peek(self, queue: str) -> list[Parked]:
        """Raw ``basic.get`` without acks; closing the channel puts them all back."""
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            channel = connection.channel()
            found = []
            while True:
                method, props, body = channel.basic_get(queue, auto_ack=False)
                if method is None:
                    break
                found.append(
                    Parked(props.message_id, method.routing_key, dict(props.headers or {}), body)
                )
            return found
        finally:
            connection.close()

    def close(self) -> None:
        for pub in self.publishers.values():
            if self.asynchronous:
                self.run(pub.aclose())
            else:
                pub.close()
        for consumer in self.consumers:
            if self.asynchronous:
                self.run(consumer.stop())
            else:
                consumer.request_stop()
        for thread in self.threads:
            thread.join(10)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            if self.async_thread is not None:
                self.async_thread.join(10)
            self.loop.close()
        for topology in self.made:
            try:
                delete_topology(topology, self.url)
            except Exception:
                pass


@pytest.fixture(params=KINDS)
def bench(request: pytest.FixtureRequest) -> Iterator[Bench]:
    """The broker a contract scenario runs on: memory (virtual time) or RabbitMQ."""
    kind = str(request.param)
    asynchronous = kind.endswith("async")
    made: Bench
    if kind.startswith("memory"):
        made = MemoryBench(asynchronous)
    else:
        made = RabbitBench(request.getfixturevalue("rabbitmq_url"), asynchronous)
    try:
        yield made
    finally:
        made.close()
