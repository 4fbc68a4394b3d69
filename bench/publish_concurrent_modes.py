"""The concurrent single-publish modes of ``bench/publish.py``: ``--callers`` callers
(coroutines or threads) that each publish one message at a time, waiting for its
confirm, in a loop until ``count`` are sent between them, all through one shared
publisher (or, where a shared one is not safe, what is), with the raw clients' twins.

Each caller takes a ticket before every publish (a counter shared by all), so exactly
``count`` messages are sent whichever caller is faster. The clock starts when every
caller is ready (the tasks created, the threads waiting at a barrier, the connections
open and a warm-up of ``warmup_count(count)`` messages sent the same way) and stops
when the last caller is done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pika
from publish_modes import (
    DELAY,
    ROUTING_KEY,
    Context,
    Stopwatch,
    Timing,
    confirming_exchange,
    delayq_async_publish_many,
    delayq_sync_publish_many,
    raw_message,
    raw_pika_properties,
    raw_pika_publish,
    warmup_count,
)

from delayq.aio import AsyncPublisher
from delayq.sync import Publisher

ASYNC_CALLERS = "delayq-async-callers"
RAW_AIO_CALLERS = "raw-aio-pika-callers"
SYNC_CALLERS_LOCKED = "delayq-sync-callers-locked"
SYNC_CALLERS_EACH = "delayq-sync-callers-each"
SYNC_CALLERS_SHARED = "delayq-sync-callers-shared"
RAW_PIKA_CALLERS = "raw-pika-callers"
RAW_PIKA_CALLERS_SHARED = "raw-pika-callers-shared"
ASYNC_MANY_NARROW = "delayq-async-many-narrow"
SYNC_MANY_NARROW = "delayq-sync-many-narrow"
THREAD_HANDOFF = "thread-handoff"

CALLERS_LABELS = {
    ASYNC_CALLERS: "delayq AsyncPublisher.publish, N coroutines",
    RAW_AIO_CALLERS: "raw aio-pika publish, N coroutines",
    SYNC_CALLERS_LOCKED: "delayq Publisher.publish, N threads, 1 locked",
    SYNC_CALLERS_EACH: "delayq Publisher.publish, N threads, 1 each",
    SYNC_CALLERS_SHARED: "delayq Publisher.publish, N threads, 1 shared",
    RAW_PIKA_CALLERS: "raw pika publish, N threads, 1 each",
    RAW_PIKA_CALLERS_SHARED: "raw pika, N threads handing to 1 I/O thread",
    ASYNC_MANY_NARROW: "delayq async publish_many, window N",
    SYNC_MANY_NARROW: "delayq sync publish_many, window N",
    THREAD_HANDOFF: "N threads handing to 1 thread, no broker",
}
"""N is ``--callers``. "1 shared": one ``Publisher`` called by all threads at once (it
is thread-safe: the callers share its pipelined connection); "1 locked": the same, each
call under a ``threading.Lock`` (so one confirm at a time, as before ``Publisher`` was
thread-safe); "1 each": one ``Publisher`` (or pika connection) per thread. "window N":
``publish_many`` with no more than N unconfirmed, as N callers can have: what the broker's
confirm latency allows N messages in flight (N / latency), the bound of the callers modes.
"no broker": the raw pika twin's hand-off with nothing sent, each message "confirmed" as
soon as the other thread takes it: what CPython's thread switches alone cost."""

CALLERS_VS_MANY_TARGET = 0.80
"""N concurrent single publishes against ``publish_many`` of the same messages."""


# Callers ----------------------------------------------------------------------------------


async def _coroutines(callers: int, total: int, send: Callable[[], Awaitable[object]]) -> None:
    """``callers`` tasks awaiting ``send()`` one at a time until ``total`` are sent."""
    tickets = itertools.count()

    async def caller() -> None:
        while next(tickets) < total:
            await send()

    await asyncio.gather(*(caller() for _ in range(callers)))


def _threads(senders: list[Callable[[], object]], total: int) -> Timing:
    """A thread per sender, each calling it one at a time until ``total`` are sent between
    them; timed from the barrier that releases them all to the last one's end."""
    tickets = itertools.count()  # next() is one C call: atomic under the GIL
    ready = threading.Barrier(len(senders) + 1)
    errors: list[BaseException] = []

    def work(send: Callable[[], object]) -> None:
        ready.wait()
        try:
            while next(tickets) < total:
                send()
        except BaseException as exc:  # raised in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in senders]
    for thread in threads:
        thread.start()
    watch = Stopwatch()
    ready.wait()
    for thread in threads:
        thread.join()
    timing = watch.read()
    if errors:
        raise errors[0]
    return timing


def _warmed_threads(ctx: Context, senders: list[Callable[[], object]]) -> Timing:
    count = ctx.settings.batch_count
    _threads(senders, warmup_count(count))
    return _threads(senders, count)


# The measurements -------------------------------------------------------------------------


def delayq_async_callers(ctx: Context) -> Timing:
    """N coroutines sharing one ``AsyncPublisher``, each awaiting ``publish`` (the confirm)
    before its next one."""
    count, callers = ctx.settings.batch_count, ctx.settings.callers

    async def run() -> Timing:
        async with AsyncPublisher(ctx.url, ctx.topology) as publisher:

            def send() -> Awaitable[object]:
                return publisher.publish(ctx.body, ROUTING_KEY, DELAY)

            await publisher.connect()
            await _coroutines(callers, warmup_count(count), send)
            watch = Stopwatch()
            await _coroutines(callers, count, send)
            return watch.read()

    return asyncio.run(run())


def raw_aio_pika_callers(ctx: Context) -> Timing:
    """N coroutines sharing one aio-pika ``publisher_confirms`` channel, each awaiting
    ``exchange.publish`` (the confirm) before its next one: the same messages."""
    count, callers = ctx.settings.batch_count, ctx.settings.callers

    async def run() -> Timing:
        async with confirming_exchange(ctx) as exchange:

            def send() -> Awaitable[object]:
                sent: Awaitable[object] = exchange.publish(
                    raw_message(ctx), ROUTING_KEY, mandatory=True
                )
                return sent

            await _coroutines(callers, warmup_count(count), send)
            watch = Stopwatch()
            await _coroutines(callers, count, send)
            return watch.read()

    return asyncio.run(run())


def delayq_sync_callers_shared(ctx: Context) -> Timing:
    """N threads calling ``publish`` on one ``Publisher`` at once: one caller on its
    blocking channel, the others through its shared pipelined connection."""
    with Publisher(ctx.url, ctx.topology) as publisher:
        publisher.connect()
        send = functools.partial(publisher.publish, ctx.body, ROUTING_KEY, DELAY)
        return _warmed_threads(ctx, [send] * ctx.settings.callers)


def delayq_sync_callers_locked(ctx: Context) -> Timing:
    """N threads sharing one ``Publisher``, each call of ``publish`` under one lock: one
    confirm at a time (how it had to be shared before it was thread-safe)."""
    lock = threading.Lock()
    with Publisher(ctx.url, ctx.topology) as publisher:
        publisher.connect()

        def send() -> object:
            with lock:
                return publisher.publish(ctx.body, ROUTING_KEY, DELAY)

        return _warmed_threads(ctx, [send] * ctx.settings.callers)


def delayq_sync_callers_each(ctx: Context) -> Timing:
    """N threads, one ``Publisher`` (one connection) each, all open before the clock."""
    publishers = [Publisher(ctx.url, ctx.topology) for _ in range(ctx.settings.callers)]
    try:
        senders: list[Callable[[], object]] = []
        for publisher in publishers:
            publisher.connect()
            senders.append(functools.partial(publisher.publish, ctx.body, ROUTING_KEY, DELAY))
        return _warmed_threads(ctx, senders)
    finally:
        for publisher in publishers:
            publisher.close()


def raw_pika_callers(ctx: Context) -> Timing:
    """N threads, one pika ``BlockingConnection`` with a ``confirm_delivery()`` channel
    each (pika is not thread-safe either), one ``basic_publish`` at a time."""
    connections: list[Any] = []
    try:
        senders: list[Callable[[], object]] = []
        for _ in range(ctx.settings.callers):
            connection = pika.BlockingConnection(pika.URLParameters(ctx.url))
            connections.append(connection)
            channel = connection.channel()
            channel.confirm_delivery()
            senders.append(functools.partial(raw_pika_publish, ctx, channel))
        return _warmed_threads(ctx, senders)
    finally:
        for connection in connections:
            connection.close()


class _HandingLocks:
    """Callers each hand a lock of their own to one other thread and wait for it to be
    released; that thread is woken only when no wake is pending (:meth:`_wake`)."""

    handed: queue.SimpleQueue[threading.Lock]
    woken: bool

    def _wake(self) -> None:
        raise NotImplementedError

    def publish(self) -> None:
        lock = threading.Lock()
        lock.acquire()
        self.handed.put(lock)
        if not self.woken:
            self.woken = True
            self._wake()
        lock.acquire()  # released by the other thread


class _RawSharedPika(_HandingLocks):
    """The raw twin of a shared ``Publisher``: one pika ``SelectConnection`` with a
    confirm channel in an I/O thread of its own, publishing what the calling threads hand
    it (pika's own ``basic_publish``, as pika ships); each caller waits on a lock of its
    own that the message's confirm releases. The least a thread-safe publisher built on
    pika must do: no validation, no message building, no error handling."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.handed: queue.SimpleQueue[threading.Lock] = queue.SimpleQueue()
        self.waiting: dict[int, threading.Lock] = {}
        self.tag = 0
        self.woken = False
        self.nacked = 0
        self.ready = threading.Event()
        self.connection = pika.SelectConnection(
            pika.URLParameters(ctx.url), on_open_callback=self._on_open
        )
        self.thread = threading.Thread(target=self.connection.ioloop.start, daemon=True)
        self.thread.start()
        if not self.ready.wait(30):
            raise RuntimeError("the raw pika I/O thread did not open its channel in 30 s")

    def _on_open(self, connection: Any) -> None:
        connection.channel(on_open_callback=self._on_channel)

    def _on_channel(self, channel: Any) -> None:
        self.channel = channel
        channel.confirm_delivery(self._on_confirm, callback=lambda _frame: self.ready.set())

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if not isinstance(method, pika.spec.Basic.Ack):
            self.nacked += 1
        if method.multiple:
            for tag in [t for t in self.waiting if t <= method.delivery_tag]:
                self.waiting.pop(tag).release()
        else:
            self.waiting.pop(method.delivery_tag).release()

    def _drain(self) -> None:
        self.woken = False  # before draining: a lock handed after this is drained or wakes
        ctx = self.ctx
        while not self.handed.empty():
            lock = self.handed.get()
            self.tag += 1
            self.waiting[self.tag] = lock
            self.channel.basic_publish(
                ctx.exchange, ROUTING_KEY, ctx.body, raw_pika_properties(ctx), mandatory=True
            )

    def _wake(self) -> None:
        self.connection.ioloop.add_callback_threadsafe(self._drain)

    def close(self) -> None:
        self.connection.ioloop.add_callback_threadsafe(self.connection.close)
        self.connection.ioloop.add_callback_threadsafe(self.connection.ioloop.stop)
        self.thread.join(30)
        if self.nacked:
            raise RuntimeError(f"the broker nacked {self.nacked} raw pika publishes")


def raw_pika_callers_shared(ctx: Context) -> Timing:
    """N threads handing their messages to one raw pika I/O thread (:class:`_RawSharedPika`),
    each waiting for its confirm before the next: the raw twin of one shared ``Publisher``."""
    shared = _RawSharedPika(ctx)
    try:
        return _warmed_threads(ctx, [shared.publish] * ctx.settings.callers)
    finally:
        shared.close()


class _HandOff(_HandingLocks):
    """The raw pika twin's hand-off (:class:`_RawSharedPika`) with no connection: N threads
    each hand a lock to one thread, woken as the twin's I/O thread is, which releases it
    at once. Its CPU a message is the floor of any thread-safe publisher whose callers
    wait in their own threads for their outcome."""

    def __init__(self) -> None:
        self.handed = queue.SimpleQueue()
        self.woken = False
        self.closed = False
        self.wakes = threading.Semaphore(0)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _wake(self) -> None:
        self.wakes.release()

    def _serve(self) -> None:
        while not self.closed:
            self.wakes.acquire()
            self.woken = False  # before draining: a lock handed after this is drained or wakes
            while not self.handed.empty():
                self.handed.get().release()

    def close(self) -> None:
        self.closed = True
        self.wakes.release()
        self.thread.join(30)


def thread_handoff(ctx: Context) -> Timing:
    """N threads handing their messages to one thread that settles each at once
    (:class:`_HandOff`): the thread switches of the shared modes without the broker."""
    handoff = _HandOff()
    try:
        return _warmed_threads(ctx, [handoff.publish] * ctx.settings.callers)
    finally:
        handoff.close()


def _narrowed(ctx: Context) -> Context:
    """``ctx`` with the window of ``--callers``: as many unconfirmed as the callers have."""
    return dataclasses.replace(
        ctx, settings=dataclasses.replace(ctx.settings, window=ctx.settings.callers)
    )


def delayq_async_many_narrow(ctx: Context) -> Timing:
    return delayq_async_publish_many(_narrowed(ctx))


def delayq_sync_many_narrow(ctx: Context) -> Timing:
    return delayq_sync_publish_many(_narrowed(ctx))


CALLERS_MEASURE: dict[str, Callable[[Context], Timing]] = {
    ASYNC_CALLERS: delayq_async_callers,
    RAW_AIO_CALLERS: raw_aio_pika_callers,
    SYNC_CALLERS_SHARED: delayq_sync_callers_shared,
    SYNC_CALLERS_LOCKED: delayq_sync_callers_locked,
    SYNC_CALLERS_EACH: delayq_sync_callers_each,
    RAW_PIKA_CALLERS: raw_pika_callers,
    RAW_PIKA_CALLERS_SHARED: raw_pika_callers_shared,
    ASYNC_MANY_NARROW: delayq_async_many_narrow,
    SYNC_MANY_NARROW: delayq_sync_many_narrow,
    THREAD_HANDOFF: thread_handoff,
}
