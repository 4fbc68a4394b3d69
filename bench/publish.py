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
``delayq.message.factory.MessageFactory``), a fresh ``message_id`` per message, and
the ``content_type`` and ``timestamp`` properties delayq sets too. Building
that message (validation, headers, ids) is part of delayq's figure; it is what
the framework costs.

Fairness: every mode opens its connection and publishes a short warm-up batch
before the clock starts (``Publisher.publish_many`` opens a connection per
call by design, so its figure includes that); the tier queue is checked to
hold exactly what was confirmed and then purged after every measurement, so
each one starts from an empty queue. The two single-publish modes are bound by
the round trip to the broker, which drifts with the load on the machine, so
they run together on two open connections, taking turns every 100 publishes.
Everything runs ``--rounds`` times, in reverse order every other round, and the
table shows the median per mode.

Besides msg/s, the report shows the client's CPU time per message (this
process's ``time.process_time``): it moves much less than wall-clock time on a
busy machine and is what the framework itself adds. On a shared machine, look
at the per-round figures and the load average before trusting a ratio.

Run it::

    python bench/publish.py                       # starts a throwaway local node
    python bench/publish.py --url amqp://guest:guest@localhost:5672/ --rounds 5
    RABBITMQ_URL=amqp://... python bench/publish.py --count 5000 --batch-count 50000

The broker is ``--url``, else ``RABBITMQ_URL``, else a node started from the
RabbitMQ server installed in ``/usr/lib/rabbitmq/bin`` with
:class:`delayq.local.node.LocalNode` (stopped and removed at the end). Progress
goes to stderr, the results table to stdout. The exit code is 0 whether or not
the targets are met; a ratio that misses its target is marked ``BELOW TARGET``.
The namespace's queues and exchanges are deleted at the end, also on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import secrets
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import version as package_version
from typing import Any

import aio_pika
import pika
import pika.exceptions as pex
from benchlib import (
    broker,
    broker_version,
    command_line,
    load_average,
    log,
    positive_int,
    purge,
    queue_depth,
)

from delayq import Ladder, Message, Topology, build_declarations
from delayq.aio import AsyncPublisher
from delayq.message.factory import MessageFactory
from delayq.sync import Publisher, apply_topology
from delayq.topology.declarations import ExchangeDecl, QueueDecl
from delayq.urls import redact

ROUTING_KEY = "bench.publish"
DELAY = "1h"
LADDER = Ladder.parse(["1h"])
"""One tier whose TTL outlasts the run: published messages stay parked, unconsumed."""

FRAMEWORK_VS_RAW_TARGET = 0.90
PIPELINED_VS_SINGLE_TARGET = 3.00


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
        # No destination: the messages park in the 1 h tier; the key is declared bound
        # elsewhere so the publisher's routing check lets it through.
        topology = Topology(
            namespace=f"bench{secrets.token_hex(4)}", ladder=LADDER, external_bindings=[ROUTING_KEY]
        )
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


# Timing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds and this process's CPU seconds (the client's own work)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0

    def __add__(self, other: Timing) -> Timing:
        return Timing(self.wall_s + other.wall_s, self.cpu_s + other.cpu_s)


class Stopwatch:
    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()

    def read(self) -> Timing:
        return Timing(time.perf_counter() - self._wall, time.process_time() - self._cpu)


# The measurements -------------------------------------------------------------------------
# Each times ``count`` confirmed publishes after the connection is open and a
# warm-up batch is sent (``Publisher.publish_many`` connects per call by design,
# so its figure includes that).

SYNC_PUBLISH = "delayq-sync-publish"
RAW_PIKA_SINGLE = "raw-pika-single"
ASYNC_MANY = "delayq-async-many"
RAW_AIO_PIPELINED = "raw-aio-pika"
SYNC_MANY = "delayq-sync-many"

LABELS = {
    SYNC_PUBLISH: "delayq Publisher.publish",
    RAW_PIKA_SINGLE: "raw pika, 1 confirm at a time",
    ASYNC_MANY: "delayq AsyncPublisher.publish_many",
    RAW_AIO_PIPELINED: "raw aio-pika, pipelined",
    SYNC_MANY: "delayq Publisher.publish_many",
}

BLOCK = 100
"""Publishes per turn when the two single-publish modes take turns (about 50 ms)."""


def raw_pika_publish(ctx: Context, channel: Any) -> None:
    properties = pika.BasicProperties(
        content_type=ctx.content_type,
        delivery_mode=2,
        message_id=uuid.uuid4().hex,
        timestamp=ctx.timestamp_s,
        headers=ctx.headers,
    )
    # On a confirm_delivery() channel this waits for the confirm, and raises
    # UnroutableError or NackError unless the broker took the message.
    channel.basic_publish(ctx.exchange, ROUTING_KEY, ctx.body, properties, mandatory=True)


def single_publish_pair(ctx: Context, framework_first: bool) -> dict[str, Timing]:
    """``Publisher.publish`` and raw pika on two open connections, taking turns.

    One confirm at a time is bound by the round trip to the broker, which
    drifts with the load on the machine; alternating blocks of ``BLOCK``
    publishes exposes both sides to the same conditions.
    """
    count = ctx.settings.single_count
    connection = pika.BlockingConnection(pika.URLParameters(ctx.url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        with Publisher(ctx.url, ctx.topology) as publisher:
            publisher.connect()
            senders: dict[str, Callable[[], object]] = {
                SYNC_PUBLISH: lambda: publisher.publish(ctx.body, ROUTING_KEY, DELAY),
                RAW_PIKA_SINGLE: lambda: raw_pika_publish(ctx, channel),
            }
            order = list(senders) if framework_first else list(reversed(senders))
            for key in order:
                for _ in range(warmup_count(count)):
                    senders[key]()
            totals = {key: Timing() for key in order}
            for done in range(0, count, BLOCK):
                block = min(BLOCK, count - done)
                for key in order:
                    send = senders[key]
                    watch = Stopwatch()
                    for _ in range(block):
                        send()
                    totals[key] += watch.read()
            return totals
    finally:
        connection.close()


def batch_of(ctx: Context, count: int) -> list[Message]:
    return [Message(ctx.body, ROUTING_KEY, DELAY) for _ in range(count)]


def delayq_async_publish_many(ctx: Context) -> Timing:
    count, window = ctx.settings.batch_count, ctx.settings.window

    async def run() -> Timing:
        async with AsyncPublisher(ctx.url, ctx.topology) as publisher:
            await publisher.publish_many(batch_of(ctx, warmup_count(count)), window=window)
            batch = batch_of(ctx, count)
            watch = Stopwatch()
            receipts = await publisher.publish_many(batch, window=window)
            timing = watch.read()
            assert len(receipts) == count
            return timing

    return asyncio.run(run())


def raw_aio_pika_pipelined(ctx: Context) -> Timing:
    count, window = ctx.settings.batch_count, ctx.settings.window
    timestamp = datetime.fromtimestamp(ctx.timestamp_s, tz=timezone.utc)

    async def run() -> Timing:
        connection = await aio_pika.connect(ctx.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            exchange = await channel.get_exchange(ctx.exchange, ensure=False)

            async def publish(n: int) -> None:
                slots = asyncio.Semaphore(window)

                async def publish_one() -> None:
                    try:
                        # Waits for the confirm; raises on a Basic.Return or Basic.Nack.
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
            watch = Stopwatch()
            await publish(count)
            return watch.read()

    return asyncio.run(run())


def delayq_sync_publish_many(ctx: Context) -> Timing:
    count, window = ctx.settings.batch_count, ctx.settings.window
    with Publisher(ctx.url, ctx.topology) as publisher:
        publisher.publish_many(batch_of(ctx, warmup_count(count)), window=window)
        batch = batch_of(ctx, count)
        watch = Stopwatch()
        receipts = publisher.publish_many(batch, window=window)
        timing = watch.read()
        assert len(receipts) == count
        return timing


@dataclass(frozen=True)
class Step:
    """One measurement of a round: one mode, or the two single-publish modes together."""

    keys: tuple[str, ...]
    pipelined: bool
    run: Callable[[Context, bool], dict[str, Timing]]
    """Called with the context and whether framework modes go first."""

    def count(self, settings: Settings) -> int:
        return settings.batch_count if self.pipelined else settings.single_count


def pipelined(key: str, measure: Callable[[Context], Timing]) -> Step:
    return Step((key,), True, lambda ctx, _framework_first: {key: measure(ctx)})


STEPS: tuple[Step, ...] = (
    Step((SYNC_PUBLISH, RAW_PIKA_SINGLE), False, single_publish_pair),
    pipelined(ASYNC_MANY, delayq_async_publish_many),
    pipelined(RAW_AIO_PIPELINED, raw_aio_pika_pipelined),
    pipelined(SYNC_MANY, delayq_sync_publish_many),
)
"""Even rounds run these in this order, framework first; odd rounds reversed."""


# Running and reporting --------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    rate: float
    """Confirmed messages per second."""
    cpu_us: float
    """Client CPU microseconds per message."""


@dataclass
class Results:
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def add(self, key: str, sample: Sample) -> None:
        self.samples.setdefault(key, []).append(sample)

    def rate(self, key: str) -> float:
        return statistics.median(s.rate for s in self.samples[key])

    def cpu_us(self, key: str) -> float:
        return statistics.median(s.cpu_us for s in self.samples[key])


def run_step(
    ctx: Context, results: Results, step: Step, framework_first: bool, prefix: str
) -> None:
    count = step.count(ctx.settings)
    names = " + ".join(LABELS[k] for k in step.keys)
    log(f"{prefix} {names}: {count} messages each ...")
    gc.collect()
    timings = step.run(ctx, framework_first)
    parked = queue_depth(ctx.url, ctx.queue)
    expected = len(step.keys) * (count + warmup_count(count))
    if parked != expected:
        raise RuntimeError(f"the tier queue holds {parked} messages, expected {expected}")
    purge(ctx.url, ctx.queue)
    for key, timing in timings.items():
        sample = Sample(count / timing.wall_s, timing.cpu_s / count * 1e6)
        results.add(key, sample)
        log(
            f"{prefix} {LABELS[key]}: {count} in {timing.wall_s:.2f} s = "
            f"{sample.rate:,.0f} msg/s, client CPU {sample.cpu_us:.0f} us/msg"
        )


def run_rounds(ctx: Context) -> Results:
    results = Results()
    rounds = ctx.settings.rounds
    for index in range(rounds):
        framework_first = index % 2 == 0
        steps = STEPS if framework_first else tuple(reversed(STEPS))
        for step in steps:
            prefix = f"[round {index + 1}/{rounds}]"
            run_step(ctx, results, step, framework_first, prefix)
    return results


@dataclass(frozen=True)
class Row:
    label: str
    framework: str
    raw: str
    target: float

    def ratio(self, results: Results) -> float:
        return results.rate(self.framework) / results.rate(self.raw)


def report(ctx: Context, results: Results, command: str, version: str, load: str) -> str:
    s = ctx.settings
    rows = [
        Row(
            "sync publish (1 confirm at a time)",
            SYNC_PUBLISH,
            RAW_PIKA_SINGLE,
            FRAMEWORK_VS_RAW_TARGET,
        ),
        Row(
            f"async publish_many (window {s.window})",
            ASYNC_MANY,
            RAW_AIO_PIPELINED,
            FRAMEWORK_VS_RAW_TARGET,
        ),
        Row(
            f"sync publish_many (window {s.window}) vs raw pika single",
            SYNC_MANY,
            RAW_PIKA_SINGLE,
            PIPELINED_VS_SINGLE_TARGET,
        ),
    ]
    width = max(len(r.label) for r in rows) + 2
    lines = [f"{'mode':<{width}}{'delayq msg/s':>13}{'raw msg/s':>12}{'ratio':>8}   target"]
    for row in rows:
        ratio = round(row.ratio(results), 2)  # judged as shown
        verdict = "" if ratio >= row.target else "   BELOW TARGET"
        lines.append(
            f"{row.label:<{width}}{results.rate(row.framework):>13,.0f}"
            f"{results.rate(row.raw):>12,.0f}{ratio:>8.2f}   >= {row.target:.2f}{verdict}"
        )

    lines += [
        "",
        f"per mode: msg/s in each of {s.rounds} rounds; medians of msg/s and of client CPU",
    ]
    rates = {k: ", ".join(f"{x.rate:,.0f}" for x in results.samples[k]) for k in LABELS}
    rates_width = max(len(r) for r in rates.values())
    for key, label in LABELS.items():
        lines.append(
            f"  {label:<36} {rates[key]:<{rates_width}}  median {results.rate(key):>7,.0f} msg/s, "
            f"{results.cpu_us(key):>4.0f} us CPU/msg"
        )
    lines.append("client CPU that delayq adds per message:")
    for row in rows[:2]:
        extra = results.cpu_us(row.framework) - results.cpu_us(row.raw)
        share = extra / results.cpu_us(row.raw)
        lines.append(f"  {row.label:<36} {extra:+.0f} us ({share:+.0%} of raw)")

    lines += [
        "",
        f"command:   {command}",
        f"broker:    {version}, {redact(ctx.url)}",
        f"client:    Python {platform.python_version()}, pika {package_version('pika')}, "
        f"aio-pika {package_version('aio-pika')}, aiormq {package_version('aiormq')}, "
        f"delayq {package_version('delayq')}",
        f"machine:   {platform.machine()}, {os.cpu_count()} CPUs, load average {load}",
        f"workload:  {s.body_bytes}-byte body, {ctx.topology.queue_type.value} tier queue "
        f"{ctx.queue}; {s.single_count} single / {s.batch_count} pipelined messages per "
        f"measurement, window {s.window}",
    ]
    return "\n".join(lines)


def benchmark(url: str, settings: Settings, command: str) -> None:
    version = broker_version(url)
    ctx = Context.create(url, settings)
    log(f"broker {version} at {redact(url)}; namespace {ctx.topology.namespace}")
    load_before = load_average()
    try:
        apply_topology(ctx.topology, url)
        results = run_rounds(ctx)
    finally:
        delete_namespace(url, ctx.topology)
    load = f"{load_before} before, {load_average()} after (1/5/15 min)"
    print(report(ctx, results, command, version, load), flush=True)


# Command line -----------------------------------------------------------------------------


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
    with broker(args.url) as (url, _node):
        benchmark(url, settings, command_line(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
