"""The blocking consumers' driver of the delivery flow (:mod:`delayq.consume.flow`).

Everything here runs in the connection's thread (pika's BlockingConnection is not
thread-safe): the flow's store steps, the republish and the ack. Only the handler
runs elsewhere, in a thread of :mod:`delayq.sync._threads`; when it ends (or
overruns its timeout) the connection's thread sends the flow what came of it and
drives it to its settlement. A delivery from a channel that has since been lost
is not settled on the new one (its tag would name another delivery): the broker
has the message back already.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, cast

from delayq.consume.base import ConsumerBase
from delayq.consume.delivery import H_ERROR_TYPE, H_QUEUE, Delivery
from delayq.consume.flow import (
    Ack,
    Answer,
    Flow,
    GiveUp,
    HandlerEnded,
    Publish,
    PutBack,
    RunHandler,
    Settlement,
    delivery_flow,
)
from delayq.consume.handlers import plain
from delayq.errors import DelayqError, HandlersStuck, HandlerTimeout, StoreError
from delayq.observe.logs import bind_delivery, bound_delivery, unbind_delivery
from delayq.observe.tracing import ProcessSpan
from delayq.stores.base import (
    IdempotencyStore,
    StoreOp,
    TransactionalStore,
    answer_op,
    call_in_transaction,
    store_error,
)
from delayq.sync._threads import HandlerThreads, Job
from delayq.sync.publisher import Publisher

__all__ = ["DeliveryFlow", "Incoming", "Settler"]

log = logging.getLogger("delayq.consumer")

_TIMED_OUT = f"{HandlerTimeout.__module__}.{HandlerTimeout.__qualname__}"

HUNG_ATTEMPTS = 2
"""Attempts of one message that may hang in abandoned threads at once: its retry still
runs beside an attempt that hangs (the hang may have been a one-off), a third does not.
So every message in a working slot may hang twice and the :data:`SPARE_PER_SLOT`
replacements still leave the full concurrency to other messages."""

SPARE_PER_SLOT = HUNG_ATTEMPTS
"""Replacement threads per working one, for handlers abandoned past their timeout."""
"""The error type header of an attempt that overran ``handler_timeout``."""


class Settler(Protocol):
    """Where a delivery came from, and how it is settled there."""

    @property
    def current(self) -> bool:
        """Whether it can still be settled (its channel is the consumer's channel)."""
        ...

    def ack(self) -> None: ...

    def requeue(self) -> None: ...


Incoming = tuple[Settler, Delivery]
"""A delivery not yet started, and where to settle it."""


class DeliveryFlow(ConsumerBase):
    """The delivery steps of :class:`~delayq.sync.Consumer` and its memory twin."""

    _sync: ClassVar[bool] = True
    _handler: Callable[..., None]
    _store: IdempotencyStore | None
    _publisher: Publisher
    _pending: collections.deque[Incoming]
    _threads: HandlerThreads
    _fatal: BaseException | None
    _stop: threading.Event

    def _adapt(self, handler: Callable[..., Any], store: IdempotencyStore | None) -> None:
        self._handler = plain(handler)  # a coroutine it returns fails the delivery
        self._store = store
        self._spans: dict[int, ProcessSpan] = {}
        """The ``process`` spans of deliveries being handled, by ``id(delivery)``."""

    def _pause_before_requeue(self) -> None:
        """Wait a moment before a delivery goes back (the adapter keeps heartbeats)."""

    def _prune_when_due(self) -> None:
        """Forget keys past the retention period, every tenth of it (at most 10 min)."""
        if self._store is None:
            return
        cutoff = self._prunes.due(self._clock_ms())
        if cutoff is None:
            return
        try:
            try:
                self._store.prune(older_than_ms=cutoff)
            except Exception as exc:
                raise store_error(self._store, exc) from exc
        except StoreError as exc:
            log.warning("pruning the idempotency store failed: %r", exc)

    def _start_pending(self) -> None:
        pending, threads = self._pending, self._threads
        if not pending:
            return
        if threads.stuck():
            self._dead_letter_timed_out()
        free = threads.free()
        while pending and free > 0:
            settler, delivery = pending.popleft()
            hung = threads.hung(delivery.message_id)
            if len(hung) >= HUNG_ATTEMPTS:
                self._not_again(settler, delivery, hung)
                continue
            job = self._begin(settler, delivery)
            if job is not None:
                threads.submit(job)
                free -= 1

    def _not_again(self, settler: Settler, delivery: Delivery, hung: list[Job]) -> None:
        """A message with :data:`HUNG_ATTEMPTS` attempts still running past their timeout
        is not run a third time beside them: a handler that hangs on a message every
        time would otherwise take a thread per retry, until the retries alone held every
        thread and stopped all other messages. It fails as a timeout, so the policy
        retries it later (an attempt may have ended by then) or dead-letters it when
        its attempts are spent."""
        job = self._begin(settler, delivery)
        if job is None:
            return
        attempts = ", ".join(str(j.delivery.attempt) for j in sorted(hung, key=_attempt))
        with bound_delivery(delivery):
            job.started = time.monotonic()
            job.error = HandlerTimeout(
                f"not run: attempts {attempts} of this message are still running in "
                f"handler threads, past handler_timeout ({self._timeout_ms / 1000:g} s)"
            )
            self._finish(job)

    def _dead_letter_timed_out(self) -> None:
        """No thread can start a handler (every one is stuck past its timeout): a
        delivery whose previous attempt here timed out goes to the DLQ now, with
        :class:`~delayq.errors.HandlersStuck`, instead of waiting for a thread that may
        never come; the others wait."""
        incoming = list(self._pending)
        self._pending.clear()
        for settler, delivery in incoming:
            headers = delivery.headers
            if headers.get(H_ERROR_TYPE) != _TIMED_OUT or headers.get(H_QUEUE) != self.queue:
                self._pending.append((settler, delivery))
                continue
            job = self._begin(settler, delivery)
            if job is None:
                continue
            with bound_delivery(delivery):
                job.started = time.monotonic()
                job.error = HandlersStuck(
                    f"not run: its previous attempt (attempt {delivery.attempt - 1}) ran "
                    f"past handler_timeout ({self._timeout_ms / 1000:g} s) and every "
                    f"handler thread of the consumer of {self.queue!r} "
                    f"({self._threads.abandoned}) is stuck in a handler past its timeout, "
                    "so none can start; replay it once its handler returns in time"
                )
                self._finish(job)

    def _begin(self, settler: Settler, delivery: Delivery) -> Job | None:
        """Start the flow of a delivery: a :class:`Job` to run its handler, or ``None``
        when it is settled already (undecodable, duplicate, deferred, store down)."""
        received_ms = self._clock_ms()
        span = None if self._tracing is None else self._trace(delivery, received_ms)
        if span is not None:
            self._spans[id(delivery)] = span
            span.attach()
        token = bind_delivery(delivery)
        try:
            flow = delivery_flow(delivery, self._flow_context)
            step = self._drive(flow, None, settler, delivery, received_ms)
            if step is None:
                return None
            # The job's context is copied here: the handler's thread logs with this
            # delivery's fields (see delayq.observe.logs) and runs in its span.
            return Job(settler, delivery, received_ms, flow, self._handler_call(step))
        finally:
            unbind_delivery(token)
            if span is not None:
                span.detach()

    def _handler_call(self, step: RunHandler) -> Callable[[], None]:
        """The handler's call: within the store's transaction for a transactional
        consumer, which marks the claimed key done in the same commit."""
        if self._transactional:
            claim = step.claim
            assert claim is not None  # a transactional consumer requires a key and a store
            return functools.partial(
                call_in_transaction,
                cast(TransactionalStore, self._store),
                self._handler,
                step.value,
                key=claim.key,
                lease_until_ms=claim.lease_until_ms,
                now_ms=self._clock_ms(),
            )
        return functools.partial(self._handler, step.value)

    def _drive(
        self,
        flow: Flow,
        answer: Answer,
        settler: Settler,
        delivery: Delivery,
        received_ms: int,
    ) -> RunHandler | None:
        """Do the flow's steps here up to its handler (returned) or its settlement."""
        while True:
            step = flow.send(answer)  # advance(), without a call per step
            kind = type(step)  # by identity, not isinstance: this runs per step
            if kind is RunHandler:
                return cast(RunHandler, step)
            if kind is Publish:
                step = cast(Publish, step)
                span = self._spans.get(id(delivery))
                if not settler.current:  # its channel is gone: the broker has it back
                    flow.close()
                    if span is not None:
                        del self._spans[id(delivery)]
                        span.abandon("its channel was lost")
                    return None
                if span is not None:
                    span.carry(step.message)
                answer = self._republish(step)
            elif kind is Ack or kind is PutBack or kind is GiveUp:
                self._settle(cast(Settlement, step), settler, delivery, received_ms)
                return None
            else:
                assert self._store is not None
                answer = answer_op(self._store, cast(StoreOp, step))

    def _republish(self, step: Publish) -> DelayqError | None:
        try:
            self._publisher.send(step.message)
        except DelayqError as exc:
            return exc
        return None

    def _settle(
        self, settlement: Settlement, settler: Settler, delivery: Delivery, received_ms: int
    ) -> None:
        if self._spans:
            span = self._spans.pop(id(delivery), None)
            if span is not None:
                span.finish(settlement, self._clock_ms())
        if isinstance(settlement, GiveUp):
            # SystemExit & co: stop as asked; the delivery goes back unacked.
            self._fatal = self._fatal or settlement.error
            self._stop.set()
        elif not settler.current:
            return  # a lost channel's delivery: its key is recorded, its tag is void
        elif isinstance(settlement, Ack):
            settler.ack()  # sent with the loop turn's others (see delayq.sync._acks)
            self._settled(delivery, settlement, received_ms)
        else:
            self._putting_back(delivery, settlement.why)
            self._pause_before_requeue()
            settler.requeue()

    def _settle_finished(self) -> None:
        for job in self._threads.take_finished():
            token = bind_delivery(job.delivery)
            try:
                self._finish(job)
            finally:
                unbind_delivery(token)

    def _time_out_overruns(self) -> None:
        for job in self._threads.overrun():
            with bound_delivery(job.delivery):
                log.warning(
                    "handler of %s ran past %g s; retrying it (its thread is left to finish)",
                    job.delivery.message_id,
                    self._timeout_ms / 1000,
                )
                job.error = HandlerTimeout(
                    f"handler for {self.queue!r} ran longer than {self._timeout_ms / 1000:g} s"
                )
                self._finish(job)

    def _finish(self, job: Job) -> None:
        """Settle a job whose handler ended (or was abandoned past its timeout)."""
        ended = HandlerEnded(job.error, job.handler_ms)
        if job.error is not None and self._spans:
            span = self._spans.get(id(job.delivery))
            if span is not None:
                span.failed(job.error)
        self._drive(job.flow, ended, job.settler, job.delivery, job.received_ms)


def _attempt(job: Job) -> int:
    return job.delivery.attempt
