"""Shared fixtures for the integration suite: one suite, both adapters, a real broker.

``driver`` runs every test twice, once through the pika adapter and once
through aio-pika, behind the same small facade. What arrives is observed by a
raw pika consumer (``Collector``), independent of delayq's own code.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pika
import pytest
import yaml

from delayq import Message, Receipt, Topology
from delayq.aio import AsyncPublisher
from delayq.aio import apply_topology_async as apply_async
from delayq.local.node import LocalNode
from delayq.sync import Publisher, delete_topology
from delayq.sync import apply_topology as apply_sync
from delayq.topology.report import ApplyReport
from tests.topologies import throwaway_topologies


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in item.path.parts:
            item.add_marker(pytest.mark.integration)


class Driver(Protocol):
    kind: str

    def apply(self, topology: Topology, **kwargs: Any) -> ApplyReport: ...
    def publish(self, topology: Topology, *args: Any, **kwargs: Any) -> Receipt: ...
    def publish_many(self, topology: Topology, messages: list[Message]) -> list[Receipt]: ...
    def close(self) -> None: ...


class SyncDriver:
    kind = "sync"

    def __init__(self, url: str) -> None:
        self.url = url
        self._publishers: dict[str, Publisher] = {}

    def publisher(self, topology: Topology) -> Publisher:
        pub = self._publishers.get(topology.namespace)
        if pub is None:
            pub = self._publishers[topology.namespace] = Publisher(self.url, topology)
        return pub

    def apply(self, topology: Topology, **kwargs: Any) -> ApplyReport:
        return apply_sync(topology, self.url, **kwargs)

    def publish(self, topology: Topology, *args: Any, **kwargs: Any) -> Receipt:
        return self.publisher(topology).publish(*args, **kwargs)

    def publish_many(self, topology: Topology, messages: list[Message]) -> list[Receipt]:
        return self.publisher(topology).publish_many(messages)

    def close(self) -> None:
        for pub in self._publishers.values():
            pub.close()


class AsyncDriver:
    kind = "async"

    def __init__(self, url: str) -> None:
        self.url = url
        self.loop = asyncio.new_event_loop()
        self._publishers: dict[str, AsyncPublisher] = {}

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def publisher(self, topology: Topology) -> AsyncPublisher:
        pub = self._publishers.get(topology.namespace)
        if pub is None:
            pub = self._publishers[topology.namespace] = AsyncPublisher(self.url, topology)
        return pub

    def apply(self, topology: Topology, **kwargs: Any) -> ApplyReport:
        return self.run(apply_async(topology, self.url, **kwargs))  # type: ignore[no-any-return]

    def publish(self, topology: Topology, *args: Any, **kwargs: Any) -> Receipt:
        return self.run(self.publisher(topology).publish(*args, **kwargs))  # type: ignore[no-any-return]

    def publish_many(self, topology: Topology, messages: list[Message]) -> list[Receipt]:
        return self.run(self.publisher(topology).publish_many(messages))  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.loop.is_closed():
            return
        for pub in self._publishers.values():
            self.run(pub.aclose())
        self.loop.close()


@pytest.fixture(params=["sync", "async"])
def driver_kind(request: pytest.FixtureRequest) -> str:
    """Which adapter a test runs through; every test using it runs once per adapter."""
    return str(request.param)


@pytest.fixture
def driver_for(driver_kind: str) -> Iterator[Callable[[str], Driver]]:
    """Make drivers of this test's adapter for any broker URL; closed afterwards."""
    made: list[Driver] = []

    def make(url: str) -> Driver:
        drv: Driver = SyncDriver(url) if driver_kind == "sync" else AsyncDriver(url)
        made.append(drv)
        return drv

    yield make
    for drv in made:
        try:
            drv.close()
        except Exception:
            pass


@pytest.fixture
def driver(driver_for: Callable[[str], Driver], rabbitmq_url: str) -> Driver:
    return driver_for(rabbitmq_url)


@pytest.fixture
def make_topology(rabbitmq_url: str) -> Iterator[Callable[..., Topology]]:
    """Build topologies under unique namespaces; their entities are deleted afterwards."""
    with throwaway_topologies(rabbitmq_url, prefix="t", ladder=("1s", "2s", "4s", "8s")) as make:
        yield make


@dataclass
class Arrival:
    queue: str
    message_id: str
    routing_key: str
    headers: dict[str, Any]
    body: bytes
    content_type: str | None
    at_ms: float
    properties: Any = None
    """pika's ``BasicProperties`` of the delivery."""


@dataclass
class Collector:
    """A raw pika consumer thread recording every message that reaches ``queues``."""

    url: str
    queues: list[str]
    arrivals: list[Arrival] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _ready: threading.Event = field(default_factory=threading.Event)
    _error: list[BaseException] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Collector:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError(f"collector did not start: {self._error}")
        return self

    def _run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self.url))
            channel = connection.channel()
            channel.basic_qos(prefetch_count=500)
            for queue in self.queues:
                channel.basic_consume(queue, self._callback(channel, queue))
            self._ready.set()
            while not self._stop.is_set():
                connection.process_data_events(time_limit=0.05)
            connection.close()
        except BaseException as exc:
            self._error.append(exc)
            self._ready.set()

    def _callback(self, channel: Any, queue: str) -> Callable[..., None]:
        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            arrival = Arrival(
                queue=queue,
                message_id=props.message_id,
                routing_key=method.routing_key,
                headers=dict(props.headers or {}),
                body=body,
                content_type=props.content_type,
                at_ms=time.time() * 1000,
                properties=props,
            )
            with self._lock:
                self.arrivals.append(arrival)
            ch.basic_ack(method.delivery_tag)

        return on_message

    def wait(self, count: int, timeout_s: float) -> list[Arrival]:
        """Wait until ``count`` messages arrived (or the timeout passed); return them all."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._error:
                raise self._error[0]
            with self._lock:
                if len(self.arrivals) >= count:
                    break
            time.sleep(0.02)
        with self._lock:
            return list(self.arrivals)

    def wait_for_ids(self, ids: set[str], timeout_s: float) -> list[Arrival]:
        """Wait until a message of each id in ``ids`` arrived (duplicates do not count
        towards it), or the timeout passed; return every arrival."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._error:
                raise self._error[0]
            with self._lock:
                if ids <= {a.message_id for a in self.arrivals}:
                    break
            time.sleep(0.05)
        with self._lock:
            return list(self.arrivals)

    def settle(self, quiet_s: float) -> list[Arrival]:
        """Wait ``quiet_s`` more for stragglers (duplicates) and return everything."""
        time.sleep(quiet_s)
        with self._lock:
            return list(self.arrivals)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def collect(rabbitmq_url: str) -> Iterator[Callable[..., Collector]]:
    collectors: list[Collector] = []

    def start(*queues: str, url: str | None = None) -> Collector:
        collector = Collector(url or rabbitmq_url, list(queues)).start()
        collectors.append(collector)
        return collector

    yield start
    for collector in collectors:
        collector.stop()


class ConsumerHandle(Protocol):
    stats: Any

    def stop(self, timeout_s: float = 30.0) -> None: ...


class SyncConsumerHandle:
    """A delayq.sync.Consumer running in a thread of its own."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.stats = consumer.stats
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not consumer.started.wait(30):
            raise RuntimeError(f"consumer did not start: {self._error}")

    def _run(self) -> None:
        try:
            self.consumer.run(install_signal_handlers=False)
        except BaseException as exc:
            self._error.append(exc)
            self.consumer.started.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.consumer.request_stop()
        self._thread.join(timeout_s + 10)
        if self._error:
            raise self._error[0]


class AsyncConsumerHandle:
    """A delayq.aio.AsyncConsumer on an event loop running in a thread of its own."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.stats = consumer.stats
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(consumer.start(), self.loop).result(30)
        self._stopped = False

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        future = asyncio.run_coroutine_threadsafe(self.consumer.stop(timeout_s), self.loop)
        future.result(timeout_s + 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def start_consumer(driver_kind: str, rabbitmq_url: str) -> Iterator[Callable[..., ConsumerHandle]]:
    """Start a consumer of this test's adapter; every one is stopped afterwards."""
    from delayq.aio import AsyncConsumer
    from delayq.sync import Consumer

    handles: list[ConsumerHandle] = []

    def start(topology: Topology, queue: str, handler: Callable[[Any], Any], **kwargs: Any):
        url = kwargs.pop("url", rabbitmq_url)
        if driver_kind == "sync":
            handle: ConsumerHandle = SyncConsumerHandle(
                Consumer(url, topology, queue, handler, **kwargs)
            )
        else:
            handle = AsyncConsumerHandle(AsyncConsumer(url, topology, queue, handler, **kwargs))
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        try:
            handle.stop(5)
        except Exception:
            pass


@pytest.fixture
def node_topology(tmp_path: Path) -> Iterator[Callable[..., tuple[Topology, Path]]]:
    """Unique-namespace topologies written to YAML; deleted from their node afterwards."""
    made: list[tuple[Topology, str]] = []

    def make(node: LocalNode, ladder: tuple[str, ...] = ("1s", "30s")) -> tuple[Topology, Path]:
        ns = f"o{uuid.uuid4().hex[:10]}"
        topology = Topology(
            namespace=ns,
            ladder=list(ladder),
            destinations=[{"queue": f"{ns}.work", "bindings": ["job.#"]}],
        )
        path = tmp_path / f"{ns}.yaml"
        path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
        made.append((topology, node.url))
        return topology, path

    yield make
    for topology, url in made:
        try:
            delete_topology(topology, url)
        except Exception:
            pass


@pytest.fixture
def names(rabbitmq_url: str) -> Iterator[Callable[[str], str]]:
    """Unique names for a framework's queues and exchanges (``name("q")``), each deleted
    after the test with the queues a framework derives from it (Dramatiq's ``.DQ`` and
    ``.XQ``, delayq's ``.dlq``, a Celery namespace's ``.celery-parked``, and ``.a``/``.b``
    queues on ``.xa``/``.xb`` exchanges)."""
    made: list[str] = []

    def name(what: str) -> str:
        made.append(f"t{uuid.uuid4().hex[:8]}.{what}")
        return made[-1]

    yield name
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    for entity in made:
        for suffix in ("", ".DQ", ".XQ", ".dlq", ".celery-parked", ".a", ".b"):
            channel.queue_delete(entity + suffix)
        for suffix in ("", ".xa", ".xb"):
            channel.exchange_delete(entity + suffix)
    connection.close()
