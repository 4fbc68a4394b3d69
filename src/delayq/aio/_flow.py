"""The asyncio consumer's driver of the delivery flow (:mod:`delayq.consume.flow`), from a
delivery's arrival to its settlement: the async twin of :mod:`delayq.sync._deliveries`.

Each delivery runs in the task the feed hands it over in: the flow's store steps,
the handler (a coroutine on the loop, a plain one in a thread: :mod:`delayq.aio._handlers`),
the republish of a retry or a dead letter, and the ack, all in that task, inside the
delivery's ``process`` span when traced (:mod:`delayq.observe.tracing`).
"""

from __future__ import annotations

import asyncio
from asyncio import Task, current_task
from typing import cast

from delayq.aio._acks import AckCoalescer
from delayq.aio._handlers import HandlerCut, HandlerRunner
from delayq.aio._store import StoreBatcher
from delayq.aio.publisher import AsyncPublisher
from delayq.consume.base import ConsumerBase
from delayq.consume.delivery import Delivery, is_fresh
from delayq.consume.flow import (
    Ack,
    GiveUp,
    HandlerEnded,
    Publish,
    PutBack,
    RunHandler,
    delivery_flow,
)
from delayq.errors import DelayqError
from delayq.links import Settleable
from delayq.observe.deliveries import monotonic_ms
from delayq.observe.logs import bind_delivery, unbind_delivery
from delayq.observe.tracing import ProcessSpan
from delayq.stores.base import StoreOp

__all__ = ["AsyncDeliveryFlow"]

_ENDED = HandlerEnded(None)
"""A handler's success when nobody looks at its duration: one will do."""


class AsyncDeliveryFlow(ConsumerBase):
    """What :class:`~delayq.aio.consumer.AsyncConsumer` does with each delivery (its
    ``_adapt`` sets the attributes declared here)."""

    _acks: AckCoalescer
    _runner: HandlerRunner
    _store: StoreBatcher | None
    _slots: asyncio.Semaphore | None
    _cautious: bool
    _widening: asyncio.Task[None] | None
    _arrivals: int
    _in_flight: set[asyncio.Task[None]]
    _publisher: AsyncPublisher

    async def _widen_prefetch(self) -> None:
        raise NotImplementedError

    async def _run_inline(self, message: Settleable, delivery: Delivery) -> None:
        """An inline feed's delivery (the broker runs): settled, acks sent, on return."""
        cutoff = self._prunes.due(self._clock_ms())
        if cutoff is not None and self._store is not None:
            await self._store.prune(older_than_ms=cutoff)
        await self._on_delivery(message, delivery)
        await self._acks.drain()

    async def _on_delivery(self, message: Settleable, delivery: Delivery) -> None:
        """One delivery, in the task the feed hands it over in, from arrival to settlement."""
        task = current_task()
        assert task is not None
        in_flight = self._in_flight
        in_flight.add(task)
        self._acks.track(message)
        self._arrivals += 1
        if self._cautious and is_fresh(delivery.redelivered, delivery.headers):
            self._cautious = False
            self._widening = asyncio.get_running_loop().create_task(self._widen_prefetch())
        # The task's logging binding (and the span, when traced) stays with it; threads
        # for plain handlers get a copy of it (see delayq.observe.logs).
        token = bind_delivery(delivery)
        span = None if self._tracing is None else self._trace(delivery, self._clock_ms())
        if span is not None:
            span.attach()  # the handler (its task or thread copies this context) runs in it
        try:
            if self._slots is None:
                await self._drive(message, delivery, task, span)
            else:
                async with self._slots:
                    await self._drive(message, delivery, task, span)
        except asyncio.CancelledError:
            self._acks.forget(message)  # back to the queue when the channel closes
            raise
        finally:
            if span is not None:
                span.detach()
                span.abandon("its task was cancelled")  # nothing when it was settled
            unbind_delivery(token)
            in_flight.discard(task)

    async def _drive(
        self, message: Settleable, delivery: Delivery, task: Task[None], span: ProcessSpan | None
    ) -> None:
        """Drive the delivery's flow (:mod:`delayq.consume.flow`) to its settlement."""
        observed = bool(self._observers) or span is not None  # only they see the timings
        received_ms = self._clock_ms() if observed else 0
        flow = delivery_flow(delivery, self._flow_context)
        store = self._store
        step = next(flow)
        while True:
            # By type identity, not isinstance (this runs per delivery); mypy narrows it.
            if type(step) is RunHandler:
                started = monotonic_ms() if observed else 0.0
                try:
                    await self._runner.call(step.value, step.claim, task)
                except HandlerCut as cut:
                    flow.close()
                    if step.claim is not None:
                        self._runner.finish_cut(cut.running, step.claim.key)
                    raise asyncio.CancelledError from None
                except BaseException as exc:  # the flow gives the claim back, then decides
                    if span is not None:
                        span.failed(exc)
                    step = flow.send(HandlerEnded(exc, monotonic_ms() - started))
                else:
                    step = flow.send(
                        HandlerEnded(None, monotonic_ms() - started) if observed else _ENDED
                    )
            elif type(step) is Ack:
                self._acks.ack(message)
                self._settled(delivery, step, received_ms)
                if span is not None:
                    span.finish(step, self._clock_ms())
                return
            elif type(step) is Publish:
                if span is not None:
                    span.carry(step.message)
                step = flow.send(await self._republish(step))
            elif type(step) is PutBack:
                if span is not None:
                    span.finish(step, self._clock_ms())
                self._putting_back(delivery, step.why)
                await asyncio.sleep(self._return_pause_s)
                await self._acks.nack(message, requeue=True)
                return
            elif type(step) is GiveUp:
                if span is not None:
                    span.finish(step, self._clock_ms())
                raise step.error  # cancelled (stop, connection lost)
            else:
                assert store is not None
                op = cast(StoreOp, step)
                step = flow.send(store.answer_now(op) if store.inline else await store.answer(op))

    async def _republish(self, step: Publish) -> DelayqError | None:
        try:
            await self._publisher.send(step.message)
        except DelayqError as exc:
            return exc
        return None
