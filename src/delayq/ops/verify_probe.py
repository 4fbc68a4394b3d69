"""The dead-lettering probe of ``delayq topology verify``, pure: what the probe queue is
(:func:`plan_probe`) and how its outcome is judged (:func:`check_probe`); the adapter
that runs it over AMQP is :mod:`delayq.sync.probe`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from delayq.durations import format_ms
from delayq.errors import InvalidInput
from delayq.ops.verify import Check, Status
from delayq.topology.declarations import QueueDecl, rung_arguments
from delayq.topology.model import Topology

__all__ = ["PROBE_EXPIRES_MS", "ProbePlan", "check_probe", "plan_probe"]

PROBE_EXPIRES_MS = 60_000
"""The probe queue's ``x-expires``: a verify killed midway leaves nothing behind for long."""


@dataclass(frozen=True)
class ProbePlan:
    """A throwaway queue wired like a tier, and the inbox its message must reach.

    The probe message is published to ``queue`` through the default exchange
    (routing key: the queue's name), expires after ``ttl_ms``, is dead-lettered
    into the ready exchange with that routing key, and must reach ``inbox``
    (bound to the ready exchange with it) within ``bound_ms``.
    """

    queue: QueueDecl
    inbox: str
    exchange: str
    routing_key: str
    message_id: str
    ttl_ms: int
    bound_ms: int
    headers: Mapping[str, str] = field(default_factory=dict)
    """In a namespace routed by headers: the message's headers, and the inbox's binding
    table on ``exchange`` (the headers exchange, which every due message reaches)."""


def plan_probe(
    topology: Topology, token: str, *, ttl_ms: int = 200, bound_ms: int = 10_000
) -> ProbePlan:
    """The probe for ``topology``; ``token`` (hex) makes its names unique."""
    if not re.fullmatch(r"[0-9a-f]{4,32}", token):
        raise InvalidInput(f"probe token must be 4 to 32 lowercase hex digits, not {token!r}")
    if ttl_ms < 1 or bound_ms < 1:
        raise InvalidInput("the probe's TTL and bound must be at least 1 ms")
    name = f"{topology.namespace}.verify.{token}"
    arguments = {
        **rung_arguments(topology.queue_type, ttl_ms, topology.ready_exchange),
        "x-expires": PROBE_EXPIRES_MS,
    }
    # A namespace routed by headers sends every due message on to its headers exchange,
    # whose alternate would park a probe that matched no table: the inbox binds there.
    by_headers = topology.routes_by_headers
    return ProbePlan(
        queue=QueueDecl(name, arguments, role="probe"),
        inbox=f"{name}.in",
        exchange=topology.headers_exchange if by_headers else topology.ready_exchange,
        routing_key=name,
        message_id=f"delayq-verify-{token}",
        ttl_ms=ttl_ms,
        bound_ms=bound_ms,
        headers={"delayq-verify": token} if by_headers else {},
    )


def check_probe(
    plan: ProbePlan,
    arrived_after_ms: int | None,
    error: str | None = None,
    leftover: str | None = None,
) -> Check:
    """Judge the probe: the message arrived in the inbox in time, or why not.

    ``error`` says why the probe could not run; ``leftover`` why a probe queue
    could not be deleted afterwards (which fails the check too).
    """
    if leftover is not None:
        inner = check_probe(plan, arrived_after_ms, error)
        return Check(
            inner.subject,
            Status.FAIL,
            f"{inner.detail}; {leftover} (it expires by itself after "
            f"{format_ms(PROBE_EXPIRES_MS)} unused)",
        )
    subject = "dead-lettering probe"
    kind = str(plan.queue.arguments.get("x-queue-type", "classic"))
    strategy = plan.queue.arguments.get("x-dead-letter-strategy", "at-most-once")
    wiring = f"{kind} queue {plan.queue.name} (TTL {format_ms(plan.ttl_ms)}, {strategy})"
    if error is not None:
        return Check(subject, Status.FAIL, f"could not run the probe: {error}")
    if arrived_after_ms is None or arrived_after_ms > plan.bound_ms:
        return Check(
            subject,
            Status.FAIL,
            f"a message expired from {wiring} did not reach {plan.inbox} through "
            f"{plan.exchange} within {format_ms(plan.bound_ms)}: dead-lettering does not "
            "fire on this broker as delayq needs (check the broker log, feature flags "
            "and policies on the namespace's queues)",
        )
    return Check(
        subject,
        Status.OK,
        f"expired from {wiring}, arrived through {plan.exchange} after "
        f"{arrived_after_ms / 1000:.2f} s",
    )
