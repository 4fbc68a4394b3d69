"""What the intake tests share: a bridge in a thread, a plugin-style publisher (raw
pika), and a settle period before the arrivals are taken as final."""

from __future__ import annotations

import threading
import time
from typing import Any

import pika

from delayq import Topology, build_declarations
from delayq.sync.bridge import Bridge
from delayq.topology.declarations import QueueDecl
from tests.amqp import depth
from tests.waiting import wait_for


class Running:
    """A bridge in a thread of its own."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.error: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        wait_for(lambda: bridge.started.is_set() or bool(self.error), 30, lambda: "bridge up")
        if self.error:
            raise self.error[0]

    def _run(self) -> None:
        try:
            self.bridge.run(install_signal_handlers=False)
        except BaseException as exc:
            self.error.append(exc)

    def stop(self) -> None:
        self.bridge.request_stop()
        self.thread.join(30)
        if self.error:
            raise self.error[0]


def with_intake(plain: Topology, kind: str = "topic") -> Topology:
    """``plain`` with one intake, ``plugin-<namespace>`` of ``kind``."""
    intakes = [{"exchange": f"plugin-{plain.namespace}", "type": kind}]
    return Topology.model_validate({**plain.model_dump(), "intakes": intakes})


def one_intake(ns: str) -> Topology:
    """The intake tests' usual topology: a 1 s tier, ``<ns>x.work`` bound to ``job.a``,
    and a direct intake ``plugin-<ns>``."""
    return Topology(
        namespace=ns, ladder=["1s"],
        destinations=[{"queue": f"{ns}x.work", "bindings": ["job.a"]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": "direct"}],
    )  # fmt: skip


def publish_plugin_style(url: str, exchange: str, messages: list[dict[str, Any]]) -> None:
    """What a plugin publisher does: basic.publish to the exchange, x-delay in headers."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for m in messages:
            m["sent_ms"] = time.time() * 1000
            channel.basic_publish(
                exchange,
                m["routing_key"],
                m["body"],
                pika.BasicProperties(
                    message_id=m["id"],
                    headers=m["headers"],
                    content_type="application/json",
                    correlation_id=f"corr-{m['id']}",
                    app_id="legacy-java",
                    reply_to="replies",
                ),
            )
    finally:
        connection.close()


def _depths(url: str, queues: list[str]) -> dict[str, int]:
    """Ready messages in each of ``queues`` (one connection, passive declares)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        return {q: int(channel.queue_declare(q, passive=True).method.message_count)
                for q in queues}  # fmt: skip
    finally:
        connection.close()


QUIET_S = 1.0
"""The settle period: no delivery for this long, every queue of the namespace empty,
before the arrivals are taken as final, so a late duplicate would be seen."""


def settled(collector: Any, url: str, topology: Any, count: int, timeout_s: float) -> list[Any]:
    """Every arrival at ``collector``, once ``count`` came, every queue of ``topology``
    (tiers, levels, intakes, destinations) is empty and no delivery came for
    :data:`QUIET_S`."""
    wait_for(
        lambda: len(collector.arrivals) >= count,
        timeout_s,
        lambda: f"{len(collector.arrivals)} of {count} arrivals",
    )
    queues = [d.name for d in build_declarations(topology) if isinstance(d, QueueDecl)]
    seen = {"count": -1, "since": 0.0}

    def quiet() -> bool:
        now, arrived = time.monotonic(), len(collector.arrivals)
        if arrived != seen["count"]:
            seen["count"], seen["since"] = arrived, now
            return False
        if now - seen["since"] < QUIET_S:
            return False
        full = {q: n for q, n in _depths(url, queues).items() if n}
        if full:
            seen["since"] = now  # still in flight: quiet counts from when they drain
        return not full

    wait_for(quiet, 60, lambda: f"quiet after {len(collector.arrivals)} arrivals")
    return list(collector.arrivals)


def lateness(arrivals: list[Any], percentile: float) -> tuple[float, float]:
    """The ``percentile`` of how late the bridged ``arrivals`` with a tier came past its
    TTL, counted from when the bridge took each, and the same percentile of the time
    from the bridge to the queue of those with none (the same run's noise).

    Those of no delay go from the bridge straight to the ready exchange, no tier: their
    time is the relay and the delivery under that very load (10,000 taken at once is
    seconds on a slow machine, where an absolute bound of 1 s failed with nothing late
    by delayq's doing). The tiers' promise is checked beyond it, the pattern of
    ``tests/integration/test_exact.py``'s controls: a message held on the way (a tier
    passed twice, a relay stuck) is a second or more later than the noise."""

    def at(values: list[float]) -> float:
        assert values, "no arrivals of that kind: nothing to compare"
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(len(ordered) * percentile))]

    def since_taken(a: Any) -> float:  # by the bridge
        return float(a.at_ms - int(a.headers["delayq-published-at"]))

    tiered = [a for a in arrivals if int(a.headers["delayq-tier-ms"]) > 0]
    late = [since_taken(a) - int(a.headers["delayq-tier-ms"]) for a in tiered]
    noise = [since_taken(a) for a in arrivals if int(a.headers["delayq-tier-ms"]) == 0]
    return at(late), at(noise)


def settled_except(collector: Any, url: str, topology: Any, kept: str) -> list[Any]:
    """The arrivals once no delivery came for ``QUIET_S`` and every queue of ``topology``
    but ``kept`` is empty (a late duplicate would be seen)."""
    queues = [d.name for d in build_declarations(topology) if isinstance(d, QueueDecl)]
    queues.remove(kept)
    seen = {"count": -1, "since": 0.0}

    def quiet() -> bool:
        now, count = time.monotonic(), len(collector.arrivals)
        if count != seen["count"] or any(depth(url, q) for q in queues):
            seen["count"], seen["since"] = count, now
            return False
        return now - seen["since"] >= QUIET_S

    wait_for(quiet, 60, lambda: f"quiet after {len(collector.arrivals)} arrivals")
    return list(collector.arrivals)
