"""One framework's delayed messages, by its own broker or by delayq's (``bench/frameworks.py``):
a worker in this process runs each message and records how late it ran; ``hold`` is the
worker a child process runs to be measured while messages wait."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import Middleware
from taskiq.receiver import Receiver
from taskiq_aio_pika import AioPikaBroker, Exchange, Queue, QueueType

from delayq import Topology
from delayq.integrations.dramatiq import DelayqBroker as DramatiqDelayq
from delayq.integrations.taskiq import DelayqBroker as TaskiqDelayq

LADDER = [f"{s}s" for s in range(1, 11)] + ["1h"]
"""delayq's ladder here: a tier a second up to 10 s, so a delay waits at most a second more."""
WORKER_THREADS = 8


@dataclass
class Names:
    """The run's entities: the framework's queue (and taskiq's exchange), delayq's namespace."""

    queue: str = field(default_factory=lambda: f"fw{uuid.uuid4().hex[:8]}")
    exact: bool = False
    """delayq's exact strategy (100 ms units) instead of the tiers."""

    @property
    def namespace(self) -> str:
        return f"{self.queue}ns"

    @property
    def topology(self) -> Topology:
        if self.exact:
            exact = {"unit": "100ms", "levels": 17}  # up to 3.6 h
            return Topology(namespace=self.namespace, ladder=LADDER, strategy="exact", exact=exact)
        return Topology(namespace=self.namespace, ladder=LADDER)

    def queues(self, framework: str) -> list[str]:
        if framework == "dramatiq":
            return [self.queue + suffix for suffix in ("", ".DQ", ".XQ")]
        if framework in ("celery", "faststream"):
            return [self.queue, f"{self.queue}.delayq-parked"]
        return [self.queue + suffix for suffix in ("", ".delay", ".dlq")]


@dataclass
class Ran:
    """Each message's runs: its index -> how late each run was (ms after due)."""

    expected: int
    late_ms: dict[int, list[float]] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, index: int, due_ms: float) -> None:
        late = time.time() * 1000 - due_ms
        with self.lock:
            self.late_ms.setdefault(index, []).append(late)
            if len(self.late_ms) >= self.expected:
                self.done.set()


def dramatiq_broker(kind: str, url: str, names: Names) -> RabbitmqBroker:
    if kind == "own":  # confirmed, as delayq's are
        return RabbitmqBroker(url=url, confirm_delivery=True)
    return DramatiqDelayq(url=url, topology=names.topology)


def taskiq_broker(kind: str, url: str, names: Names) -> AioPikaBroker:
    queue = names.queue
    common: dict[str, Any] = {
        "exchange": Exchange(name=queue),
        "dead_letter_queue": Queue(name=f"{queue}.dlq", type=QueueType.CLASSIC),
        "qos": 100,
    }
    if kind == "own":  # taskiq-aio-pika's delay queue (its default refuses delays)
        return AioPikaBroker(
            url, task_queues=[Queue(name=queue, type=QueueType.CLASSIC)],
            delay_queue=Queue(name=f"{queue}.delay", type=QueueType.CLASSIC), **common,
        )  # fmt: skip
    return TaskiqDelayq(
        url, task_queues=[Queue(name=queue, type=QueueType.CLASSIC)], topology=names.topology,
        **common,
    )  # fmt: skip


def run_dramatiq(
    kind: str, url: str, names: Names, delays_s: list[float], wait_s: float
) -> tuple[float, Ran]:
    """Send every message (confirmed), then wait until each ran; returns msg/s sent."""
    broker = dramatiq_broker(kind, url, names)
    ran = Ran(len(delays_s))
    actor = dramatiq.actor(
        ran.record, broker=broker, queue_name=names.queue, actor_name=names.queue, max_retries=0
    )
    worker = dramatiq.Worker(broker, worker_threads=WORKER_THREADS, worker_timeout=100)
    worker.start()
    try:
        started = time.perf_counter()
        for index, delay in enumerate(delays_s):
            due = time.time() * 1000 + delay * 1000
            actor.send_with_options(args=(index, due), delay=round(delay * 1000))
        rate = len(delays_s) / (time.perf_counter() - started)
        ran.done.wait(wait_s)
    finally:
        worker.stop()
        broker.close()
    return rate, ran


def run_taskiq(
    kind: str, url: str, names: Names, delays_s: list[float], wait_s: float
) -> tuple[float, Ran]:
    """The same with taskiq's kicks, each awaited, and a receiver in this event loop."""
    broker = taskiq_broker(kind, url, names)
    ran = Ran(len(delays_s))

    @broker.task(task_name=names.queue)
    async def record(index: int, due_ms: float) -> None:
        ran.record(index, due_ms)

    async def main() -> float:
        broker.is_worker_process = True
        await broker.startup()
        stop = asyncio.Event()
        receiver = Receiver(broker, run_startup=False, max_async_tasks=100)
        listening = asyncio.create_task(receiver.listen(stop))
        try:
            started = time.perf_counter()
            for index, delay in enumerate(delays_s):
                due = time.time() * 1000 + delay * 1000
                await record.kicker().with_labels(delay=delay).kiq(index, due)
            rate = len(delays_s) / (time.perf_counter() - started)
            await asyncio.to_thread(ran.done.wait, wait_s)
        finally:
            stop.set()
            await asyncio.wait_for(listening, 60)
            await broker.shutdown()
        return rate

    return asyncio.run(main()), ran


RUNS: dict[str, Callable[[str, str, Names, list[float], float], tuple[float, Ran]]] = {
    "dramatiq": run_dramatiq,
    "taskiq": run_taskiq,
}


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _Held(Middleware):  # type: ignore[misc]
    def __init__(self) -> None:
        self.count = 0

    def before_delay_message(self, broker: Any, message: Any) -> None:
        self.count += 1


def hold(framework: str, kind: str, url: str, queue: str) -> None:
    """A worker on ``queue`` (messages already waiting), measured once it took all it
    takes (nothing more for 2 s): prints ``held N rss MB``."""
    names = Names(queue=queue, exact=kind == "delayq-exact")
    if framework == "dramatiq":
        broker = dramatiq_broker(kind, url, names)
        held = _Held()
        broker.add_middleware(held)
        dramatiq.actor(
            lambda *a: None, broker=broker, queue_name=queue, actor_name=queue, max_retries=0
        )
        worker = dramatiq.Worker(broker, worker_threads=WORKER_THREADS, worker_timeout=100)
        worker.start()
        last, steady = -1, time.monotonic()
        while time.monotonic() - steady < 2:
            if held.count != last:
                last, steady = held.count, time.monotonic()
            time.sleep(0.1)
        print(f"held {held.count} rss {rss_mb():.1f}", flush=True)
        worker.stop()
        broker.close()
        return

    async def main() -> None:
        broker = taskiq_broker(kind, url, names)
        broker.register_task(lambda *a: None, task_name=queue)
        broker.is_worker_process = True
        await broker.startup()
        stop = asyncio.Event()
        listening = asyncio.create_task(Receiver(broker, run_startup=False).listen(stop))
        await asyncio.sleep(2)  # taskiq's worker never takes a delayed message: nothing to wait for
        print(f"held 0 rss {rss_mb():.1f}", flush=True)
        stop.set()
        await asyncio.wait_for(listening, 60)
        await broker.shutdown()

    asyncio.run(main())
