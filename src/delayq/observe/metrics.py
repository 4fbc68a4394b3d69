"""Prometheus metrics for publishers and consumers (``pip install 'delayq[metrics]'``).

One :class:`PrometheusObserver` is a delivery observer (for ``Consumer``
and ``AsyncConsumer``), a publish observer (for ``Publisher`` and
``AsyncPublisher``) and a heal observer (for the watchdog of ``delayq worker
--heal``); it counts into its own ``CollectorRegistry`` unless given
one, and :func:`serve_metrics` exposes that registry over HTTP:

>>> metrics = PrometheusObserver()                                      # doctest: +SKIP
>>> server = serve_metrics(metrics.registry, port=9464)                 # doctest: +SKIP
>>> consumer = Consumer(url, topology, "orders.reminders", handle,      # doctest: +SKIP
...                     observers=[metrics])
>>> publisher = Publisher(url, topology, observers=[metrics])           # doctest: +SKIP

Labels take a small, fixed set of values (queue and tier names from the
topology, outcomes and reasons from enums): never a message id, a routing key
or an error text, so the number of series stays bounded.

This module imports without prometheus-client; creating an observer or a server
without it raises :class:`~delayq.errors.MissingExtra`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from delayq.consume.delivery import H_DEAD_LETTER_REASON, Action, DeadLetterReason
from delayq.errors import MissingExtra
from delayq.observe.deliveries import Settled
from delayq.observe.publishes import Published, PublishOutcome

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry

    from delayq.ops.heal import QueueSample
    from delayq.ops.watchdog import HealEvent

__all__ = [
    "HANDLER_BUCKETS_S",
    "LATENESS_BUCKETS_S",
    "METRICS",
    "MetricsServer",
    "PrometheusObserver",
    "serve_metrics",
]

LATENESS_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
"""Lateness buckets, seconds: from a busy consumer's few ms to an hour's backlog."""

HANDLER_BUCKETS_S: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
"""Handler duration buckets, seconds (the default ``handler_timeout`` is 5 min)."""

METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "delayq_published_total": (
        "counter",
        ("tier",),
        "Messages published and confirmed, by the tier they wait in ('immediate': no delay).",
    ),
    "delayq_publish_failed_total": (
        "counter",
        ("tier", "reason"),
        "Publishes that were not confirmed, by tier and reason (unroutable, rejected, "
        "unconfirmed, blocked, missing, refused, unreachable, failed).",
    ),
    "delayq_delivered_total": (
        "counter",
        ("queue", "outcome"),
        "Deliveries settled by a consumer, by queue and outcome (ack, duplicate, cancelled, "
        "retry, dead-letter).",
    ),
    "delayq_retried_total": (
        "counter",
        ("queue",),
        "Deliveries sent back through a retry tier (a failed attempt, or a key another "
        "consumer holds).",
    ),
    "delayq_dead_lettered_total": (
        "counter",
        ("queue", "reason"),
        "Deliveries moved to the queue's DLQ, by reason (exhausted, non-retryable, "
        "undecodable, delay-too-long).",
    ),
    "delayq_duplicates_total": (
        "counter",
        ("queue",),
        "Deliveries skipped because their idempotency key was already done.",
    ),
    "delayq_cancelled_total": (
        "counter",
        ("queue",),
        "Deliveries skipped because their message was cancelled, or rescheduled (an "
        "outdated copy).",
    ),
    "delayq_dead_letter_stalls_total": (
        "counter",
        ("queue", "outcome"),
        "Queues found holding dead letters that stopped moving (the heal watchdog), by "
        "queue and what was done (detected, healed, failed).",
    ),
    "delayq_parked_messages": (
        "gauge",
        ("queue",),
        "Messages in a tier, retry tier or cascade level queue (quorum) as the heal "
        "watchdog last sampled it (delayq worker --heal).",
    ),
    "delayq_handler_duration_seconds": (
        "histogram",
        ("queue",),
        "How long the handler ran, successful or not.",
    ),
    "delayq_lateness_seconds": (
        "histogram",
        ("tier",),
        "Received minus due, by the tier the message waited in ('immediate': no delay).",
    ),
}
"""Every metric: name as exposed, kind, labels and help text (also docs/guides/observing.md)."""

_DEAD_LETTER_REASONS = frozenset(reason.value for reason in DeadLetterReason)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise MissingExtra("delayq.observe.metrics", "metrics", "prometheus-client") from exc
    return prometheus_client


def dead_letter_reason(event: Settled) -> str:
    """The reason class of a dead-lettered delivery: one of :class:`DeadLetterReason`'s
    values, ``"other"`` for anything else (the free-text reason never becomes a label)."""
    message = event.decision.message
    value = None if message is None else message.headers.get(H_DEAD_LETTER_REASON)
    return value if value in _DEAD_LETTER_REASONS else "other"


class PrometheusObserver:
    """Counts settled deliveries and ended publishes into a Prometheus registry.

    ``registry`` defaults to a fresh ``CollectorRegistry`` (tests and several
    observers in one process do not collide); pass
    ``prometheus_client.REGISTRY`` to expose them with your other metrics.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        lateness_buckets_s: Sequence[float] = LATENESS_BUCKETS_S,
        handler_buckets_s: Sequence[float] = HANDLER_BUCKETS_S,
    ) -> None:
        prom = _prometheus()
        self.registry: CollectorRegistry = (
            registry if registry is not None else prom.CollectorRegistry()
        )

        def make(name: str, **kwargs: Any) -> Any:
            kind, labels, text = METRICS[name]
            if kind == "counter":
                # prometheus-client adds the _total suffix itself.
                return prom.Counter(
                    name.removesuffix("_total"), text, labels, registry=self.registry
                )
            if kind == "gauge":
                return prom.Gauge(name, text, labels, registry=self.registry)
            return prom.Histogram(name, text, labels, registry=self.registry, **kwargs)

        self.published_total = make("delayq_published_total")
        self.publish_failed_total = make("delayq_publish_failed_total")
        self.delivered_total = make("delayq_delivered_total")
        self.retried_total = make("delayq_retried_total")
        self.dead_lettered_total = make("delayq_dead_lettered_total")
        self.duplicates_total = make("delayq_duplicates_total")
        self.cancelled_total = make("delayq_cancelled_total")
        self.dead_letter_stalls_total = make("delayq_dead_letter_stalls_total")
        self.parked_messages = make("delayq_parked_messages")
        self.handler_seconds = make(
            "delayq_handler_duration_seconds", buckets=tuple(handler_buckets_s)
        )
        self.lateness_seconds = make("delayq_lateness_seconds", buckets=tuple(lateness_buckets_s))

    # DeliveryObserver
    def settled(self, event: Settled) -> None:
        queue = event.queue
        action = event.action
        if action is Action.RETRY:
            self.retried_total.labels(queue).inc()
        elif action is Action.DEAD_LETTER:
            self.dead_lettered_total.labels(queue, dead_letter_reason(event)).inc()
        elif action is Action.DUPLICATE:
            self.duplicates_total.labels(queue).inc()
        elif action is Action.CANCELLED:
            self.cancelled_total.labels(queue).inc()
        if event.handler_ms is not None:
            self.handler_seconds.labels(queue).observe(event.handler_ms / 1000)
        lateness_ms = event.lateness_ms
        if lateness_ms is not None:
            self.lateness_seconds.labels(event.tier or "unknown").observe(lateness_ms / 1000)
        # Last: whoever sees a delivery counted here sees every other series of it too.
        self.delivered_total.labels(queue, event.outcome).inc()

    # HealObserver (delayq.ops.watchdog)
    def heal_event(self, event: HealEvent) -> None:
        self.dead_letter_stalls_total.labels(event.stall.queue, event.outcome.value).inc()

    def heal_samples(self, samples: Sequence[QueueSample]) -> None:
        for sample in samples:
            self.parked_messages.labels(sample.queue).set(sample.messages)

    # PublishObserver
    def published(self, event: Published) -> None:
        if event.outcome is PublishOutcome.CONFIRMED:
            self.published_total.labels(event.tier).inc()
        else:
            self.publish_failed_total.labels(event.tier, event.outcome.value).inc()


@dataclass
class MetricsServer:
    """The HTTP endpoint serving a registry at ``/metrics`` (any path answers)."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def host(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        """The port it listens on (the one chosen when asked for port 0)."""
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def serve_metrics(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve ``registry`` over HTTP on ``addr:port`` (port 0: any free port) in a daemon
    thread. The default address is loopback: pass ``"0.0.0.0"`` to be scraped from
    other hosts."""
    prom = _prometheus()
    server, thread = prom.start_http_server(port, addr, registry=registry)
    return MetricsServer(server, thread)
