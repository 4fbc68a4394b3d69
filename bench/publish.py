"""Publish throughput of delayq's publishers against the raw client libraries.

What it measures (messages per second, confirmed by the broker), in one run
against one broker, so that the ratios compare like with like:

1. ``delayq.sync.Publisher.publish``, one confirmed publish at a time, vs raw
   pika: a ``BlockingConnection`` channel with ``confirm_delivery()`` and one
   ``basic_publish`` at a time.
2. ``delayq.aio.AsyncPublisher.publish_many(window=W)`` vs raw aio-pika: a
   ``publisher_confirms=True`` channel with up to ``W`` confirms in flight
   (an ``asyncio.Semaphore`` plus one task per ``exchange.publish``).
3. ``delayq.sync.Publisher.publish_many(window=W)`` (pipelined over pika's
   ``SelectConnection``) vs the raw pika single-publish figure of pair 1: the
   reason ``publish_many`` exists, so the target is a speed-up of at least 3x.

Every message goes, with ``mandatory=True`` and ``delivery_mode=2``, to the
tier exchange of a throwaway namespace (``bench<hex>``, ladder ``["1h"]``,
quorum queues as delayq declares them) with a 1 h delay, so nothing is
consumed while the benchmark runs. The raw modes send the same bytes as delayq
does: the same body, the same headers dict (taken from a message built by
``delayq.envelope.MessageFactory``), a fresh ``message_id`` per message, and
the ``content_type`` and ``timestamp`` properties delayq sets too. Building
that message (validation, headers, ids) is part of delayq's figure; it is what
the framework costs.

Fairness: every mode opens its connection and publishes a short warm-up batch
before the clock starts (``Publisher.publish_many`` opens a connection per
call by design, so its figure includes that); the tier queue is checked to
hold exactly what was confirmed and then purged after every measurement, so
each one starts from an empty queue; and the modes run ``--rounds`` times, in
reverse order every other round, with the median per mode reported.

Run it::

    python bench/publish.py                       # starts a throwaway local node
    python bench/publish.py --url amqp://guest:guest@localhost:5672/ --rounds 5
    RABBITMQ_URL=amqp://... python bench/publish.py --count 5000 --batch-count 50000

The broker is ``--url``, else ``RABBITMQ_URL``, else a node started from the
RabbitMQ server installed in ``/usr/lib/rabbitmq/bin`` with
:class:`delayq.localnode.LocalNode` (stopped and removed at the end). Progress
goes to stderr, the results table to stdout. The exit code is 0 whether or not
the targets are met; a ratio that misses its target is marked ``BELOW TARGET``.
The namespace's queues and exchanges are deleted at the end, also on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import platform
import secrets
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import version as package_version
from typing import Any

import aio_pika
import pika
import pika.exceptions as pex

from delayq import Ladder, Message, Topology, build_declarations
from delayq.aio import AsyncPublisher
from delayq.declarations import ExchangeDecl, QueueDecl
from delayq.envelope import MessageFactory
from delayq.localnode import LocalNode
from delayq.sync import Publisher, apply_topology
from delayq.urls import redact

ROUTING_KEY = "bench.publish"
DELAY = "1h"
LADDER = Ladder.parse(["1h"])
"""One tier whose TTL outlasts the run: published messages stay parked, unconsumed."""

FRAMEWORK_VS_RAW_TARGET = 0.90
PIPELINED_VS_SINGLE_TARGET = 3.00


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# Settings and shared context -------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    single_count: int
    batch_count: int
    body_bytes: int
    window: int
    rounds: int


@dataclass(frozen=True)
class Context:
    """Everything a measurement needs; built once per run."""

    url: str
    settings: Settings
    topology: Topology
    exchange: str
    """The tier exchange every message is published to."""
    queue: str
    """The tier queue behind it, which parks the messages."""
    body: bytes
    headers: dict[str, Any]
    """The headers delayq sends for this body, routing key and delay."""
    content_type: str
    timestamp_s: int

    @classmethod
    def create(cls, url: str, settings: Settings) -> Context:
        topology = Topology(namespace=f"bench{secrets.token_hex(4)}", ladder=LADDER)
        body = os.urandom(settings.body_bytes)
        sample = MessageFactory(topology).build(body, ROUTING_KEY, DELAY)
        tier = topology.ladder.select_ms(sample.receipt.delay_ms)
        assert tier is not None and sample.exchange == topology.tier_name(tier)
        return cls(
            url=url,
            settings=settings,
            topology=topology,
            exchange=sample.exchange,
            queue=topology.tier_name(tier),
            body=body,
            headers=sample.headers,
            content_type=sample.content_type,
            timestamp_s=sample.timestamp_s,
        )


def warmup_count(count: int) -> int:
    """Messages sent untimed before a measurement, on the same connection."""
    return max(1, min(count // 10, 500))


# Broker administration (short-lived blocking connections) --------------------------------


@contextlib.contextmanager
def admin_channel(url: str) -> Iterator[Any]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        yield connection.channel()
    finally:
        with contextlib.suppress(Exception):
            connection.close()


def broker_version(url: str) -> str:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        props = connection._impl.server_properties
        product, version = props.get("product", "?"), props.get("version", "?")
    finally:
        connection.close()
    as_text = [v.decode() if isinstance(v, bytes) else str(v) for v in (product, version)]
    return " ".join(as_text)


def queue_depth(url: str, queue: str) -> int:
    with admin_channel(url) as channel:
        return int(channel.queue_declare(queue, passive=True).method.message_count)


def purge(url: str, queue: str) -> None:
    with admin_channel(url) as channel:
        channel.queue_purge(queue)


def delete_namespace(url: str, topology: Topology) -> None:
    """Delete the namespace's queues, then its exchanges; missing ones are skipped."""
    declarations = build_declarations(topology)
    queues = [d.name for d in declarations if isinstance(d, QueueDecl)]
    exchanges = [d.name for d in declarations if isinstance(d, ExchangeDecl)]
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for kind, name in [("queue", q) for q in queues] + [("exchange", e) for e in exchanges]:
            try:
                if kind == "queue":
                    channel.queue_delete(name)
                else:
                    channel.exchange_delete(name)
            except pex.ChannelClosedByBroker as exc:
                log(f"  could not delete {kind} {name}: {exc.reply_text}")
                channel = connection.channel()
    finally:
        connection.close()
    log(f"deleted {len(queues)} queues and {len(exchanges)} exchanges of {topology.namespace}")


# The measurements -------------------------------------------------------------------------
# Each returns the seconds taken by ``count`` confirmed publishes, excluding the
# connection set-up and warm-up (except where the API itself connects per call).


def delayq_sync_publish(ctx: Context, count: int) -> float:
    with Publisher(ctx.url, ctx.topology) as publisher:
        publisher.connect()
        for _ in range(warmup_count(count)):
            publisher.publish(ctx.body, ROUTING_KEY, DELAY)
        start = time.perf_counter()
        for _ in range(count):
            publisher.publish(ctx.body, ROUTING_KEY, DELAY)
        return time.perf_counter() - start


def raw_pika_single(ctx: Context, count: int) -> float:
    connection = pika.BlockingConnection(pika.URLParameters(ctx.url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()

        def publish_one() -> None:
            properties = pika.BasicProperties(
                content_type=ctx.content_type,
                delivery_mode=2,
                message_id=uuid.uuid4().hex,
                timestamp=ctx.timestamp_s,
                headers=ctx.headers,
            )
            # Raises UnroutableError or NackError unless the broker confirms it.
            channel.basic_publish(ctx.exchange, ROUTING_KEY, ctx.body, properties, mandatory=True)

        for _ in range(warmup_count(count)):
            publish_one()
        start = time.perf_counter()
        for _ in range(count):
            publish_one()
        return time.perf_counter() - start
    finally:
        connection.close()


def batch_of(ctx: Context, count: int) -> list[Message]:
    return [Message(ctx.body, ROUTING_KEY, DELAY) for _ in range(count)]


def delayq_async_publish_many(ctx: Context, count: int) -> float:
    async def run() -> float:
        async with AsyncPublisher(ctx.url, ctx.topology) as publisher:
            window = ctx.settings.window
            await publisher.publish_many(batch_of(ctx, warmup_count(count)), window=window)
            batch = batch_of(ctx, count)
            start = time.perf_counter()
            receipts = await publisher.publish_many(batch, window=window)
            elapsed = time.perf_counter() - start
            assert len(receipts) == count
            return elapsed

    return asyncio.run(run())


def raw_aio_pika_pipelined(ctx: Context, count: int) -> float:
    timestamp = datetime.fromtimestamp(ctx.timestamp_s, tz=timezone.utc)

    async def run() -> float:
        connection = await aio_pika.connect(ctx.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            exchange = await channel.get_exchange(ctx.exchange, ensure=False)

            async def publish(n: int) -> None:
                slots = asyncio.Semaphore(ctx.settings.window)

                async def publish_one() -> None:
                    try:
                        # Raises on a Basic.Return or Basic.Nack.
                        await exchange.publish(
                            aio_pika.Message(
                                ctx.body,
                                headers=ctx.headers,
                                content_type=ctx.content_type,
                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                message_id=uuid.uuid4().hex,
                                timestamp=timestamp,
                            ),
                            ROUTING_KEY,
                            mandatory=True,
                        )
                    finally:
                        slots.release()

                tasks = []
                for _ in range(n):
                    await slots.acquire()
                    tasks.append(asyncio.create_task(publish_one()))
                await asyncio.gather(*tasks)

            await publish(warmup_count(count))
            start = time.perf_counter()
            await publish(count)
            return time.perf_counter() - start

    return asyncio.run(run())


def delayq_sync_publish_many(ctx: Context, count: int) -> float:
    with Publisher(ctx.url, ctx.topology) as publisher:
        window = ctx.settings.window
        publisher.publish_many(batch_of(ctx, warmup_count(count)), window=window)
        batch = batch_of(ctx, count)
        start = time.perf_counter()
        receipts = publisher.publish_many(batch, window=window)
        elapsed = time.perf_counter() - start
        assert len(receipts) == count
        return elapsed


@dataclass(frozen=True)
class Mode:
    key: str
    label: str
    run: Callable[[Context, int], float]
    pipelined: bool

    def count(self, settings: Settings) -> int:
        return settings.batch_count if self.pipelined else settings.single_count


MODES: tuple[Mode, ...] = (
    Mode("delayq-sync-publish", "delayq Publisher.publish", delayq_sync_publish, False),
    Mode("raw-pika-single", "raw pika, 1 confirm at a time", raw_pika_single, False),
    Mode(
        "delayq-async-many", "delayq AsyncPublisher.publish_many", delayq_async_publish_many, True
    ),
    Mode("raw-aio-pika", "raw aio-pika, pipelined", raw_aio_pika_pipelined, True),
    Mode("delayq-sync-many", "delayq Publisher.publish_many", delayq_sync_publish_many, True),
)
"""In an order that puts each framework mode next to its raw counterpart; odd
rounds run it reversed, so neither side of a pair always goes first."""


# Running and reporting --------------------------------------------------------------------


@dataclass
class Results:
    rates: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, rate: float) -> None:
        self.rates.setdefault(key, []).append(rate)

    def median(self, key: str) -> float:
        return statistics.median(self.rates[key])


def measure(ctx: Context, mode: Mode, label: str) -> float:
    count = mode.count(ctx.settings)
    log(f"{label} {mode.label}: {count} messages ...")
    gc.collect()
    seconds = mode.run(ctx, count)
    rate = count / seconds
    parked = queue_depth(ctx.url, ctx.queue)
    expected = count + warmup_count(count)
    if parked != expected:
        raise RuntimeError(
            f"{mode.key}: the tier queue holds {parked} messages, expected {expected}"
        )
    purge(ctx.url, ctx.queue)
    log(f"{label} {mode.label}: {count} in {seconds:.2f} s = {rate:,.0f} msg/s")
    return rate


def run_rounds(ctx: Context) -> Results:
    results = Results()
    rounds = ctx.settings.rounds
    for index in range(rounds):
        order = MODES if index % 2 == 0 else tuple(reversed(MODES))
        for mode in order:
            results.add(mode.key, measure(ctx, mode, f"[round {index + 1}/{rounds}]"))
    return results


@dataclass(frozen=True)
class Row:
    label: str
    framework: float
    raw: float
    target: float
    show_raw: bool = True

    @property
    def ratio(self) -> float:
        return self.framework / self.raw


def report(ctx: Context, results: Results, command: str, version: str) -> str:
    s = ctx.settings
    m = results.median
    rows = [
        Row(
            "sync publish (1 confirm at a time)",
            m("delayq-sync-publish"),
            m("raw-pika-single"),
            FRAMEWORK_VS_RAW_TARGET,
        ),
        Row(
            f"async publish_many (window {s.window})",
            m("delayq-async-many"),
            m("raw-aio-pika"),
            FRAMEWORK_VS_RAW_TARGET,
        ),
        Row(
            f"sync publish_many (window {s.window}) vs raw pika single",
            m("delayq-sync-many"),
            m("raw-pika-single"),
            PIPELINED_VS_SINGLE_TARGET,
        ),
    ]
    width = max(len(r.label) for r in rows) + 2
    lines = [
        f"{'mode':<{width}}{'delayq msg/s':>13}{'raw msg/s':>12}{'ratio':>8}   target",
    ]
    for row in rows:
        verdict = "" if row.ratio >= row.target else "   BELOW TARGET"
        lines.append(
            f"{row.label:<{width}}{row.framework:>13,.0f}{row.raw:>12,.0f}"
            f"{row.ratio:>8.2f}   >= {row.target:.2f}{verdict}"
        )
    lines += ["", f"per round (msg/s), median of {s.rounds}:"]
    for mode in MODES:
        rates = ", ".join(f"{r:,.0f}" for r in results.rates[mode.key])
        lines.append(f"  {mode.label:<38} {rates}  (n={mode.count(s)}, median {m(mode.key):,.0f})")
    lines += [
        "",
        f"command:   {command}",
        f"broker:    {version}, {redact(ctx.url)}",
        f"client:    Python {platform.python_version()}, pika {package_version('pika')}, "
        f"aio-pika {package_version('aio-pika')}, aiormq {package_version('aiormq')}, "
        f"delayq {package_version('delayq')}, {os.cpu_count()} CPUs",
        f"workload:  {s.body_bytes}-byte body, {ctx.topology.queue_type.value} tier queue "
        f"{ctx.queue}, {s.single_count} single / {s.batch_count} pipelined messages "
        f"per measurement, window {s.window}",
    ]
    return "\n".join(lines)


def benchmark(url: str, settings: Settings, command: str) -> None:
    version = broker_version(url)
    ctx = Context.create(url, settings)
    log(f"broker {version} at {redact(url)}; namespace {ctx.topology.namespace}")
    apply_topology(ctx.topology, url)
    try:
        results = run_rounds(ctx)
    finally:
        delete_namespace(url, ctx.topology)
    print(report(ctx, results, command, version), flush=True)


# Command line -----------------------------------------------------------------------------


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/publish.py",
        description="Publish throughput of delayq's publishers against raw pika and aio-pika.",
    )
    parser.add_argument("--url", help="broker URL (default: $RABBITMQ_URL, else a local node)")
    parser.add_argument(
        "--count",
        type=positive_int,
        default=3000,
        help="messages per single-publish measurement (default 3000)",
    )
    parser.add_argument(
        "--batch-count",
        type=positive_int,
        default=20000,
        help="messages per pipelined measurement (default 20000)",
    )
    parser.add_argument(
        "--body-bytes", type=positive_int, default=256, help="body size in bytes (default 256)"
    )
    parser.add_argument(
        "--window",
        type=positive_int,
        default=1000,
        help="unconfirmed messages in flight for pipelined modes (default 1000)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=3,
        help="rounds, alternating the order of modes; medians are reported",
    )
    return parser.parse_args(argv)


def command_line(argv: Sequence[str]) -> str:
    """How this run was started, with any password in a URL redacted."""
    shown = [redact(arg) if "://" in arg else arg for arg in argv]
    return shlex.join(["python", sys.argv[0], *shown])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    settings = Settings(
        single_count=args.count,
        batch_count=args.batch_count,
        body_bytes=args.body_bytes,
        window=args.window,
        rounds=args.rounds,
    )
    command = command_line(argv)
    url = args.url or os.environ.get("RABBITMQ_URL")
    if url:
        benchmark(url, settings, command)
        return 0
    log("no --url or RABBITMQ_URL: starting a local RabbitMQ node ...")
    with LocalNode() as node:
        log(f"local node {node.name} is up at {redact(node.url)}")
        benchmark(node.url, settings, command)
        log("stopping the local node ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
