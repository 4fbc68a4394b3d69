"""The blocking modes of ``bench/consume.py``: a raw pika consumer and ``delayq.sync.Consumer``
with each store, one drain each (the sync twins of :mod:`consume_modes`' asyncio modes).

Both run their connection's loop in the calling (main) thread, as a user's ``run()`` does,
while a watcher thread polls the ack count with :meth:`consume_modes.Drain.wait` (the
same loop, every ``POLL_S``, as the asyncio modes) and asks the consumer to stop once it
is reached. So a ``--profile`` of a sync mode (cProfile, main thread only) sees the
consumer's own thread: pika's I/O, the delivery flow, the store calls, the acks; not the
handler threads (whose handler does nothing) nor the watcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
from consume_modes import Context, Drain, Timing, redis_stores

from delayq.message.envelope import epoch_ms
from delayq.stores.base import IdempotencyStore
from delayq.stores.memory import InMemoryStore
from delayq.stores.sqlite import SQLiteStore
from delayq.sync import Consumer

RAW_PIKA = "raw-pika"
RAW_PIKA_THREADS = "raw-pika-threads"
HANDLER_THREADS = 8
"""The raw twin's handler threads: the sync Consumer's default (``min(prefetch, 8)``)."""
SYNC_MEMORY = "sync-memory"
SYNC_SQLITE = "sync-sqlite"
SYNC_REDIS = "sync-redis"
SYNC_KEYS = (RAW_PIKA_THREADS, SYNC_MEMORY, SYNC_SQLITE, SYNC_REDIS)
"""The modes whose ratio is to raw pika (the others' is to raw aio-pika)."""

SYNC_LABELS = {
    RAW_PIKA: "raw pika consumer, ack only",
    RAW_PIKA_THREADS: "raw pika, 8 handler threads",
    SYNC_MEMORY: "sync Consumer + InMemoryStore",
    SYNC_SQLITE: "sync Consumer + SQLiteStore",
    SYNC_REDIS: "sync Consumer + RedisStore",
}
SYNC_TARGETS = {SYNC_MEMORY: 1.00}
SYNC_CHOICES = {
    "raw-pika": RAW_PIKA,
    "raw-pika-threads": RAW_PIKA_THREADS,
    "sync-memory": SYNC_MEMORY,
    "sync-sqlite": SYNC_SQLITE,
    "sync-redis": SYNC_REDIS,
}


class Watcher:
    """A thread that waits for ``acked()`` to reach the drain's count, polling as the
    asyncio modes do, then calls ``stop()`` (also when the drain stalls)."""

    def __init__(self, drain: Drain, acked: Callable[[], int], stop: Callable[[], None]) -> None:
        self._drain, self._acked, self._stop = drain, acked, stop
        self._timing: Timing | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._watch, name="bench-watcher", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            self._timing = asyncio.run(self._drain.wait(self._acked))
        except BaseException as exc:  # raised in the main thread by timing()
            self._error = exc
        finally:
            self._stop()

    def timing(self) -> Timing:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._timing is not None
        return self._timing


def raw_pika(ctx: Context) -> Timing:
    """pika's ``BlockingConnection``: ``basic_consume`` with manual acks, a callback that
    only acks (``basic_ack`` by tag), ``start_consuming`` in this thread."""
    count, prefetch = ctx.settings.count, ctx.settings.prefetch
    drain = Drain(count)
    acked = 0

    def on_message(channel: Any, method: Any, _props: Any, _body: bytes) -> None:
        nonlocal acked
        drain.first_delivery()
        channel.basic_ack(method.delivery_tag)
        acked += 1

    connection = pika.BlockingConnection(pika.URLParameters(ctx.url))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=prefetch)
        channel.basic_consume(ctx.queue, on_message, auto_ack=False)
        watcher = Watcher(
            drain, lambda: acked, lambda: connection.add_callback_threadsafe(channel.stop_consuming)
        )
        channel.start_consuming()  # until the watcher's stop_consuming (cancels the consumer)
        return watcher.timing()
    finally:
        connection.close()


def raw_pika_threads(ctx: Context) -> Timing:
    """A pika consumer that runs its handlers in threads, done plainly (the sync
    Consumer's model: a handler may take its time while the connection's thread keeps
    the heartbeats going): the connection's thread hands each delivery's tag to
    ``HANDLER_THREADS`` threads through a queue; a thread runs a no-op handler and hands
    the tag back through another, waking the connection's thread with pika's
    ``add_callback_threadsafe`` only when no wake is pending; that thread acks each tag.
    No message object, no store, no ack coalescing, no handler timeout."""
    count, prefetch = ctx.settings.count, ctx.settings.prefetch
    drain = Drain(count)
    work: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    done: queue.SimpleQueue[int] = queue.SimpleQueue()
    acked = 0
    waking = False

    connection = pika.BlockingConnection(pika.URLParameters(ctx.url))

    def on_message(_channel: Any, method: Any, _props: Any, _body: bytes) -> None:
        drain.first_delivery()
        work.put(method.delivery_tag)

    def ack_done() -> None:  # the connection's thread
        nonlocal acked, waking
        waking = False  # before taking: a tag put after this wakes again
        while not done.empty():
            channel.basic_ack(done.get_nowait())
            acked += 1

    def handle() -> None:
        nonlocal waking
        while (tag := work.get()) is not None:
            done.put(tag)  # the handler: nothing
            if not waking:
                waking = True
                connection.add_callback_threadsafe(ack_done)

    threads = [threading.Thread(target=handle, daemon=True) for _ in range(HANDLER_THREADS)]
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=prefetch)
        channel.basic_consume(ctx.queue, on_message, auto_ack=False)
        for thread in threads:
            thread.start()
        watcher = Watcher(
            drain, lambda: acked, lambda: connection.add_callback_threadsafe(channel.stop_consuming)
        )
        channel.start_consuming()  # until the watcher's stop_consuming (cancels the consumer)
        return watcher.timing()
    finally:
        for _ in threads:
            work.put(None)
        for thread in threads:
            thread.join(timeout=10)
        connection.close()


def sync_consumer(ctx: Context, make_store: Callable[[], IdempotencyStore]) -> Timing:
    """``delayq.sync.Consumer`` with a no-op handler, its default handler threads
    (``concurrency``: min(prefetch, 8)), started before the clock, ``run()`` in this thread
    until the watcher's ``request_stop()``."""
    count, prefetch = ctx.settings.count, ctx.settings.prefetch
    drain = Drain(count)

    def handler(_value: object) -> None:
        drain.first_delivery()

    store = make_store()
    try:
        consumer = Consumer(
            ctx.url, ctx.topology, ctx.queue, handler, store=store, prefetch=prefetch
        )
        consumer.start()  # connected and consuming (prefetch 1 until the first fresh delivery)
        watcher = Watcher(drain, lambda: consumer.stats.handled, consumer.request_stop)
        consumer.run(install_signal_handlers=False)  # returns stopped and closed
        timing = watcher.timing()
        stats = consumer.stats
        if (stats.handled, stats.duplicates, stats.retried, stats.dead_lettered) != (
            count,
            0,
            0,
            0,
        ) or stats.returned:
            raise RuntimeError(f"Consumer ended with {stats}, expected {count} handled")
        return timing
    finally:
        # Forget this drain's keys (a Redis store's live under this run's prefix only).
        with contextlib.suppress(Exception):
            store.prune(older_than_ms=epoch_ms() + 3_600_000)
        store.close()


def sync_memory(ctx: Context) -> Timing:
    return sync_consumer(ctx, InMemoryStore)


def sync_sqlite(ctx: Context) -> Timing:
    folder = Path(tempfile.mkdtemp(prefix="delayq-bench-", dir=ctx.settings.sqlite_dir))
    try:
        return sync_consumer(ctx, lambda: SQLiteStore(folder / "keys.db"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def sync_redis(ctx: Context) -> Timing:
    return sync_consumer(ctx, redis_stores(ctx))


SYNC_MEASURE: dict[str, Callable[[Context], Timing]] = {
    RAW_PIKA: raw_pika,
    RAW_PIKA_THREADS: raw_pika_threads,
    SYNC_MEMORY: sync_memory,
    SYNC_SQLITE: sync_sqlite,
    SYNC_REDIS: sync_redis,
}
