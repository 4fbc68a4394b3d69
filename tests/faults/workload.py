"""What every fault scenario shares: a short-ladder topology, a random workload, an
idempotent consumer recording its effects in SQLite, and the final checks."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pika
import pika.exceptions as pex

from delayq import Destination, Ladder, Message, SQLiteStore, Topology
from delayq.topology.declarations import QueueDecl, build_declarations


def make_topology(ladder: Iterable[str], **kwargs: Any) -> Topology:
    namespace = f"f{uuid.uuid4().hex[:10]}"
    return Topology(
        namespace=namespace,
        ladder=Ladder.parse(list(ladder)),
        destinations=(Destination(queue=f"{namespace}.work", bindings=("job.#",)),),
        **kwargs,
    )


def random_messages(
    count: int, top_ms: int, *, start: int = 0, seed: int = 7, min_ms: int = 0
) -> list[Message]:
    """``count`` messages ``{"n": ...}`` with delays uniform over [min_ms, top_ms]."""
    rng = random.Random(seed + start)
    return [
        Message(
            {"n": n},
            "job.fault",
            timedelta(milliseconds=rng.randint(min_ms, top_ms)),
            message_id=f"m{n}",
        )
        for n in range(start, start + count)
    ]


class Effects:
    """The application's table: one row per handled message, no unique key (doubles show)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS effects (n INTEGER)")

    def counts(self) -> Counter[int]:
        with sqlite3.connect(self.path, timeout=30) as db:
            rows = db.execute("SELECT n, COUNT(*) FROM effects GROUP BY n").fetchall()
        return Counter({int(n): int(c) for n, c in rows})

    def wait_for(self, expected: set[int], timeout_s: float) -> Counter[int]:
        deadline = time.monotonic() + timeout_s
        while True:
            counts = self.counts()
            if expected <= set(counts) or time.monotonic() > deadline:
                return counts
            time.sleep(0.25)


def handler(body: dict[str, int], tx: sqlite3.Connection) -> None:
    tx.execute("INSERT INTO effects (n) VALUES (?)", (body["n"],))


class SlowOnce:
    """:func:`handler`, whose first attempt at message 0 first sleeps ``hold_s`` (past a
    timeout); ``attempts`` counts each message's attempts."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.attempts: dict[int, int] = {}

    def __call__(self, body: dict[str, int], tx: sqlite3.Connection) -> None:
        self.attempts[body["n"]] = self.attempts.get(body["n"], 0) + 1
        if body["n"] == 0 and self.attempts[0] == 1:
            time.sleep(self.hold_s)
        handler(body, tx)


class ConsumerThread:
    """A transactional consumer (either adapter) running in a thread of this process."""

    def __init__(self, url: str, topo: Topology, effects: Effects, kind: str = "async",
                 **options: Any) -> None:
        self.kind = kind
        self.store = SQLiteStore(effects.path)
        options = {"store": self.store, "transactional": True, "prefetch": 50, **options}
        if kind == "async":  # SQLite has one writer: a few handlers at once are plenty
            options.setdefault("concurrency", 4)
        queue = topo.destinations[0].queue
        self._error: list[BaseException] = []
        if kind == "async":
            from delayq.aio import AsyncConsumer

            self.consumer: Any = AsyncConsumer(url, topo, queue, options.pop("handler", handler),
                                               **options)
            self.loop = asyncio.new_event_loop()
            self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self.thread.start()
            asyncio.run_coroutine_threadsafe(self.consumer.start(), self.loop).result(60)
        else:
            from delayq.sync import Consumer

            self.consumer = Consumer(url, topo, queue, options.pop("handler", handler), **options)
            self.consumer.start()
            self.thread = threading.Thread(target=self._run_sync, daemon=True)
            self.thread.start()

    def _run_sync(self) -> None:
        try:
            self.consumer.run(install_signal_handlers=False)
        except BaseException as exc:
            self._error.append(exc)

    @property
    def stats(self) -> Any:
        return self.consumer.stats

    def stop(self) -> None:
        if self.kind == "async":
            asyncio.run_coroutine_threadsafe(self.consumer.stop(10), self.loop).result(60)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        else:
            self.consumer.request_stop()
            self.thread.join(60)
        self.store.close()
        if self._error:
            raise self._error[0]


def queue_names(topo: Topology) -> list[str]:
    return [d.name for d in build_declarations(topo) if isinstance(d, QueueDecl)]


def depths(url: str, topo: Topology) -> dict[str, int]:
    """Messages in every queue of the topology (passive declares)."""
    found: dict[str, int] = {}
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        for name in queue_names(topo):
            channel = connection.channel()
            try:
                found[name] = int(channel.queue_declare(name, passive=True).method.message_count)
                channel.close()
            except pex.ChannelClosedByBroker:
                found[name] = -1  # missing
    finally:
        connection.close()
    return found


def leftovers(url: str, topo: Topology, settle_s: float = 20.0) -> dict[str, int]:
    """Queues still holding messages once the counts settle (quorum counts lag a little)."""
    deadline = time.monotonic() + settle_s
    while True:
        left = {name: n for name, n in depths(url, topo).items() if n != 0}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def parked(url: str, topo: Topology) -> int:
    return sum(n for name, n in depths(url, topo).items() if ".tier." in name and n > 0)
