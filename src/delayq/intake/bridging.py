"""What a bridge is made of besides its loop (pure: no I/O): its figures, the intake it
bridges, the acks settling its window, and the bounds of its stop."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from delayq.durations import to_ms
from delayq.errors import InvalidInput, PublishError, PublishUnconfirmed
from delayq.intake.relay import Park
from delayq.intake.window import Settled, coalesce
from delayq.topology.intakes import Intake
from delayq.topology.model import Topology

__all__ = [
    "HURRY_MARGIN_S",
    "IO_JOIN_S",
    "MAX_STOP_GRACE_S",
    "STOP_GRACE",
    "STOP_MARGIN_S",
    "Acking",
    "BridgeStats",
    "acknowledge",
    "check_stop_grace",
    "pick_intake",
    "unconfirmed_at_stop",
]

log = logging.getLogger("delayq.bridge")

STOP_GRACE = "10s"
"""How long a stopping bridge waits for the confirms of what it has in flight."""

MAX_STOP_GRACE_S = 3600.0
"""The longest ``stop_grace`` taken: a stop that may wait longer is no bound."""

IO_JOIN_S = 3.0
"""How long a stopping bridge waits for the broker to answer its ``Basic.Cancel`` and
its ``Connection.Close`` (each): a broker that does not answer has its connection
dropped (what is unacked goes back to the intake queue all the same)."""

STOP_MARGIN_S = 10.0
"""Beyond its ``stop_grace``, how long a stop may take to close the bridge's connection
(:data:`IO_JOIN_S` twice included) before a worker stops waiting for it."""

HURRY_MARGIN_S = 3.0
"""After a second stop request, how long the bridges have to close before they are left
behind."""


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
    """Deliveries rejected to the intake's DLQ, as they came: headers that cannot be read
    or written again, or a park of ``bridge-error`` that failed too."""
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


class Acking(Protocol):
    """A consuming channel's acks (pika's names)."""

    def basic_ack(self, delivery_tag: int, multiple: bool) -> None: ...

    def basic_reject(self, delivery_tag: int, requeue: bool) -> None: ...


def acknowledge(
    channel: Acking, done: list[Settled], stats: BridgeStats, queue: str, dlq: str
) -> tuple[int, int]:
    """Ack and nack ``done`` on the consuming ``channel`` (each run of confirmed ones with
    one ``multiple`` ack), counted in ``stats``: how many were confirmed, and how many the
    broker refused (one log line for those, not one each: a full tier refuses thousands)."""
    if not done:
        return 0, 0
    for step, tag in coalesce(done):
        if step == "ack":
            channel.basic_ack(tag, True)
        else:
            channel.basic_reject(tag, True)  # counted on 4.3 too
    refused: list[Settled] = []
    for item in done:
        plan = item.plan
        if item.error is not None:
            refused.append(item)
        elif isinstance(plan, Park):
            stats.parked += 1
            log.warning("parked %s in %s: %s", plan.message.message_id, dlq, plan.reason)
        else:
            stats.forwarded += 1
    if refused:
        stats.returned += len(refused)
        first = refused[0]
        log.warning(
            "%d of %s not taken by the %s (%s: %s%s): back to the intake queue",
            len(refused),
            queue,
            "broker" if isinstance(first.error, PublishError) else "schedule index",
            first.plan.message.message_id,
            first.error,
            f"; and {len(refused) - 1} more" if len(refused) > 1 else "",
        )
    return len(done) - len(refused), len(refused)
