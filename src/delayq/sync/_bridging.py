"""What :mod:`delayq.sync.bridge` is made of besides its loop: its figures, the intake it
bridges, the properties it reads off a delivery, and the bounds of its stop."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from delayq.durations import to_ms
from delayq.errors import BrokerError, InvalidInput, PublishUnconfirmed
from delayq.intake.relay import Park
from delayq.sync._errors import CONNECTION_ERRORS
from delayq.sync._intake_stream import Settled, coalesce
from delayq.topology.intakes import Intake
from delayq.topology.model import Topology

if TYPE_CHECKING:
    from delayq.sync.bridge import Bridge

__all__ = [
    "HURRY_MARGIN_S",
    "IO_JOIN_S",
    "MAX_STOP_GRACE_S",
    "PROPERTIES",
    "STOP_GRACE",
    "STOP_MARGIN_S",
    "BridgeStats",
    "acknowledge",
    "check_stop_grace",
    "join_bridges",
    "no_wake",
    "pick_intake",
    "unconfirmed_at_stop",
    "wake_by",
]

log = logging.getLogger("delayq.bridge")

STOP_GRACE = "10s"
"""How long a stopping bridge waits for the confirms of what it has in flight."""

MAX_STOP_GRACE_S = 3600.0
"""The longest ``stop_grace`` taken: a stop that may wait longer is no bound."""

IO_JOIN_S = 3.0
"""How long a bridge leaving its channel waits for its stream's I/O thread to end (it
was told to drop its connection at once); one stuck in a write is left to end on its
own (a daemon thread)."""

STOP_MARGIN_S = 10.0
"""Beyond its ``stop_grace``, how long a stop may take to close the bridge's connections
(its I/O thread's :data:`IO_JOIN_S` included) before a worker stops waiting for it."""

PROPERTIES = (
    "content_type",
    "content_encoding",
    "headers",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)
"""The properties of a delivery the relay reads (pika's names)."""


@dataclass
class BridgeStats:
    """What a bridge did since it started."""

    forwarded: int = 0
    """Messages confirmed into their tier (or the cascade, or at once when due now)."""
    parked: int = 0
    """Messages confirmed into the intake's DLQ, with their reason."""
    returned: int = 0
    """Deliveries put back on the intake queue: the broker did not take their publish."""
    rejected: int = 0
    """Deliveries rejected to the intake's DLQ, as they came: headers pika cannot read or
    write again, or a park of ``bridge-error`` that failed too."""
    reconnects: int = 0
    abandoned: int = 0
    """Deliveries still unconfirmed when a stop's grace ran out: left unacked, back in the
    intake queue."""


def pick_intake(topology: Topology, name: str | None) -> Intake:
    """The intake of ``topology`` named ``name`` (the only one when ``None``)."""
    if not topology.intakes:
        raise InvalidInput(
            f"topology {topology.namespace!r} declares no intakes: add one under `intakes`"
        )
    if name is None:
        if len(topology.intakes) > 1:
            names = ", ".join(i.exchange for i in topology.intakes)
            raise InvalidInput(f"the topology has several intakes ({names}): name one")
        return topology.intakes[0]
    for intake in topology.intakes:
        if intake.exchange == name:
            return intake
    names = ", ".join(i.exchange for i in topology.intakes)
    raise InvalidInput(f"the topology has no intake {name!r} (it has: {names})")


def check_stop_grace(value: object, what: str = "stop_grace") -> float:
    """``value`` (a duration: ``"10s"``, a ``timedelta``) in seconds, from 0 to
    :data:`MAX_STOP_GRACE_S`, else :class:`~delayq.errors.InvalidInput`."""
    seconds = to_ms(value, what=what) / 1000
    if seconds > MAX_STOP_GRACE_S:
        raise InvalidInput(
            f"{what} {value!r} is longer than {MAX_STOP_GRACE_S / 3600:g} h: a stop must "
            "end in a bounded time (what is unconfirmed then goes back to the intake queue)"
        )
    return seconds


def unconfirmed_at_stop(queue: str, count: int, after: str) -> PublishUnconfirmed:
    """What a bridge raises when its stop left ``count`` deliveries of ``queue``
    unconfirmed ``after`` its grace (or a second stop request)."""
    return PublishUnconfirmed(
        f"the bridge of {queue} stopped with {count} deliveries unconfirmed after {after} "
        "(a broker blocking publishers, or not confirming): they are left unacked, back in "
        f"{queue}, and the next bridge sends them again under the same message ids "
        "(duplicates an idempotent consumer skips); nothing confirmed was lost"
    )


def acknowledge(
    channel: Any, done: list[Settled], stats: BridgeStats, queue: str, dlq: str
) -> bool:
    """Ack and nack ``done`` on the consuming ``channel`` (each run of confirmed ones with
    one ``multiple`` ack), counted in ``stats``; whether the broker refused any."""
    if not done:
        return False
    for step, tag in coalesce(done):
        if step == "ack":
            channel.basic_ack(tag, multiple=True)
        else:
            channel.basic_reject(tag, requeue=True)  # counted on 4.3 too
    refused = False
    for item in done:
        plan = item.plan
        if item.error is not None:
            refused = True
            log.warning(
                "%s of %s not taken by the broker (%s): back to the intake queue",
                plan.message.message_id,
                queue,
                item.error,
            )
            stats.returned += 1
        elif isinstance(plan, Park):
            stats.parked += 1
            log.warning("parked %s in %s: %s", plan.message.message_id, dlq, plan.reason)
        else:
            stats.forwarded += 1
    return refused


def no_wake() -> None:
    """No consuming connection to wake."""


def wake_by(connection: Any) -> Callable[[], None]:
    """Wake the consuming thread of ``connection`` (pika's blocking connection) from the
    I/O thread (a closed connection: nobody to)."""

    def wake() -> None:
        try:
            connection.add_callback_threadsafe(no_wake)
        except CONNECTION_ERRORS:
            pass  # closing: the consuming thread is leaving, or reconnecting

    return wake


HURRY_MARGIN_S = 3.0
"""After a second stop request, how long the bridges have to close before they are left
behind."""


def join_bridges(
    bridges: list[Bridge],
    threads: list[threading.Thread],
    failed: Callable[[str, BaseException], None],
    hurry: threading.Event,
) -> None:
    """Wait for the stopping bridges, each up to its stop grace and
    :data:`~delayq.sync._bridging.STOP_MARGIN_S` (from now), or :data:`HURRY_MARGIN_S`
    from a second stop request (``hurry``); one still running then is left behind (a
    daemon thread: closing a connection to a broker that does not answer), a failure of
    the run."""
    if not bridges:
        return
    until = time.monotonic() + max(b.stop_grace_s for b in bridges) + STOP_MARGIN_S
    hurried = False
    for bridge, thread in zip(bridges, threads, strict=True):
        while thread.is_alive() and time.monotonic() < until:
            thread.join(min(0.1, max(0.0, until - time.monotonic())))
            if hurry.is_set() and not hurried:
                hurried = True
                until = min(until, time.monotonic() + HURRY_MARGIN_S)
        if thread.is_alive():
            bound_s = HURRY_MARGIN_S if hurried else bridge.stop_grace_s + STOP_MARGIN_S
            log.error("bridge of %s did not stop within %g s; left behind", bridge.queue, bound_s)
            failed(
                bridge.queue,
                BrokerError(
                    f"the bridge of {bridge.queue} did not stop within {bound_s:g} s of the "
                    f"{'second ' if hurried else ''}stop (its stream stuck: a broker not "
                    "reading, a write that does not return); it was left behind, and its "
                    f"unacked deliveries go back to {bridge.queue} when its connection closes "
                    "(the process exits)"
                ),
            )
