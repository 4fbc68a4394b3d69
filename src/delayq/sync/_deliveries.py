"""What the blocking consumer does with a delivery, from its arrival to its settling.

Everything here runs in the connection's thread (pika's BlockingConnection is not
thread-safe): decoding, the store's claim, starting the handler in a thread
(:mod:`delayq.sync._threads`), then, when the handler has ended or overrun its
timeout, the store's complete or release, the republish and the ack. An outcome
from a channel that has since been lost is not acked on the new one (its tag would
name another delivery): the broker has the message back already.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from queue import Empty
from typing import Any, cast

import pika
from pydantic import BaseModel

from delayq.delivery import (
    ConsumeSettings,
    Decision,
    Delivery,
    DeliveryPlanner,
    Undecodable,
    decode_body,
    idempotency_key,
)
from delayq.errors import DelayqError, HandlerTimeout, StoreError
from delayq.idempotency import (
    Claim,
    ClaimStatus,
    Complete,
    IdempotencyStore,
    Release,
    TransactionalStore,
    call_in_transaction,
    run_ops,
    store_error,
)
from delayq.key_scope import KeyScope
from delayq.logcontext import bound_delivery
from delayq.observe import Observers
from delayq.stats import ConsumerStats
from delayq.sync._threads import HandlerThreads, Job
from delayq.sync.publisher import Publisher

__all__ = ["DeliveryFlow", "Incoming"]

log = logging.getLogger("delayq.consumer")

Incoming = tuple[Any, Any, pika.BasicProperties, bytes]
"""A delivery not yet started: (channel, method, properties, body)."""


class DeliveryFlow:
    """The delivery steps of :class:`~delayq.sync.Consumer` (which sets these attributes)."""

    queue: str
    stats: ConsumerStats
    _handler: Callable[..., Any]
    _planner: DeliveryPlanner
    _store: IdempotencyStore | None
    _transactional: bool
    _key: Callable[[Any], str] | None
    _key_scope: KeyScope
    _model: type[BaseModel] | None
    _settings: ConsumeSettings
    _timeout_ms: int
    _lease_ms: int
    _next_prune: float
    _return_pause_s: float
    _clock_ms: Callable[[], int]
    _publisher: Publisher
    _connection: pika.BlockingConnection | None
    _channel: Any
    _pending: collections.deque[Incoming]
    _threads: HandlerThreads
    _fatal: BaseException | None
    _stop: threading.Event
    _observers: Observers

    def _prune_when_due(self) -> None:
        """Forget keys past the retention period, every tenth of it (at most 10 min)."""
        if self._store is None or time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + self._settings.prune_every_ms / 1000
        try:
            try:
                self._store.prune(older_than_ms=self._clock_ms() - self._settings.retention_ms)
            except Exception as exc:
                raise store_error(self._store, exc) from exc
        except StoreError as exc:
            log.warning("pruning the idempotency store failed: %r", exc)

    def _start_pending(self) -> None:
        while self._pending and self._threads.free() > 0:
            job = self._begin(*self._pending.popleft())
            if job is not None:
                self._threads.submit(job)

    def _begin(
        self, channel: Any, method: Any, props: pika.BasicProperties, body: bytes
    ) -> Job | None:
        """Decode and claim a delivery; a :class:`Job` to run its handler, or ``None``
        when it is settled already (undecodable, duplicate, deferred, store down)."""
        received_ms = self._clock_ms()
        tag = method.delivery_tag
        delivery = Delivery(
            queue=self.queue,
            body=body,
            routing_key=method.routing_key or "",
            message_id=props.message_id,
            content_type=props.content_type,
            headers=props.headers or {},
            redelivered=bool(method.redelivered),
        )
        with bound_delivery(delivery):
            try:
                value = decode_body(delivery, self._model)
                key = idempotency_key(
                    value, delivery, self._key, required=self._transactional, scope=self._key_scope
                )
            except Undecodable as exc:
                decision = self._planner.undecodable(delivery, exc)
                self._perform(channel, tag, decision, delivery, received_ms)
                return None
            limited = self._planner.over_delivery_limit(delivery)
            if limited is not None:  # crashed its consumers too often (see H_RETURNS)
                self._perform(channel, tag, limited, delivery, received_ms)
                return None
            store = self._store if key is not None else None
            claim = Claim(key or "", self._lease_ms, self._clock_ms())
            if store is not None:
                try:
                    status = run_ops(store, [claim])[0]
                except StoreError as exc:
                    why = f"claiming its key failed: {exc}"
                    self._return(channel, tag, delivery.message_id, why)
                    return None
                if status is ClaimStatus.DONE:
                    decision = self._planner.duplicate()
                    self._perform(channel, tag, decision, delivery, received_ms)
                    return None
                if status is ClaimStatus.BUSY:
                    decision = self._planner.deferred(delivery)
                    self._perform(channel, tag, decision, delivery, received_ms)
                    return None
            # The job's context is copied here: the handler's thread logs with this
            # delivery's fields (see delayq.logcontext).
            return Job(
                channel,
                tag,
                delivery,
                received_ms,
                claim,
                store is not None,
                self._handler_call(value, claim),
            )

    def _handler_call(self, value: Any, claim: Claim) -> Callable[[], None]:
        """The handler's call for ``value``: within the store's transaction for a
        transactional consumer, which marks ``claim``'s key done in the same commit."""
        if self._transactional:
            return functools.partial(
                call_in_transaction,
                cast(TransactionalStore, self._store),
                self._handler,
                value,
                key=claim.key,
                lease_until_ms=claim.lease_until_ms,
                now_ms=self._clock_ms(),
            )
        return functools.partial(self._handler, value)

    def _settle_finished(self) -> None:
        while True:
            try:
                job = self._threads.finished.get_nowait()
            except Empty:
                return
            with bound_delivery(job.delivery):
                self._finish(job)

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
        store = self._store if job.keyed else None
        current = job.channel is self._channel
        error = job.error
        if error is not None:
            if store is not None:
                try:
                    run_ops(store, [Release(job.claim.key)])
                except StoreError as release_error:  # the claim's lease ends by itself
                    log.warning("releasing key %r failed: %s", job.claim.key, release_error)
            if not isinstance(error, Exception):
                # SystemExit & co: stop as asked; the delivery goes back unacked.
                self._fatal = self._fatal or error
                self._stop.set()
                return
            if current:
                decision = self._planner.failure(job.delivery, error)
                self._perform(
                    job.channel, job.tag, decision, job.delivery, job.received_ms, job.handler_ms
                )
            return
        if store is not None and not self._transactional:
            try:
                run_ops(store, [Complete(job.claim.key, self._clock_ms())])
            except StoreError as exc:
                why = f"recording its key as done failed: {exc}"
                self._return(job.channel, job.tag, job.delivery.message_id, why)
                return
        # A job from a lost channel: its key is recorded (the redelivery is a
        # duplicate), its tag means nothing on the new channel.
        if current:
            self._perform(
                job.channel,
                job.tag,
                self._planner.success(),
                job.delivery,
                job.received_ms,
                job.handler_ms,
            )

    def _return(self, channel: Any, tag: int, message_id: str | None, why: str) -> None:
        """Put a delivery back on the queue: its fate could not be made safe now."""
        if channel is not self._channel:
            return  # its channel is gone: the broker has it back already
        log.error("returning %s to %s: %s", message_id, self.queue, why)
        self.stats.returned += 1
        if self._connection is not None:
            self._connection.sleep(self._return_pause_s)  # keeps heartbeats flowing
        channel.basic_nack(tag, requeue=True)

    def _perform(
        self,
        channel: Any,
        tag: int,
        decision: Decision,
        delivery: Delivery,
        received_ms: int,
        handler_ms: float | None = None,
    ) -> None:
        if channel is not self._channel:
            return
        if decision.message is not None:
            try:
                self._publisher.send(decision.message)
            except DelayqError as exc:
                # Not safely elsewhere: back to the queue (the broker's delivery
                # limit dead-letters it if this keeps happening).
                why = f"its republish was not confirmed: {exc}"
                self._return(channel, tag, decision.message.message_id, why)
                return
        channel.basic_ack(tag)  # by tag, never multiple: handlers end in any order
        self.stats.record(decision)
        if self._observers:
            self._observers.emit(
                delivery,
                decision,
                received_at_ms=received_ms,
                settled_at_ms=self._clock_ms(),
                handler_ms=handler_ms,
            )
