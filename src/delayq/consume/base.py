"""What every consumer shares before any I/O: its arguments, checks and bookkeeping.

:class:`ConsumerBase` holds the one constructor signature of
:class:`~delayq.sync.Consumer` and :class:`~delayq.aio.AsyncConsumer` (and so of
their memory twins): the checks on the handler and the settings, the planner,
the :class:`~delayq.consume.flow.FlowContext` the delivery flow runs with, the
counters and the observers, and what happens once a delivery is settled. The
adapters add only their I/O (``_adapt`` takes the handler and the store in the
shape each one runs them).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypedDict

from pydantic import BaseModel

from delayq.consume.delivery import Delivery
from delayq.consume.flow import Ack, FlowContext
from delayq.consume.handlers import check_handler
from delayq.consume.planner import DeliveryPlanner
from delayq.consume.retention import check_mark_retention
from delayq.consume.retry import RetryPolicy
from delayq.consume.settings import ConsumeSettings
from delayq.message.envelope import epoch_ms
from delayq.observe.deliveries import DeliveryObserver, Observers
from delayq.observe.stats import ConsumerStats
from delayq.observe.tracing import ProcessSpan, TracingOption, tracing_for
from delayq.stores.base import CancellingStore, IdempotencyStore, check_transactional
from delayq.stores.key_scope import KeyScope
from delayq.topology.model import Topology
from delayq.urls import check_vhost, redact, resolve_url

__all__ = ["ConsumerBase", "PruneSchedule"]

log = logging.getLogger("delayq.consumer")


class PruneSchedule:
    """When a consumer forgets old idempotency keys: every ``every_ms`` on its clock
    (a memory broker's virtual time in tests), keys older than ``retention_ms``."""

    __slots__ = ("_every_ms", "_next_ms", "_retention_ms")

    def __init__(self, every_ms: int, retention_ms: int) -> None:
        self._every_ms = every_ms
        self._retention_ms = retention_ms
        self._next_ms = 0

    def due(self, now_ms: int) -> int | None:
        """The cutoff (``older_than_ms``) when a prune is due at ``now_ms``, else ``None``."""
        if now_ms < self._next_ms:
            return None
        self._next_ms = now_ms + self._every_ms
        return now_ms - self._retention_ms


def _check_marks_outlive_copies(
    store: object, retention_ms: int, planner: DeliveryPlanner, queue: str
) -> None:
    """Refuse a retention (the consumer's, a RedisStore's TTL) that would prune a cancel
    mark before the last copy it stops can arrive (see :mod:`delayq.consume.retention`).
    Without a store, or with one that keeps no marks, there is nothing to outlive."""
    if store is None or not isinstance(store, CancellingStore):
        return
    topology, policy = planner.topology, planner.policy
    check_mark_retention(retention_ms, topology, policy, queue=queue)
    ttl = getattr(store, "retention_ms", None)
    if isinstance(ttl, int) and not isinstance(ttl, bool):
        check_mark_retention(ttl, topology, policy, what=f"{store!r} retention_ms", queue=queue)


class RepublisherOptions(TypedDict):
    """What a consumer passes the publisher of its retries and dead letters."""

    clock_ms: Callable[[], int]
    link: Any  # a Link or an AsyncLink (None: the URL's)
    tracing: bool
    reconnect_within: None


class ConsumerBase:
    """The shared part of the consumers; subclasses set ``_sync`` and ``_adapt``."""

    _sync: ClassVar[bool]
    """Whether handlers run in threads only (a coroutine handler is refused)."""
    _name: ClassVar[str]
    """The public class name, for reprs."""
    _feed: Any

    def __init__(
        self,
        url: str | None,
        topology: Topology,
        queue: str,
        handler: Callable[..., Any],
        *,
        policy: RetryPolicy | None = None,
        store: IdempotencyStore | None = None,
        key: Callable[[Any], str] | None = None,
        key_scope: KeyScope | str = KeyScope.QUEUE,
        model: type[BaseModel] | None = None,
        prefetch: int = 50,
        concurrency: int | None = None,
        handler_timeout: object = "5m",
        stuck_grace: object = "1m",
        lease: object = None,
        retention: object = "7d",
        check_retention: bool = True,
        non_retryable: tuple[type[BaseException], ...] = (),
        transactional: bool = False,
        observers: Iterable[DeliveryObserver] = (),
        clock_ms: Callable[[], int] = epoch_ms,
        rng: random.Random | None = None,
        scrubber: Callable[[str], str] | None = None,
        feed: Any = None,
        link: Any = None,
        tracing: TracingOption = None,
    ) -> None:
        check_handler(handler, sync=self._sync, transactional=transactional)
        self._tracing = tracing_for(tracing)
        if transactional:
            check_transactional(store, handler)
        settings = ConsumeSettings.parse(
            prefetch=prefetch,
            handler_timeout=handler_timeout,
            lease=lease,
            retention=retention,
            concurrency=concurrency,
            stuck_grace=stuck_grace,
        )
        self._url = resolve_url(url)
        check_vhost(topology.declared_vhost, self._url)
        # Where deliveries come from (see delayq.links): the URL's scheme chooses it.
        self._feed = feed if feed is not None else self._open_feed(self._url)
        if clock_ms is epoch_ms and self._feed.clock_ms is not None:
            clock_ms = self._feed.clock_ms  # the broker's own: a memory broker's virtual time
        self.topology = topology
        self.queue = queue
        self._planner = DeliveryPlanner(
            topology,
            queue,
            policy=policy,
            non_retryable=non_retryable,
            clock_ms=clock_ms,
            rng=rng,
            scrubber=scrubber,  # error text is scrubbed of credentials (delayq.scrub)
        )
        if check_retention:
            _check_marks_outlive_copies(store, settings.retention_ms, self._planner, queue)
        self._transactional = transactional
        self._prefetch = prefetch
        self._settings = settings
        self._timeout_ms = settings.handler_timeout_ms
        self._lease_ms = settings.lease_ms
        self._clock_ms = clock_ms
        self._return_pause_s = 1.0
        self._flow_context = FlowContext(
            planner=self._planner,
            model=model,
            key=key,
            key_scope=KeyScope.parse(key_scope),
            keyed_store=store is not None,
            transactional=transactional,
            lease_ms=settings.lease_ms,
            clock_ms=clock_ms,
        )
        self._link = link
        """What retries and dead letters are published through (``None``: the URL's)."""
        self._prunes = PruneSchedule(settings.prune_every_ms, settings.retention_ms)
        self.stats = ConsumerStats()
        self._observers = Observers(observers)
        self._adapt(handler, store)

    @property
    def feed(self) -> Any:
        """Where this consumer's deliveries come from (see :mod:`delayq.links`)."""
        return self._feed

    def _open_feed(self, url: str) -> Any:
        """The feed :mod:`delayq.links` names for ``url`` (no I/O yet)."""
        raise NotImplementedError

    def _adapt(self, handler: Callable[..., Any], store: IdempotencyStore | None) -> None:
        """Keep ``handler`` and ``store`` in the shape this adapter runs them."""
        raise NotImplementedError

    def _republisher_options(self) -> RepublisherOptions:
        """The options of the publisher a consumer sends its retries and dead letters with.

        Connection rounds only (``reconnect_within=None``), as before the publishers'
        reconnect budget: a broker lost here has usually taken the feed's connection too,
        so the delivery goes back to the queue anyway, and a republish that waited for
        the broker would only add a copy of the retry its redelivery sends again."""
        return {
            "clock_ms": self._clock_ms,
            "link": self._link,
            "tracing": False,
            "reconnect_within": None,
        }

    def __repr__(self) -> str:
        return f"{self._name}(url={redact(self._url)!r}, queue={self.queue!r})"

    def _settled(self, delivery: Delivery, ack: Ack, received_ms: int) -> None:
        """The delivery is acked: count it and tell the observers."""
        self.stats.record(ack.decision)
        if self._observers:
            self._observers.emit(
                delivery,
                ack.decision,
                received_at_ms=received_ms,
                settled_at_ms=self._clock_ms(),
                handler_ms=ack.handler_ms,
            )

    def _trace(self, delivery: Delivery, received_ms: int) -> ProcessSpan | None:
        """The delivery's ``process`` span, when traced (see :mod:`delayq.observe.tracing`)."""
        tracing = self._tracing
        if tracing is None:
            return None
        try:
            return tracing.processing(delivery, received_ms)
        except Exception as exc:  # tracing never fails a delivery
            log.warning("no span for %s: %r", delivery.message_id, exc)
            return None

    def _putting_back(self, delivery: Delivery, why: str) -> None:
        """The delivery goes back to its queue unacked (the adapter pauses, then nacks)."""
        log.error("returning %s to %s: %s", delivery.message_id, self.queue, why)
        self.stats.returned += 1
