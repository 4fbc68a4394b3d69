"""Celery's and FastStream's delayed messages for ``bench/frameworks.py``, as
``frameworks_runs.py`` does Dramatiq's and taskiq's: a worker in this process runs each
message and records how late it ran; ``hold`` is the worker a child process runs to be
measured while messages wait.

Celery's own countdown (a classic queue, confirmed publishes as delayq's are) is held by
the worker until due; FastStream has no delay of its own (the plugin's exchange, which
these brokers refuse), so it runs through delayq only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.worker import state
from faststream.rabbit import RabbitBroker
from frameworks_runs import Names, Ran, rss_mb

from delayq.integrations.celery import install
from delayq.integrations.faststream import DelayqBroker as FastStreamDelayq

WORKER_THREADS = 8


def celery_app(kind: str, url: str, names: Names) -> Celery:
    app = Celery(names.queue, broker=url, set_as_current=False)
    app.conf.update(
        task_default_queue=names.queue, broker_transport_options={"confirm_publish": True},
        worker_hijack_root_logger=False, broker_connection_retry_on_startup=True,
    )  # fmt: skip
    if kind != "own":
        install(app, topology=names.topology, url=url)
    return app


def _nothing(*args: Any) -> None:
    """A task run an hour after the measure: never."""


@contextlib.contextmanager
def _worker(app: Celery) -> Iterator[Any]:
    """Celery's test worker (8 threads) for the ``with`` block. Its stop is asked for,
    then a task of nothing wakes its event loop to see it: left alone, the loop sleeps
    out a 10 s poll before it looks (60 s of the bench's 90 on Celery's six workers)."""
    logging.getLogger("celery").setLevel(logging.WARNING)
    wake = app.task(name=f"{app.main}.wake")(_nothing)
    with start_worker(
        app, pool="threads", concurrency=WORKER_THREADS, perform_ping_check=False,
        shutdown_timeout=60, loglevel="WARNING",
    ) as worker:  # fmt: skip
        try:
            yield worker
        finally:
            state.should_terminate = 0
            wake.apply_async()


def run_celery(
    kind: str, url: str, names: Names, delays_s: list[float], wait_s: float
) -> tuple[float, Ran]:
    """Send every message with a countdown (confirmed), then wait until each ran."""
    app = celery_app(kind, url, names)
    ran = Ran(len(delays_s))

    @app.task(name=names.queue)
    def record(index: int, due_ms: float) -> None:
        ran.record(index, due_ms)

    with _worker(app):
        started = time.perf_counter()
        for index, delay in enumerate(delays_s):
            due = time.time() * 1000 + delay * 1000
            record.apply_async((index, due), countdown=delay)
        rate = len(delays_s) / (time.perf_counter() - started)
        ran.done.wait(wait_s)
    return rate, ran


def faststream_broker(kind: str, url: str, names: Names) -> RabbitBroker:
    if kind == "own":
        raise ValueError("FastStream has no delay of its own (the plugin's exchange)")
    return FastStreamDelayq(url, topology=names.topology, logger=None)


def run_faststream(
    kind: str, url: str, names: Names, delays_s: list[float], wait_s: float
) -> tuple[float, Ran]:
    """The same with FastStream's publishes (``x-delay``), each awaited, and its
    subscriber in this event loop."""
    broker = faststream_broker(kind, url, names)
    ran = Ran(len(delays_s))

    @broker.subscriber(names.queue)
    async def record(body: dict[str, Any]) -> None:
        ran.record(body["index"], body["due"])

    async def main() -> float:
        await broker.start()
        try:
            started = time.perf_counter()
            for index, delay in enumerate(delays_s):
                due = time.time() * 1000 + delay * 1000
                body = {"index": index, "due": due}
                await broker.publish(body, names.queue, headers={"x-delay": round(delay * 1000)})
            rate = len(delays_s) / (time.perf_counter() - started)
            await asyncio.to_thread(ran.done.wait, wait_s)
        finally:
            await broker.stop()
        return rate

    return asyncio.run(main()), ran


def send_held(framework: str, kind: str, url: str, names: Names, count: int) -> None:
    """``count`` messages due in an hour, sent with no worker."""
    if framework == "celery":
        app = celery_app(kind, url, names)
        task = app.task(name=names.queue)(_nothing)
        for index in range(count):
            task.apply_async((index,), countdown=3600)
        return

    async def main() -> None:
        broker = faststream_broker(kind, url, names)
        async with broker:
            for index in range(count):
                await broker.publish(index, names.queue, headers={"x-delay": 3_600_000})

    asyncio.run(main())


def hold(framework: str, kind: str, url: str, names: Names) -> None:
    """A worker on the queue (messages already waiting), measured once it took all it
    takes (nothing more for 2 s): prints ``held N rss MB``."""
    if framework == "celery":
        app = celery_app(kind, url, names)
        app.task(name=names.queue)(_nothing)
        with _worker(app):
            last, steady = -1, time.monotonic()
            while time.monotonic() - steady < 2:
                if len(state.scheduled_requests) != last:
                    last, steady = len(state.scheduled_requests), time.monotonic()
                time.sleep(0.1)
            print(f"held {last} rss {rss_mb():.1f}", flush=True)
            # Measured: this child's work is done. Its worker is not stopped: the messages
            # it holds keep the wake-up task behind them, so a stop would sleep out a 10 s
            # poll; they go back to the queue with the connection, deleted after.
            os._exit(0)

    async def main() -> None:
        broker = faststream_broker(kind, url, names)

        @broker.subscriber(names.queue)
        async def nothing(body: Any) -> None:
            raise AssertionError("ran an hour early")

        await broker.start()
        await asyncio.sleep(2)  # nothing reaches the worker before it is due
        print(f"held 0 rss {rss_mb():.1f}", flush=True)
        await broker.stop()

    asyncio.run(main())
