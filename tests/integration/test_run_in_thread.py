"""``run()`` in a thread that is not the main one: it consumes there without installing
signal handlers (only the main thread may), and another thread stops it (issue 48:
``Consumer.run()`` raised "signal only works in main thread")."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from delayq import Message, Topology
from delayq.aio import AsyncConsumer
from delayq.sync import Consumer, Publisher, apply_topology
from tests.waiting import wait_for


def _run_in_thread(run: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, errors


def _consume_in_a_thread(
    url: str, topology: Topology, build: Callable[[Callable[[Any], None]], Any], kind: str
) -> None:
    apply_topology(topology, url)
    handled: list[Any] = []
    consumer = build(handled.append)
    if kind == "sync":
        thread, errors = _run_in_thread(consumer.run)  # the default: install_signal_handlers
    else:
        thread, errors = _run_in_thread(lambda: asyncio.run(consumer.run()))
    with Publisher(url, topology) as publisher:
        publisher.publish_many([Message({"n": n}, "job.x", "0s") for n in range(3)])
    wait_for(lambda: len(handled) == 3 or errors, 30, lambda: f"3 handled, {handled} {errors}")
    assert not errors, errors
    assert sorted(body["n"] for body in handled) == [0, 1, 2]
    assert threading.current_thread() is threading.main_thread()
    consumer.request_stop()  # from this thread, not the consumer's
    thread.join(30)
    assert not thread.is_alive() and not errors


def test_a_sync_consumer_runs_in_a_thread_and_stops_from_another(
    make_topology: Callable[..., Topology], rabbitmq_url: str
) -> None:
    topology = make_topology(["1s"])
    queue = f"{topology.namespace}.work"
    _consume_in_a_thread(
        rabbitmq_url, topology, lambda h: Consumer(rabbitmq_url, topology, queue, h), "sync"
    )


def test_an_async_consumer_runs_in_a_thread_and_stops_from_another(
    make_topology: Callable[..., Topology], rabbitmq_url: str
) -> None:
    topology = make_topology(["1s"])
    queue = f"{topology.namespace}.work"
    _consume_in_a_thread(
        rabbitmq_url, topology, lambda h: AsyncConsumer(rabbitmq_url, topology, queue, h), "async"
    )
