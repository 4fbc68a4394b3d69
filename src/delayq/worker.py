"""Declaring an application's handlers, and running them: what ``delayq worker`` runs.

>>> worker = Worker(load_topology("topology/delayq.yaml"))          # doctest: +SKIP
>>> @worker.handler("orders.reminders", policy=ExponentialBackoff(max_attempts=5),
...                 key=lambda order: order.id, model=Order)        # doctest: +SKIP
... async def send_reminder(order: Order) -> None: ...

Then ``delayq worker myapp.tasks:worker`` consumes every registered queue:
coroutine handlers on one event loop (``AsyncConsumer``), plain ones each with a
``Consumer`` of its own (up to ``concurrency`` handler threads), until SIGTERM or
SIGINT stops them all gracefully.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from delayq.consume.handlers import check_handler
from delayq.consume.retry import RetryPolicy, check_policy
from delayq.consume.settings import check_prefetch
from delayq.durations import Duration, to_ms
from delayq.errors import DelayqError, InvalidInput
from delayq.observe.deliveries import DeliveryObserver
from delayq.stores.key_scope import KeyScope
from delayq.topology.model import Topology
from delayq.urls import resolved_memory_name

if TYPE_CHECKING:
    from delayq.ops.watchdog import Watchdog
    from delayq.schedule.record import ScheduleIndex
    from delayq.sync.bridge import Bridge

__all__ = ["Registration", "Worker", "load_worker"]

log = logging.getLogger("delayq.worker")


@dataclass(frozen=True)
class Registration:
    queue: str
    handler: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def is_async(self) -> bool:
        from delayq.consume.handlers import is_coroutine_handler

        return is_coroutine_handler(self.handler)  # an async __call__ counts too


class Worker:
    """A set of handlers, one per destination queue, run together."""

    def __init__(self, topology: Topology, **defaults: Any) -> None:
        self.topology = topology
        self.defaults = defaults
        """Consumer options for every handler (``store=``, ``policy=``, ``key_scope=``, ...)."""
        self.registrations: list[Registration] = []
        self.bridges: list[tuple[str, int]] = []
        """The intakes bridged beside the handlers (:meth:`bridge`), with their prefetch."""
        self._stop_graces: dict[str, Duration] = {}
        self._bridge_indexes: dict[str, ScheduleIndex | None] = {}
        self._running: tuple[threading.Event, list[Bridge], threading.Event] | None = None
        self._check_options(None, defaults)

    def request_stop(self, *, now: bool = False) -> None:
        """Stop :meth:`run` (from any thread or a signal handler) as a SIGTERM does;
        ``now=True`` as a second one does: the bridges give up their stop grace."""
        if self._running is not None:
            stop, bridges, hurry = self._running
            if now:
                hurry.set()
                for bridge in bridges:
                    bridge.request_stop(now=True)
            stop.set()

    def _check_options(self, queue: str | None, options: dict[str, Any]) -> None:
        """Refuse at declaration, not when the worker starts, options no consumer would
        take: a retry policy the topology cannot hold, an unknown key scope, a duration
        without a unit."""
        for name in ("handler_timeout", "stuck_grace", "lease", "retention"):
            if options.get(name) is not None:
                to_ms(options[name], what=name)
        if options.get("prefetch") is not None:
            check_prefetch(options["prefetch"])
        if "key_scope" in options:
            KeyScope.parse(options["key_scope"])
        policy = options.get("policy")
        if isinstance(policy, RetryPolicy):
            check_policy(policy, self.topology, queue=queue)

    def handler(self, queue: str, **options: Any) -> Callable[[Callable[..., Any]], Any]:
        """Register the decorated function for ``queue`` with consumer ``options``."""
        try:
            self.topology.destination(queue)
        except KeyError:
            raise InvalidInput(
                f"queue {queue!r} is not a destination of the topology "
                f"(namespace {self.topology.namespace!r})"
            ) from None
        self._check_free(queue)
        self._check_options(queue, {**self.defaults, **options})

        transactional = bool({**self.defaults, **options}.get("transactional", False))

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            # Refused at import, not once the worker runs and every delivery fails.
            check_handler(fn, sync=False, transactional=transactional)
            # Checked again here: one handler() call's decorator applied twice would
            # otherwise register two handlers that split the queue between them.
            self._check_free(queue, fn)
            self.registrations.append(Registration(queue, fn, options))
            return fn

        return register

    def bridge(
        self,
        intake: str | None = None,
        *,
        prefetch: int = 1000,
        stop_grace: Duration = "10s",
        schedule: ScheduleIndex | None = None,
    ) -> None:
        """Also run the bridge of ``intake`` (the topology's only one when ``None``): what
        ``delayq bridge`` runs, in a thread of this worker (see :mod:`delayq.sync.bridge`).
        A stop waits up to ``stop_grace`` for the confirms of what it has in flight; what
        is left unconfirmed then goes back to the intake queue and the run raises
        :class:`~delayq.errors.PublishUnconfirmed` saying so. ``schedule``: record each
        message it schedules in that index (as ``Bridge(schedule=)``)."""
        from delayq.sync._bridging import check_stop_grace
        from delayq.sync.bridge import pick_intake

        check_prefetch(prefetch)
        check_stop_grace(stop_grace)  # refused here, not once the worker runs
        name = pick_intake(self.topology, intake).exchange
        if any(name == bridged for bridged, _ in self.bridges):
            raise InvalidInput(f"intake {name!r} is bridged already by this worker")
        self.bridges.append((name, prefetch))
        self._stop_graces[name] = stop_grace
        self._bridge_indexes[name] = schedule

    def _check_free(self, queue: str, fn: Callable[..., Any] | None = None) -> None:
        """Refuse a second handler for ``queue``: two would share its messages at random."""
        for reg in self.registrations:
            if reg.queue == queue:
                theirs = getattr(reg.handler, "__qualname__", repr(reg.handler))
                mine = "" if fn is None else f" ({getattr(fn, '__qualname__', repr(fn))})"
                raise InvalidInput(
                    f"queue {queue!r} already has a handler, {theirs}: a second one{mine} "
                    "would get about half of its messages. Register one handler per queue "
                    "(dispatch inside it, or bind another destination queue)"
                )

    def consumer_options(
        self,
        reg: Registration,
        *,
        prefetch: int | None = None,
        concurrency: int | None = None,
        observers: Iterable[DeliveryObserver] = (),
    ) -> dict[str, Any]:
        """The consumer options of one handler: the worker's defaults, then the handler's
        own, then what the run adds (``Worker.run`` and the memory broker use them)."""
        merged = {**self.defaults, **reg.options}
        extra = tuple(observers)
        if extra:
            merged["observers"] = (*merged.get("observers", ()), *extra)
        if prefetch is not None:
            merged["prefetch"] = prefetch
        if concurrency is not None:  # threads for plain handlers, tasks for coroutines
            merged["concurrency"] = concurrency
        return merged

    def run(
        self,
        url: str | None = None,
        *,
        prefetch: int | None = None,
        concurrency: int | None = None,
        stop: threading.Event | None = None,
        observers: Iterable[DeliveryObserver] = (),
        watchdog: Watchdog | None = None,
        install_signal_handlers: bool = True,
    ) -> None:
        """Consume every registered queue until SIGTERM/SIGINT (or ``stop`` is set, or
        :meth:`request_stop` is called; ``install_signal_handlers=False`` leaves signals to
        the caller, which must be the case outside the main thread).

        ``observers`` watch every consumer, besides any given in the worker's or the
        handler's options (``delayq worker --metrics-port`` adds a metrics observer).
        ``watchdog`` (:class:`~delayq.ops.watchdog.Watchdog`, what ``delayq worker
        --heal`` passes) runs in a thread of its own while the consumers run.

        A bridge's stop is bounded: its ``stop_grace``, then what is unconfirmed goes back
        to its intake queue and the run raises
        :class:`~delayq.errors.PublishUnconfirmed`; a bridge still not stopped
        :data:`~delayq.sync._bridging.STOP_MARGIN_S` later is left behind (its thread is
        a daemon) and the run raises :class:`~delayq.errors.BrokerError`. A second
        SIGTERM or SIGINT has the bridges give up their grace at once.
        """
        from delayq.aio.consumer import AsyncConsumer
        from delayq.sync._bridging import join_bridges
        from delayq.sync._signals import wait_for_stop
        from delayq.sync.bridge import Bridge
        from delayq.sync.consumer import Consumer

        if not self.registrations and not self.bridges:
            raise InvalidInput(
                "the worker has no handlers: register some with @worker.handler "
                "(or bridge an intake with worker.bridge())"
            )
        if resolved_memory_name(url) is not None:
            raise InvalidInput(
                "a worker on a memory broker is driven by the test: use broker.attach(worker) "
                "(or await broker.attach_async(worker)), then broker.advance(...)"
            )
        if prefetch is not None:
            check_prefetch(prefetch)
        for reg in self.registrations:  # before any consumer starts
            self._check_options(reg.queue, {**self.defaults, **reg.options})
        stop = stop or threading.Event()
        bridges: list[Bridge] = []
        extra_observers = tuple(observers)

        def options(reg: Registration) -> dict[str, Any]:
            return self.consumer_options(
                reg, prefetch=prefetch, concurrency=concurrency, observers=extra_observers
            )

        sync_consumers = [
            Consumer(url, self.topology, r.queue, r.handler, **options(r))
            for r in self.registrations
            if not r.is_async
        ]

        # The first consumer failure (a sync one in its thread, an async one on the loop)
        # stops the worker and is raised once everything stopped: a worker that cannot
        # connect must not look like one that was stopped on purpose (exit 0).
        failures: list[tuple[str, BaseException]] = []

        def failed(queue: str, exc: BaseException) -> None:
            log.debug("consumer of %s failed; stopping the worker", queue, exc_info=exc)
            failures.append((queue, exc))
            stop.set()

        def run_sync(consumer: Consumer) -> None:
            try:
                consumer.run(install_signal_handlers=False)
            except BaseException as exc:  # a handler's SystemExit too: it ends the worker
                failed(consumer.queue, exc)

        bridges += [
            Bridge(
                url,
                self.topology,
                name,
                prefetch=count,
                stop_grace=self._stop_graces[name],
                schedule=self._bridge_indexes[name],
            )
            for name, count in self.bridges
        ]

        def run_bridge(bridge: Bridge) -> None:
            try:
                bridge.run(install_signal_handlers=False)
            except BaseException as exc:
                failed(bridge.queue, exc)

        def sync_started() -> bool:
            return all(c.started.is_set() for c in sync_consumers) and all(
                b.started.is_set() for b in bridges
            )

        threads = [
            threading.Thread(target=run_sync, args=(c,), name=f"delayq {c.queue}")
            for c in sync_consumers
        ]
        # Daemon threads: a bridge stuck past its stop's bound (a write that never
        # returns) must not keep the process from exiting; its unacked deliveries go
        # back to the intake queue with its connection.
        bridge_threads = [
            threading.Thread(
                target=run_bridge, args=(b,), name=f"delayq bridge {b.queue}", daemon=True
            )
            for b in bridges
        ]
        threads += bridge_threads
        if watchdog is not None:  # it logs its own failures and keeps looking
            threads.append(
                threading.Thread(target=watchdog.run, args=(stop,), name="delayq watchdog")
            )
        hurry = threading.Event()
        self._running = (stop, bridges, hurry)
        signals: list[int] = []

        def signalled(signum: int, _frame: Any) -> None:
            """A stop; a second signal (not a stop set otherwise: a failure, the caller's
            ``stop``) has the bridges give up their grace."""
            self.request_stop(now=bool(signals))
            signals.append(signum)

        previous: dict[int, Any] = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, signalled)
        try:
            for thread in threads:
                thread.start()
            async_regs = [r for r in self.registrations if r.is_async]

            async def run_async() -> None:
                consumers = [
                    AsyncConsumer(url, self.topology, r.queue, r.handler, **options(r))
                    for r in async_regs
                ]
                started: list[AsyncConsumer] = []
                queue = async_regs[0].queue
                try:
                    for consumer in consumers:
                        queue = consumer.queue
                        await consumer.start()
                        started.append(consumer)
                    while not stop.is_set() and not sync_started():
                        await asyncio.sleep(0.05)
                    if not stop.is_set():
                        log.info(
                            "worker running %d handlers, %d bridges",
                            len(self.registrations),
                            len(bridges),
                        )
                    while not stop.is_set():
                        await asyncio.sleep(0.2)
                except Exception as exc:
                    failed(queue, exc)
                finally:
                    await asyncio.gather(*(c.stop() for c in started))

            if async_regs:
                asyncio.run(run_async())
            else:
                while not stop.is_set() and not sync_started():
                    stop.wait(0.05)
                if not stop.is_set():
                    log.info(
                        "worker running %d handlers, %d bridges",
                        len(self.registrations),
                        len(bridges),
                    )
                wait_for_stop(stop)  # a signal's handler runs meanwhile
        finally:
            stop.set()
            for consumer in sync_consumers:
                consumer.request_stop()
            for bridge in bridges:
                bridge.request_stop()
            join_bridges(bridges, bridge_threads, failed, hurry)
            for thread in threads:
                if thread not in bridge_threads:
                    thread.join(60)
            for signum, old in previous.items():
                signal.signal(signum, old)
            self._running = None
        if failures:
            queue, exc = failures[0]
            if isinstance(exc, DelayqError) or not isinstance(exc, Exception):
                raise exc  # SystemExit(3) from a handler exits with 3
            raise DelayqError(f"the consumer of {queue} failed: {exc!r}") from exc
        log.info("worker stopped")


def load_worker(spec: str) -> Worker:
    """``"package.module"`` (attribute ``worker``) or ``"package.module:attr"``."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except DelayqError:
        raise  # the module's own delayq call failed (a topology file, say): its message says why
    except Exception as exc:  # any error while importing the module, a SyntaxError included
        raise InvalidInput(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    value = getattr(module, attr or "worker", None)
    if not isinstance(value, Worker):
        raise InvalidInput(
            f"{spec!r} is not a delayq.Worker (found {type(value).__name__}); "
            "declare one with `worker = Worker(topology)` and @worker.handler(...)"
        )
    return value
