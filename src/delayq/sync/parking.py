"""Browsing, replaying and purging parked messages (``<queue>.dlq``, ``<ns>.unrouted``) with pika.

Browsing takes messages with ``basic.get`` and holds them unacknowledged until
the end, then returns them all to the queue in their order: nothing is removed,
and nothing is seen twice. RabbitMQ 4.x quorum queues count each return against a
delivery limit (20 unless the queue says otherwise), so delayq declares its parked
queues with a limit no browse reaches (:data:`~delayq.topology.declarations.PARKED_DELIVERY_LIMIT`)
and, on 4.x, refuses to browse one declared without it (:class:`~delayq.errors.ParkedAtRisk`):
the browse would end by deleting what it looked at.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from pika.adapters.blocking_connection import BlockingChannel

from delayq.errors import ConnectionFailed, ScheduleNotRecorded, StoreError
from delayq.message.cancel import target_queues
from delayq.message.carried import unwritable
from delayq.message.envelope import OutgoingMessage, epoch_ms
from delayq.observe.replays import replaying
from delayq.observe.tracing import TracingOption, tracing_for
from delayq.ops.pace import check_rate
from delayq.ops.parked import H_REPLAYED_AT, ParkedMessage, find_id, may_name, replay_message
from delayq.ops.replay_marks import ReplayMarks
from delayq.schedule.replays import ReplayRecord
from delayq.sync._connection import close_quietly
from delayq.sync._errors import CHANNEL_CLOSED, CONNECTION_ERRORS, channel_error
from delayq.sync._parked_queue import Identify, ready
from delayq.sync._parked_queue import open_parked as _open
from delayq.sync._parked_queue import parked as _parked
from delayq.sync._parked_queue import unsendable as _unsendable
from delayq.sync.publisher import Publisher
from delayq.topology.model import Topology
from delayq.urls import check_vhost, resolve_url

__all__ = ["ReplayReport", "browse", "purge", "replay"]

log = logging.getLogger("delayq.parking")

GIVE_BACK_WAIT_S = 5.0
"""How long a browse or replay waits for the broker to count the messages it returns."""
GIVE_BACK_POLL_S = 0.005


@dataclass
class ReplayReport:
    replayed: list[str] = field(default_factory=list)
    """Message ids sent again (and removed from the parking queue)."""
    seen: int = 0
    """Messages looked at."""
    missing: list[str] = field(default_factory=list)
    """Ids asked for that were not found."""
    returned: list[str] = field(default_factory=list)
    """Ids sent again that came straight back to the parking queue (an unrouted message
    whose routing key still matches no binding): parked again, not replayed."""
    kept: list[str] = field(default_factory=list)
    """Ids left parked: their headers cannot be read, or cannot be sent again (a header
    name that is not UTF-8, a value pika cannot write), as the log says."""
    unrecorded: list[str] = field(default_factory=list)
    """Ids replayed whose entry the schedule index could not move on (``record``)."""
    clashing: list[str] = field(default_factory=list)
    """Ids left parked: each waits in another namespace of the schedule index (``record``),
    which holds one entry per id."""


def browse(
    url: str | None,
    queue: str,
    *,
    limit: int = 100,
    dead_letters_of: str | None = None,
    identify: Identify | None = None,
) -> list[ParkedMessage]:
    """Up to ``limit`` messages from the head of ``queue``, left in place.

    ``dead_letters_of``: the queue that dead-letters into ``queue`` (a DLQ's
    destination), so :attr:`ParkedMessage.reason` can tell the broker's reasons.
    ``identify``: the id of a message published without one (see :data:`Identify`).
    A message whose headers pika cannot read is listed with the reason
    :data:`~delayq.sync._parked_queue.UNREADABLE_HEADERS`.
    """
    connection, channel, _, warning = _open(url, queue)
    found: list[ParkedMessage] = []
    try:
        while len(found) < limit:
            method, props, body = channel.basic_get(queue, auto_ack=False)
            if warning is not None:  # the queue could be read: the warning is worth it
                log.warning("%s", warning)
                warning = None
            if method is None:
                break
            found.append(_parked(queue, method, props, body, dead_letters_of, identify))
        _give_back(channel, queue, len(found))
    except CHANNEL_CLOSED as exc:  # e.g. ACCESS_REFUSED: may not read it
        raise channel_error(exc) from exc
    finally:
        close_quietly(connection)
    return found


def replay(
    url: str | None,
    queue: str,
    topology: Topology,
    *,
    target: Callable[[ParkedMessage], tuple[str, str]],
    ids: Collection[str] | None = None,
    rate_per_s: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    marks: ReplayMarks | None = None,
    tracing: TracingOption = None,
    identify: Identify | None = None,
    record: ReplayRecord | None = None,
    destinations: Callable[[ParkedMessage], tuple[str, ...]] | None = None,
) -> ReplayReport:
    """Send parked messages again and remove them from ``queue`` once confirmed.

    ``target`` gives each message's (exchange, routing key); ``ids`` selects
    messages by id (``None``: all that were parked when the replay started);
    ``rate_per_s`` (above 0) bounds the pace. A copy the broker routes straight
    back into ``queue`` (an unrouted message whose key no binding takes yet) is
    listed in ``returned``, not ``replayed``. A message is removed only once
    its copy is confirmed: a replay that stops half-way (connection lost:
    :class:`~delayq.errors.ConnectionFailed`; destination gone:
    :class:`~delayq.errors.Unroutable`) leaves the others parked.

    ``marks``: the consumers' store, consulted for each message before it is sent (see
    :mod:`delayq.ops.replay_marks`): its cancel is looked up, or cleared with
    ``marks.uncancel``; the answers land in ``marks.found``. A store failure stops the
    replay (:class:`~delayq.errors.StoreError`): the message it was for and the rest
    stay parked.

    ``identify``: the id of a message published without one (see :data:`Identify`),
    which its copy then carries. A message whose headers pika cannot read is left parked.

    ``record``: the schedule index each copy is written into (see
    :mod:`delayq.schedule.replays`), under the queues ``destinations`` names for it (by
    default, those its routing key reaches); an index that cannot take a copy stops the
    replay (:class:`~delayq.errors.ScheduleNotRecorded`) with it and the rest parked.

    ``tracing``: as a publisher's (:mod:`delayq.observe.tracing`): when traced, each
    message's replay is a span of its own trace (:mod:`delayq.observe.replays`).

    A ``topology`` that names another vhost than the URL's is refused before anything is
    opened (:class:`~delayq.errors.InvalidInput`, :func:`delayq.urls.check_vhost`).
    """
    if rate_per_s is not None:  # a rate of 1e-300 a second once overflowed a sleep
        rate_per_s = check_rate(rate_per_s)
    url = resolve_url(url)
    # Before the parking queue is opened: the publisher refuses another vhost, but only
    # once the queue's messages are being taken.
    check_vhost(topology.declared_vhost, url)
    wanted = None if ids is None else set(ids)
    traces = tracing_for(tracing)

    def reached(parked: ParkedMessage) -> tuple[str, ...]:
        exchange, key = target(parked)  # the default exchange: the queue named by the key
        return (key,) if exchange == "" else tuple(target_queues(topology, key))

    report = ReplayReport()
    # Replaying all of them returns none (only copies routed straight back): the way
    # to empty a queue too risky to browse.
    connection, channel, total, warning = _open(url, queue, returns=wanted is not None)
    interval = 1.0 / rate_per_s if rate_per_s else 0.0
    stamps: dict[str, object] = {}  # id -> the replayed-at header of its copy
    chosen: dict[str, str | None] = {}  # an id asked for -> the parked id it names
    try:
        if total == 0:
            _check_read(channel, queue)  # "empty" only to a user who may read it
        with Publisher(url, topology, tracing=tracing) as publisher:

            def send(method: Any, parked: ParkedMessage) -> None:
                exchange, routing_key = target(parked)
                started = time.monotonic()
                if marks is not None:
                    _consult(marks, parked, queue, report)
                copy = replay_message(
                    parked.delivery, exchange=exchange, routing_key=routing_key, now_ms=epoch_ms()
                )
                why = unwritable(copy)
                if why is not None:  # left unacked: given back, still parked
                    log.warning("left %s parked: pika cannot write it (%s)", copy.message_id, why)
                    report.kept.append(parked.message_id)
                    return

                def deliver() -> None:
                    publisher.send(copy)
                    channel.basic_ack(method.delivery_tag)  # only once the copy is confirmed

                with replaying(traces, parked.delivery, copy):
                    if record is None:
                        deliver()
                    else:
                        key = parked.delivery.origin_routing_key
                        to = (destinations or reached)(parked)
                        if not _recorded(record, copy, key, to, deliver, queue, report):
                            return  # left parked
                report.replayed.append(parked.message_id)
                if exchange:  # through an exchange, a copy may be routed back here
                    stamps[copy.message_id] = copy.headers[H_REPLAYED_AT]
                if progress is not None:
                    progress(len(report.replayed), total if wanted is None else len(wanted))
                if interval:
                    time.sleep(max(0.0, interval - (time.monotonic() - started)))

            # By ids, every message is taken before any is sent (the others held unacked,
            # returned at the end): an id given as a prefix must name one id, not two.
            held: list[tuple[Any, ParkedMessage]] = []
            while report.seen < total:
                method, props, body = channel.basic_get(queue, auto_ack=False)
                if method is None:
                    break
                report.seen += 1
                parked = _parked(queue, method, props, body, identify=identify)
                why = _unsendable(props)
                if why is not None:  # cannot be sent again: stays parked
                    log.warning("left %s parked: %s", parked.message_id, why)
                    report.kept.append(parked.message_id)
                    continue
                if wanted is None:
                    send(method, parked)
                elif any(may_name(given, parked.message_id) for given in wanted):
                    held.append((method, parked))
            if warning is not None:
                log.warning("%s", warning)
            if wanted is not None:
                found = [parked.message_id for _, parked in held]
                chosen = {given: find_id(given, found) for given in sorted(wanted)}
                for method, parked in held:
                    if parked.message_id in chosen.values():
                        send(method, parked)
        # Confirmed copies are enqueued: any that came back is behind what we took.
        returned, taken = _returned(channel, queue, stamps)
        if record is not None:  # parked again: not waiting at any queue
            report.unrecorded += record.parked_again(sorted(returned))
        _give_back(channel, queue, report.seen - len(report.replayed) + taken)
    except CHANNEL_CLOSED as exc:  # e.g. ACCESS_REFUSED: may not read it
        raise channel_error(exc) from exc
    except CONNECTION_ERRORS as exc:
        raise ConnectionFailed(
            f"the connection to the broker was lost while replaying from {queue}: "
            f"{len(report.replayed)} were replayed, the others are still parked "
            f"({type(exc).__name__}: {exc}); run the replay again"
        ) from exc
    finally:
        close_quietly(connection)
    if returned:
        report.returned = [m for m in report.replayed if m in returned]
        report.replayed = [m for m in report.replayed if m not in returned]
    if wanted is not None:
        report.missing = sorted(given for given, named in chosen.items() if named is None)
    return report


def _consult(marks: ReplayMarks, parked: ParkedMessage, queue: str, report: ReplayReport) -> None:
    try:
        marks.before_send(parked.delivery, now_ms=epoch_ms())
    except StoreError as exc:
        raise StoreError(
            f"the store failed while replaying from {queue}, before {parked.message_id}: "
            f"{len(report.replayed)} were replayed, the others are still parked ({exc}); "
            "run the replay again"
        ) from exc


def _recorded(
    record: ReplayRecord,
    copy: OutgoingMessage,
    key: str,
    to: tuple[str, ...],
    deliver: Callable[[], None],
    queue: str,
    report: ReplayReport,
) -> bool:
    """``deliver`` the copy with its entry recorded; ``False``: left parked, its id waiting
    in another namespace of the index (in ``report.clashing``)."""
    try:
        if not record.replayed(copy, key, to, deliver):
            report.unrecorded.append(copy.message_id)
        return True
    except ScheduleNotRecorded as exc:  # its pending write: this copy was not sent
        if exc.elsewhere:
            log.warning(
                "left %s parked: its id waits in another namespace of the schedule index",
                copy.message_id,
            )
            report.clashing.append(copy.message_id)
            return False
        raise ScheduleNotRecorded(
            f"the schedule index failed while replaying from {queue}, before "
            f"{copy.message_id}: {len(report.replayed)} were replayed and recorded, the "
            f"others are still parked ({exc}); run the replay again"
        ) from exc


def _returned(
    channel: BlockingChannel, queue: str, stamps: dict[str, object]
) -> tuple[set[str], int]:
    """Ids among ``stamps`` whose very copy is now in ``queue``, and how many messages were
    taken to find them (held unacked, like the rest)."""
    found: set[str] = set()
    taken = 0
    if not stamps:
        return found, taken
    while True:
        method, props, _ = channel.basic_get(queue, auto_ack=False)
        if method is None:
            return found, taken
        taken += 1
        stamp = (props.headers or {}).get(H_REPLAYED_AT)
        if props.message_id in stamps and stamps[props.message_id] == stamp:
            found.add(props.message_id)


def _give_back(channel: BlockingChannel, queue: str, held: int) -> None:
    """Return the ``held`` messages this channel took from ``queue``, in their order, and
    wait until the broker counts them ready again.

    A ``basic.nack`` has no reply, and a quorum queue applies the return once its log has
    it: a replay started the moment a browse ends (a script's ``dlq list`` then ``dlq
    replay``) could find the queue empty and replay nothing. Waiting here makes what a
    browse looked at visible to whatever runs next. The wait ends once the queue's ready
    count is what it was before plus the returns, or after :data:`GIVE_BACK_WAIT_S`
    (another consumer taking messages meanwhile), quietly: nothing is lost either way."""
    if held <= 0:
        return
    others = ready(channel, queue)
    channel.basic_nack(0, multiple=True, requeue=True)  # all of them back, in order
    deadline = time.monotonic() + GIVE_BACK_WAIT_S
    while ready(channel, queue) < others + held:
        if time.monotonic() >= deadline:
            log.debug("%s: %d returned messages not yet counted ready", queue, held)
            return
        time.sleep(GIVE_BACK_POLL_S)


def _check_read(channel: BlockingChannel, queue: str) -> None:
    """Raise the broker's refusal when this user may not read ``queue``: a passive
    declare (how its count was learnt) needs no permission, a ``basic.get`` does."""
    method, _, _ = channel.basic_get(queue, auto_ack=False)
    if method is not None:  # one arrived since the count: left for the next replay
        channel.basic_nack(method.delivery_tag, requeue=True)


def purge(url: str | None, queue: str) -> int:
    """Delete every message of ``queue``; returns how many there were."""
    connection, channel, _, _ = _open(url, queue, returns=False)
    try:
        return int(channel.queue_purge(queue).method.message_count)
    except CHANNEL_CLOSED as exc:  # e.g. ACCESS_REFUSED: may not read it
        raise channel_error(exc) from exc
    finally:
        close_quietly(connection)
