"""The two processes of ``bench/e2e.py``: a publisher and a consumer, one of each per run.

Each runs in an OS process of its own (multiprocessing, spawn) and talks to the driver on a
pipe: it connects, says ``ready``, waits for the start time ``t0`` (epoch seconds), does its
part, and sends back what it measured. Two shared counters link them: ``delivered`` (the
consumer's distinct messages so far, written every ``SLICE_S``) lets the search runs bound the
backlog, and ``total`` (set by the driver once the publisher is done) tells the consumer when
it has everything.

Every body starts with ``STAMP``: the message's sequence number and the time it was handed to
the client (``time.time_ns()``, CLOCK_REALTIME, so the two processes agree), then padding.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import dataclasses
import os
import pstats
import select
import struct
import threading
import time
import traceback
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from consume_modes import BatchAcks, make_redis_store, spin
from pamqp import commands
from pamqp import frame as pframe
from publish_modes import ROUTING_KEY, Context, Settings, _FrameSocket, encoded_publishes

from delayq import Message, Topology
from delayq.aio import AsyncPublisher
from delayq.aio._framelink import open_wire
from delayq.aio._wire import CONSUME_CHANNEL
from delayq.aio.consumer import AsyncConsumer
from delayq.errors import DelayqError, PublishBatchError
from delayq.message.envelope import epoch_ms
from delayq.message.factory import MessageFactory
from delayq.stores.base import IdempotencyStore
from delayq.stores.memory import InMemoryStore
from delayq.stores.sqlite import SQLiteStore

STAMP = struct.Struct("!Qq")
"""Sequence number and publish time (epoch ns) at the start of every body."""
DELAY = "1s"
TTL_S = 1.0
SLICE_S = 0.01
"""The pacers send what is due every 10 ms; the consumer publishes its count as often."""
WINDOW = 10_000
"""Unconfirmed publishes at most: the raw publisher's window, AsyncPublisher's default bound."""
MAX_CHUNK = 1000
"""Most messages one slice sends (one write, or one ``publish_many``)."""
BATCHES_IN_FLIGHT = 64
"""``publish_many`` calls in flight at most in the delayq publisher."""
RAW_POOL = 2048
"""Publishes the raw publisher encodes beforehand and reuses, stamping each body."""
RAW_PREFETCH = 1000
BACKLOG_FLOOR = 2000
HEADROOM_S = 1.0
"""Search runs: at most ``BACKLOG_FLOOR`` + (TTL + ``HEADROOM_S``) x the delivery rate of the
last half second sent and not yet delivered, so a publisher faster than the path waits for it
instead of piling up a backlog (the rate doubles per TTL while the path keeps up)."""
STALL_S = 30.0
"""A consumer that gets nothing new for this long (after the first TTL) fails the run."""
GRACE_S = 0.3
"""The consumer keeps listening this long after the last message, for duplicates."""

MODE_LABELS = {
    "raw": "raw frames (the ceiling)",
    "memory": "AsyncConsumer + InMemoryStore",
    "sqlite": "AsyncConsumer + SQLiteStore",
    "redis": "AsyncConsumer + RedisStore",
    "sync": "sync Consumer + InMemoryStore",
    "pub-only": "delayq publisher, raw consumer",
    "cons-only": "raw publisher, AsyncConsumer + memory",
    "raw-work": "raw frames + --work-us of CPU a message",
}
RAW_PUBLISHER = ("raw", "cons-only", "raw-work")
RAW_CONSUMER = ("raw", "pub-only", "raw-work")
"""The split modes put delayq on one side only: which side costs the path its rate.
``raw-work`` is the raw path whose publisher and consumer spend CPU a message as a client
doing work would (``--work-us``): what a client's CPU costs the path on shared cores."""


@dataclass(frozen=True)
class Spec:
    """One run of one mode, as both processes see it."""

    mode: str
    url: str
    topology: dict[str, Any]
    """``Topology.model_dump(mode="json")``."""
    queue: str
    rate: float | None
    """Messages per second offered; ``None``: as fast as the backlog bound lets (a search)."""
    seconds: float
    body_bytes: int
    prefetch: int
    store_dir: str | None = None
    redis_url: str | None = None
    profile: str | None = None
    """Path prefix of the ``.prof`` files (``<prefix>-publisher.prof``), or ``None``."""
    work_us: tuple[float, float] = (0.0, 0.0)
    """CPU a message the ``raw-work`` mode's publisher and consumer spend (microseconds)."""


class Shared:
    def __init__(self, context: Any) -> None:
        self.delivered = context.RawValue("q", 0)
        self.total = context.RawValue("q", -1)


# The child processes' frame ------------------------------------------------------------------


def child_main(role: str, spec: Spec, shared: Shared, conn: Connection) -> None:
    """Entry point of both processes: run ``role`` and send ("done", result) or ("error", text)."""
    run = publish if role == "publisher" else consume
    try:
        prof = f"{spec.profile}-{role}.prof" if spec.profile else None
        with profiled(prof):
            result = run(spec, shared, conn)
        conn.send(("done", result))
    except BaseException as exc:
        conn.send(("error", f"{role}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def start_time(conn: Connection) -> float:
    """Say ``ready``, then wait for the driver's ``t0`` and sleep until it."""
    conn.send(("ready", None))
    t0 = float(conn.recv())
    time.sleep(max(0.0, t0 - time.time()))
    return t0


@contextlib.contextmanager
def profiled(path: str | None) -> Iterator[None]:
    """cProfile of this process, main thread and every thread started meanwhile (the store's
    and the handler threads), merged into one ``.prof`` file."""
    if path is None:
        yield
        return
    profiles = [cProfile.Profile()]

    def start_in_thread(*_: object) -> None:
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.enable()

    threading.setprofile(start_in_thread)
    profiles[0].enable()
    try:
        yield
    finally:
        profiles[0].disable()
        threading.setprofile(None)
        stats = pstats.Stats(profiles[0])
        for profile in profiles[1:]:
            with contextlib.suppress(Exception):  # a thread still running is taken as is
                stats.add(profile)
        stats.dump_stats(path)


# Publishing --------------------------------------------------------------------------------


class Pacer:
    """How many messages to send now: what the rate made due, or in a search what the backlog
    bound allows; also how far a fixed-rate pacer fell behind."""

    def __init__(self, spec: Spec, t0: float, shared: Shared) -> None:
        self.rate = spec.rate
        self.t0 = t0
        self.end = t0 + spec.seconds
        self.delivered = shared.delivered
        self.sent = 0
        self.max_lag_s = 0.0
        self._history: deque[tuple[float, int]] = deque()

    def allowance(self, now: float) -> int:
        if self.rate is not None:
            due = int(self.rate * (now - self.t0)) + 1
            self.max_lag_s = max(self.max_lag_s, (due - self.sent) / self.rate - SLICE_S)
            return max(0, due - self.sent)
        delivered = self.delivered.value
        history = self._history
        history.append((now, delivered))
        while now - history[0][0] > 0.5:
            history.popleft()
        then, before = history[0]
        rate = (delivered - before) / (now - then) if now > then else 0.0
        return max(0, delivered + BACKLOG_FLOOR + int(rate * (TTL_S + HEADROOM_S)) - self.sent)

    def till_next_slice(self) -> float:
        """Seconds to the next 10 ms boundary after ``t0``."""
        return SLICE_S - (time.time() - self.t0) % SLICE_S

    def summary(self, cpu_s: float, confirmed: int, failed: int) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "confirmed": confirmed,
            "failed": failed,
            "cpu_s": cpu_s,
            "max_lag_s": max(0.0, self.max_lag_s),
        }


def publish(spec: Spec, shared: Shared, conn: Connection) -> dict[str, Any]:
    if spec.mode in RAW_PUBLISHER:
        return raw_publish(spec, shared, conn)
    return asyncio.run(delayq_publish(spec, shared, conn))


def _message_id_at(encoded: bytes) -> int:
    """Where the message id (32 hex digits) of one encoded publish starts."""
    start = 8 + int.from_bytes(encoded[3:7], "big")  # past the method frame
    _, _, header = pframe.unmarshal(encoded[start:])
    message_id = header.properties.message_id.encode()
    found = encoded.find(message_id, start)
    assert found > 0 and len(message_id) == 32
    return found


def raw_publish(spec: Spec, shared: Shared, conn: Connection) -> dict[str, Any]:
    """Pre-encoded publish frames (bench/publish_modes.py's) on a plain blocking socket, each
    body stamped as it goes, confirms counted: the same exchange, routing key and headers as
    delayq's publisher, next to no client work."""
    topology = Topology.model_validate(spec.topology)
    template = bytes(spec.body_bytes)
    sample = MessageFactory(topology).build(template, ROUTING_KEY, DELAY)
    settings = Settings(0, 0, spec.body_bytes, WINDOW, 1)
    ctx = Context(
        spec.url, settings, topology, sample.exchange, sample.exchange, template,
        sample.headers, sample.content_type, sample.timestamp_s,
    )  # fmt: skip
    wire = _FrameSocket(spec.url)
    try:
        pool = encoded_publishes(ctx, RAW_POOL, wire.frame_max)
        at = len(pool[0]) - 1 - spec.body_bytes  # the body: the last frame's payload
        assert all(len(f) == len(pool[0]) and f[at : at + len(template)] == template for f in pool)
        ids_at = [_message_id_at(f) for f in pool]  # each publish gets a message id of its own
        confirmed = 0

        def read_confirms(timeout_s: float) -> None:
            nonlocal confirmed
            while select.select([wire.sock], [], [], timeout_s)[0]:
                for value in wire.frames():
                    if not isinstance(value, commands.Basic.Ack):
                        raise RuntimeError(f"unexpected from the broker: {value!r}")
                    confirmed = value.delivery_tag if value.multiple else confirmed + 1
                timeout_s = 0.0

        work_s = spec.work_us[0] / 1e6 if spec.mode == "raw-work" else 0.0
        t0 = start_time(conn)
        pacer = Pacer(spec, t0, shared)
        cpu0 = time.process_time()
        while (now := time.time()) < pacer.end:
            sent = pacer.sent
            n = min(pacer.allowance(now), WINDOW - (sent - confirmed), MAX_CHUNK)
            if n > 0:
                if work_s:
                    spin(work_s * n)
                stamp_ns, frames = time.time_ns(), []
                for seq in range(sent, sent + n):
                    frame = bytearray(pool[seq % RAW_POOL])
                    STAMP.pack_into(frame, at, seq, stamp_ns)
                    id_at = ids_at[seq % RAW_POOL]
                    frame[id_at : id_at + 16] = b"%016x" % seq
                    frames.append(frame)
                wire.sock.sendall(b"".join(frames))
                pacer.sent += n
            read_confirms(0.0 if n == MAX_CHUNK else pacer.till_next_slice())
        deadline = time.monotonic() + 60
        while confirmed < pacer.sent and time.monotonic() < deadline:
            read_confirms(0.5)
        return pacer.summary(time.process_time() - cpu0, confirmed, pacer.sent - confirmed)
    finally:
        wire.close()


async def delayq_publish(spec: Spec, shared: Shared, conn: Connection) -> dict[str, Any]:
    """``AsyncPublisher.publish_many`` of what each slice made due, up to
    ``BATCHES_IN_FLIGHT`` calls at once."""
    topology = Topology.model_validate(spec.topology)
    padding = os.urandom(spec.body_bytes - STAMP.size)
    confirmed = failed = 0

    async def send(publisher: AsyncPublisher, batch: list[Message]) -> None:
        nonlocal confirmed, failed
        try:
            receipts = await publisher.publish_many(batch, window=len(batch))
            confirmed += len(receipts)  # after the await: other sends update it meanwhile
        except PublishBatchError as exc:
            failed += len(exc.failures)
            confirmed += len(batch) - len(exc.failures)
        except DelayqError:
            failed += len(batch)

    async with AsyncPublisher(spec.url, topology) as publisher:
        await publisher.connect()
        t0 = start_time(conn)  # blocks the loop until t0: nothing is sent before
        pacer = Pacer(spec, t0, shared)
        tasks: set[asyncio.Task[None]] = set()
        cpu0 = time.process_time()
        while (now := time.time()) < pacer.end:
            n = min(pacer.allowance(now), MAX_CHUNK)
            if n > 0:
                while len(tasks) >= BATCHES_IN_FLIGHT:
                    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                first, stamp_ns = pacer.sent, time.time_ns()
                batch = [
                    Message(STAMP.pack(seq, stamp_ns) + padding, ROUTING_KEY, DELAY)
                    for seq in range(first, first + n)
                ]
                task = asyncio.create_task(send(publisher, batch))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                pacer.sent += n
            await asyncio.sleep(0.0 if n == MAX_CHUNK else pacer.till_next_slice())
        if tasks:
            await asyncio.gather(*tasks)
        return pacer.summary(time.process_time() - cpu0, confirmed, failed)


# Consuming ---------------------------------------------------------------------------------


class Recorder:
    """What arrived: (sequence number, publish ns, arrival ns) per delivery, appended by the
    handler (a list append: safe from handler threads too) and counted by ``poll``."""

    def __init__(self) -> None:
        self.records: list[tuple[int, int, int]] = []
        self.counted = 0
        self.seen = bytearray()
        self.distinct = 0
        self.extra = 0
        """Deliveries of a message already seen (duplicates)."""

    def add(self, body: bytes) -> None:
        seq, stamp_ns = STAMP.unpack_from(body)
        self.records.append((seq, stamp_ns, time.time_ns()))

    def poll(self) -> None:
        records, seen = self.records, self.seen
        end = len(records)
        for index in range(self.counted, end):
            seq = records[index][0]
            if seq >= len(seen):
                seen.extend(bytes(max(seq + 1 - len(seen), 1 << 16)))
            if seen[seq]:
                self.extra += 1
            else:
                seen[seq] = 1
                self.distinct += 1
        self.counted = end

    def result(self) -> dict[str, Any]:
        """First arrivals only: publish and arrival ns, in arrival order."""
        self.poll()
        stamped, arrived, first = array("q"), array("q"), bytearray(len(self.seen))
        for seq, stamp_ns, at_ns in self.records:
            if not first[seq]:
                first[seq] = 1
                stamped.append(stamp_ns)
                arrived.append(at_ns)
        return {"distinct": self.distinct, "extra": self.extra, "stamped": stamped,
                "arrived": arrived}  # fmt: skip


class Watch:
    """The consumer's loop step: publish the count, stop when the total is in, fail on a stall.
    CPU is counted from ``t0`` to the last message."""

    def __init__(self, recorder: Recorder, shared: Shared, t0: float) -> None:
        self.recorder, self.shared, self.t0 = recorder, shared, t0
        self.cpu0: float | None = None
        self.cpu_s = 0.0
        self.progress = (-1, t0 + TTL_S)

    def done(self) -> bool:
        recorder = self.recorder
        recorder.poll()
        self.shared.delivered.value = recorder.distinct
        now = time.time()
        if self.cpu0 is None and now >= self.t0:
            self.cpu0 = time.process_time()
        total = self.shared.total.value
        if 0 <= total <= recorder.distinct:
            self.cpu_s = time.process_time() - (self.cpu0 or 0.0)
            return True
        if recorder.distinct != self.progress[0]:
            self.progress = (recorder.distinct, max(now, self.progress[1]))
        elif now - self.progress[1] > STALL_S:
            raise RuntimeError(
                f"no delivery for {STALL_S:.0f} s: {recorder.distinct} distinct, total {total}"
            )
        return False


def consume(spec: Spec, shared: Shared, conn: Connection) -> dict[str, Any]:
    if spec.mode == "sync":
        return sync_consume(spec, shared, conn)
    run = raw_consume if spec.mode in RAW_CONSUMER else delayq_consume
    return asyncio.run(run(spec, shared, conn))


async def watch_until_done(recorder: Recorder, shared: Shared, conn: Connection) -> Watch:
    t0 = start_time_no_sleep(conn)  # blocks the loop: nothing is delivered before t0 + TTL
    watch = Watch(recorder, shared, t0)
    while not watch.done():
        await asyncio.sleep(SLICE_S)
    await asyncio.sleep(GRACE_S)
    return watch


def start_time_no_sleep(conn: Connection) -> float:
    conn.send(("ready", None))
    return float(conn.recv())


async def raw_consume(spec: Spec, shared: Shared, conn: Connection) -> dict[str, Any]:
    """consume_modes.raw_frames_limit's reader on delayq's wire, reading each body's stamp:
    the delivery tag of each ``Basic.Deliver``, the stamp of each body, one
    ``basic.ack(multiple=True)`` per quarter of the prefetch or 10 ms after the first."""
    recorder = Recorder()
    wire = await open_wire(spec.url, attempts=3, name="bench e2e raw", publish=False)
    batch = RAW_PREFETCH // 4
    work_s = spec.work_us[1] / 1e6 if spec.mode == "raw-work" else 0.0

    class Reader(BatchAcks):
        tag = 0

        def content(self, kind: int, payload: bytes) -> None:
            if kind == 1:
                self.tag = int.from_bytes(payload[5 + payload[4] : 13 + payload[4]], "big")
            elif kind == 3:
                if work_s:
                    spin(work_s)
                recorder.add(payload)
                self.received(self.tag)

    try:
        await wire.open_channel(CONSUME_CHANNEL)
        wire.readers[CONSUME_CHANNEL] = Reader(wire, batch)
        await wire.call(
            CONSUME_CHANNEL, commands.Basic.Qos(prefetch_count=RAW_PREFETCH), commands.Basic.QosOk
        )
        ok = await wire.call(
            CONSUME_CHANNEL, commands.Basic.Consume(queue=spec.queue), commands.Basic.ConsumeOk
        )
        watch = await watch_until_done(recorder, shared, conn)
        await wire.call(
            CONSUME_CHANNEL,
            commands.Basic.Cancel(consumer_tag=ok.consumer_tag),
            commands.Basic.CancelOk,
        )
    finally:
        await wire.close()
    return {**recorder.result(), "cpu_s": watch.cpu_s, "stats": None}


def make_store(spec: Spec) -> IdempotencyStore:
    if spec.mode == "sqlite":
        assert spec.store_dir is not None
        return SQLiteStore(Path(spec.store_dir) / "keys.db")
    if spec.mode == "redis":
        from delayq.stores.redis import RedisStore

        assert spec.redis_url is not None
        prefix = f"{Topology.model_validate(spec.topology).namespace}:idem:"
        return make_redis_store(RedisStore, spec.redis_url, prefix)
    return InMemoryStore()


def close_store(store: IdempotencyStore) -> None:
    # Forget this run's keys (a Redis store's live under this run's prefix only).
    with contextlib.suppress(Exception):
        store.prune(older_than_ms=epoch_ms() + 3_600_000)
    store.close()


async def delayq_consume(spec: Spec, shared: Shared, conn: Connection) -> dict[str, Any]:
    recorder = Recorder()
    store = make_store(spec)
    try:
        add = recorder.add

        async def handler(body: bytes) -> None:
            add(body)

        consumer = AsyncConsumer(
            spec.url,
            Topology.model_validate(spec.topology),
            spec.queue,
            handler,
            store=store,
            prefetch=spec.prefetch,
        )
        await consumer.start()
        try:
            watch = await watch_until_done(recorder, shared, conn)
        finally:
            await consumer.stop()
        stats = dataclasses.asdict(consumer.stats)
    finally:
        close_store(store)
    return {**recorder.result(), "cpu_s": watch.cpu_s, "stats": stats}


def sync_consume(spec: Spec, shared: Shared, conn: Connection) -> dict[str, Any]:
    from delayq.sync import Consumer

    recorder = Recorder()
    store = make_store(spec)
    try:
        consumer = Consumer(
            spec.url,
            Topology.model_validate(spec.topology),
            spec.queue,
            recorder.add,
            store=store,
            prefetch=spec.prefetch,
        )
        runner = threading.Thread(target=consumer.run, kwargs={"install_signal_handlers": False})
        runner.start()
        try:
            if not consumer.started.wait(60):
                raise RuntimeError("the sync Consumer did not start in 60 s")
            watch = Watch(recorder, shared, start_time_no_sleep(conn))
            while not watch.done():
                time.sleep(SLICE_S)
            time.sleep(GRACE_S)
        finally:
            consumer.request_stop()
            runner.join(60)
        stats = dataclasses.asdict(consumer.stats)
    finally:
        close_store(store)
    return {**recorder.result(), "cpu_s": watch.cpu_s, "stats": stats}
