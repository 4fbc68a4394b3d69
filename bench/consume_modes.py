"""What ``bench/consume.py`` measures: its settings, the filled queue, and each mode (the raw
aio-pika consumer and AsyncConsumer with each store), one drain each.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage
from benchlib import (
    log,
    queue_depth,
)
from pamqp import commands

from delayq import Ladder, Message, Topology
from delayq.aio import AsyncPublisher
from delayq.aio._deliveries import ack_frame
from delayq.aio._framelink import open_wire
from delayq.aio._wire import CONSUME_CHANNEL
from delayq.aio.consumer import AsyncConsumer
from delayq.message.envelope import epoch_ms
from delayq.stores.base import IdempotencyStore
from delayq.stores.memory import InMemoryStore
from delayq.stores.sqlite import SQLiteStore

ROUTING_KEY = "bench.consume"
BINDING = "bench.#"
LADDER = Ladder.parse(["1h"])
FILL_WINDOW = 1000
"""Unconfirmed messages in flight while filling the queue (untimed)."""

POLL_S = 0.002
"""How often the drain's ack count is looked at, in every mode alike."""
STALL_S = 60.0
"""A drain that makes no progress for this long fails the run."""

RAW = "raw-aio-pika"
LIMIT = "raw-frames-limit"
LIMIT_WORK = "raw-frames-work"
MEMORY = "delayq-memory"
SQLITE = "delayq-sqlite"
REDIS = "delayq-redis"
MEMORY_TRACED = "delayq-memory-traced"

LABELS = {
    RAW: "raw aio-pika consumer, ack only",
    LIMIT: "limit: raw frames, multiple acks",
    LIMIT_WORK: "the limit + --work-us of CPU a delivery",
    MEMORY: "AsyncConsumer + InMemoryStore",
    SQLITE: "AsyncConsumer + SQLiteStore",
    REDIS: "AsyncConsumer + RedisStore",
    MEMORY_TRACED: "AsyncConsumer + InMemoryStore, traced",
}
TARGETS = {MEMORY: 2.00, SQLITE: 1.50, REDIS: 1.00}
PROFILE_CHOICES = {
    "raw": RAW,
    "limit": LIMIT,
    "limit-work": LIMIT_WORK,
    "memory": MEMORY,
    "sqlite": SQLITE,
    "redis": REDIS,
}


# Settings and shared context -------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    count: int
    body_bytes: int
    prefetch: int
    limit_prefetch: int
    """The physical limit's prefetch (high: the broker never waits for an ack)."""
    modes: frozenset[str]
    """The modes to run besides their raw client (empty: all)."""
    rounds: int
    sqlite_dir: Path
    work_us: float = 10.0
    """Client CPU a delivery the ``raw-frames-work`` mode spends (``--work-us``)."""


@dataclass(frozen=True)
class Context:
    """Everything a measurement needs; built once per run."""

    url: str
    settings: Settings
    topology: Topology
    queue: str
    """The destination queue every measurement drains."""
    dlq: str
    body: bytes
    redis_url: str | None
    redis_class: Any
    """``delayq.stores.redis.RedisStore``, or ``None`` when Redis is skipped."""
    tracing: Any = None
    """The tracer provider of the traced mode (``--tracing``), else ``None``."""

    @classmethod
    def create(
        cls,
        url: str,
        settings: Settings,
        redis_url: str | None,
        redis_class: Any,
        tracing: Any = None,
    ) -> Context:
        namespace = f"bench{secrets.token_hex(4)}"
        queue = f"{namespace}.consume"  # destination names are global: keep it unique
        topology = Topology(
            namespace=namespace,
            ladder=LADDER,
            destinations=[{"queue": queue, "bindings": [BINDING]}],
        )
        return cls(
            url=url,
            settings=settings,
            topology=topology,
            queue=queue,
            dlq=topology.destination(queue).dlq,
            body=os.urandom(settings.body_bytes),
            redis_url=redis_url,
            redis_class=redis_class,
            tracing=tracing,
        )


# Broker administration (short-lived blocking connections) --------------------------------


def expect_depth(ctx: Context, queue: str, expected: int, when: str) -> None:
    # Checked a few times over a second: a quorum queue's count can trail the
    # last confirm or ack by a moment; a lasting difference is an error.
    depth = queue_depth(ctx.url, queue)
    for _ in range(10):
        if depth == expected:
            return
        time.sleep(0.1)
        depth = queue_depth(ctx.url, queue)
    if depth != expected:
        raise RuntimeError(f"{when}: queue {queue} holds {depth} messages, expected {expected}")


def fill(ctx: Context, traced: bool = False) -> float:
    """Publish exactly ``count`` immediate messages to the destination; returns seconds.
    ``traced``: published with tracing on, so each carries a context to extract."""
    count = ctx.settings.count
    message = Message(ctx.body, ROUTING_KEY, "0s")  # a fresh message id for each copy
    tracing = ctx.tracing if traced else None

    async def run() -> None:
        async with AsyncPublisher(ctx.url, ctx.topology, tracing=tracing) as publisher:
            receipts = await publisher.publish_many([message] * count, window=FILL_WINDOW)
        assert len(receipts) == count and receipts[0].exchange == ctx.topology.ready_exchange

    expect_depth(ctx, ctx.queue, 0, "before filling")
    started = time.perf_counter()
    asyncio.run(run())
    elapsed = time.perf_counter() - started
    expect_depth(ctx, ctx.queue, count, "after filling")
    return elapsed


# Timing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds and this process's CPU seconds (the client's own work)."""

    wall_s: float
    cpu_s: float


class Drain:
    """The clock of one drain: started by the first delivery, read when all are acked."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._wall: float | None = None
        self._cpu = 0.0

    def first_delivery(self) -> None:
        if self._wall is None:
            self._wall = time.perf_counter()
            self._cpu = time.process_time()

    async def wait(self, acked: Callable[[], int]) -> Timing:
        """Poll ``acked()`` every ``POLL_S`` until it reaches ``count``; fail on a stall."""
        seen, progress_at = -1, time.monotonic()
        while True:
            done = acked()
            if done >= self.count:
                wall, cpu = time.perf_counter(), time.process_time()
                break
            now = time.monotonic()
            if done != seen:
                seen, progress_at = done, now
            elif now - progress_at > STALL_S:
                raise RuntimeError(f"no progress for {STALL_S:.0f} s: {done} of {self.count} acked")
            await asyncio.sleep(POLL_S)
        if done != self.count:
            raise RuntimeError(f"{done} messages acked, expected {self.count}")
        assert self._wall is not None
        return Timing(wall - self._wall, cpu - self._cpu)


# The measurements -------------------------------------------------------------------------


def raw_aio_pika(ctx: Context) -> Timing:
    count, prefetch = ctx.settings.count, ctx.settings.prefetch

    async def run() -> Timing:
        drain = Drain(count)
        acked = 0

        async def on_message(message: AbstractIncomingMessage) -> None:
            nonlocal acked
            drain.first_delivery()
            await message.ack()
            acked += 1

        connection = await aio_pika.connect(ctx.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=False)
            await channel.set_qos(prefetch_count=prefetch)
            queue = await channel.get_queue(ctx.queue, ensure=False)
            tag = await queue.consume(on_message, no_ack=False)
            timing = await drain.wait(lambda: acked)
            await queue.cancel(tag)
        return timing

    return asyncio.run(run())


class BatchAcks:
    """A raw reader's acks: one ``basic.ack(multiple=True)`` for everything received once
    ``batch`` deliveries are, or 10 ms after the first (the raw modes' least work)."""

    def __init__(self, wire: Any, batch: int) -> None:
        self.wire, self.batch = wire, batch
        self.loop = asyncio.get_running_loop()
        self.acked = self.last_tag = self.pending = 0
        self.timer: asyncio.TimerHandle | None = None

    def received(self, tag: int) -> None:
        self.last_tag = tag
        self.pending += 1
        if self.pending >= self.batch:
            self.flush()
        elif self.timer is None:
            self.timer = self.loop.call_later(0.01, self.flush)

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.pending:
            self.wire.send_frames(ack_frame(CONSUME_CHANNEL, self.last_tag, True))
            self.acked += self.pending
            self.pending = 0

    def cancelled(self, consumer_tag: str) -> None:
        pass

    def closed(self, exc: Exception) -> None:
        pass


def spin(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time (a client's own work: no sleep, no I/O)."""
    end = time.thread_time() + seconds  # CPU time: a spin preempted still spends it all
    while time.thread_time() < end:
        pass


def raw_frames_limit(ctx: Context, work_us: float = 0.0) -> Timing:
    """What consuming costs at the least, in Python: delayq's own AMQP wire with a reader
    that takes only the delivery tag of each ``Basic.Deliver`` frame (header and body
    frames ignored, nothing decoded, no task, no message object), a high prefetch, and
    one ``basic.ack(multiple=True)`` for everything received, once a quarter of the
    prefetch is received or 10 ms after the first (no handler, no bookkeeping, nothing
    that could fail). With ``work_us``, the same reader spends that much CPU a delivery
    (a busy loop) as it takes the tag: what a consumer's own work costs the rate when
    it and the broker share the machine's cores."""
    count, prefetch = ctx.settings.count, ctx.settings.limit_prefetch
    work_s = work_us / 1e6
    batch = max(1, prefetch // 4)

    async def run() -> Timing:
        drain = Drain(count)
        wire = await open_wire(ctx.url, attempts=3, name="bench limit", publish=False)

        class Reader(BatchAcks):
            def content(self, kind: int, payload: bytes) -> None:
                if kind != 1:
                    return  # a header or a body: not even looked at
                drain.first_delivery()
                if work_s:
                    spin(work_s)
                self.received(int.from_bytes(payload[5 + payload[4] : 13 + payload[4]], "big"))

        reader = Reader(wire, batch)
        try:
            await wire.open_channel(CONSUME_CHANNEL)
            wire.readers[CONSUME_CHANNEL] = reader
            await wire.call(
                CONSUME_CHANNEL, commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk
            )
            ok = await wire.call(
                CONSUME_CHANNEL, commands.Basic.Consume(queue=ctx.queue), commands.Basic.ConsumeOk
            )
            timing = await drain.wait(lambda: reader.acked)
            await wire.call(
                CONSUME_CHANNEL,
                commands.Basic.Cancel(consumer_tag=ok.consumer_tag),
                commands.Basic.CancelOk,
            )
        finally:
            await wire.close()
        return timing

    return asyncio.run(run())


def raw_frames_working(ctx: Context) -> Timing:
    """:func:`raw_frames_limit` spending ``--work-us`` of client CPU a delivery."""
    return raw_frames_limit(ctx, ctx.settings.work_us)


def async_consumer(
    ctx: Context, make_store: Callable[[], IdempotencyStore], tracing: Any = None
) -> Timing:
    count, prefetch = ctx.settings.count, ctx.settings.prefetch

    async def run(store: IdempotencyStore) -> Timing:
        drain = Drain(count)

        async def handler(_value: object) -> None:
            drain.first_delivery()

        consumer = AsyncConsumer(
            ctx.url,
            ctx.topology,
            ctx.queue,
            handler,
            store=store,
            prefetch=prefetch,
            tracing=tracing,  # untraced: the default (no global provider is set)
        )
        await consumer.start()
        try:
            timing = await drain.wait(lambda: consumer.stats.handled)
        finally:
            await consumer.stop()
        acks = consumer._acks  # how well acks coalesced (a diagnostic, not a figure)
        log(f"  acks: {acks.frames} frames for {acks.settled} deliveries")
        batcher = consumer._store
        if batcher is not None and batcher.batches:
            log(f"  store: {batcher.ops} calls in {batcher.batches} batches")
        stats = consumer.stats
        if (stats.handled, stats.duplicates, stats.retried, stats.dead_lettered) != (
            count,
            0,
            0,
            0,
        ) or stats.returned:
            raise RuntimeError(f"AsyncConsumer ended with {stats}, expected {count} handled")
        return timing

    store = make_store()
    try:
        return asyncio.run(run(store))
    finally:
        # Forget this drain's keys (a Redis store's live under this run's prefix only).
        with contextlib.suppress(Exception):
            store.prune(older_than_ms=epoch_ms() + 3_600_000)
        store.close()


def delayq_memory(ctx: Context) -> Timing:
    return async_consumer(ctx, InMemoryStore)


def delayq_memory_traced(ctx: Context) -> Timing:
    return async_consumer(ctx, InMemoryStore, tracing=ctx.tracing)


def delayq_sqlite(ctx: Context) -> Timing:
    folder = Path(tempfile.mkdtemp(prefix="delayq-bench-", dir=ctx.settings.sqlite_dir))
    try:
        return async_consumer(ctx, lambda: SQLiteStore(folder / "keys.db"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def make_redis_store(cls: Any, url: str, prefix: str) -> IdempotencyStore:
    """A ``RedisStore`` for ``url`` whose keys live under this run's own ``prefix``.

    The prefix matters: the drain's keys are pruned afterwards, and a Redis given
    with ``--redis-url`` may hold other keys under the store's default prefix.
    """
    try:
        store: IdempotencyStore = cls(url, prefix=prefix)
    except TypeError as exc:
        raise RuntimeError(f"RedisStore does not take prefix=: {exc}") from exc
    return store


def redis_stores(ctx: Context) -> Callable[[], IdempotencyStore]:
    """A fresh Redis store per call, its keys under the bench namespace's prefix."""
    cls, url = ctx.redis_class, ctx.redis_url
    assert cls is not None and url is not None
    prefix = f"{ctx.topology.namespace}:idem:"
    return lambda: make_redis_store(cls, url, prefix)


def delayq_redis(ctx: Context) -> Timing:
    return async_consumer(ctx, redis_stores(ctx))


MEASURE: dict[str, Callable[[Context], Timing]] = {
    RAW: raw_aio_pika,
    LIMIT: raw_frames_limit,
    LIMIT_WORK: raw_frames_working,
    MEMORY: delayq_memory,
    SQLITE: delayq_sqlite,
    REDIS: delayq_redis,
    MEMORY_TRACED: delayq_memory_traced,
}
