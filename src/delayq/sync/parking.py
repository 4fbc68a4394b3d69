"""Browsing, replaying and purging parked messages (``<queue>.dlq``, ``<ns>.unrouted``) with pika.

Browsing takes messages with ``basic.get`` and holds them unacknowledged until
the end, then returns them all to the queue in their order: nothing is removed,
and nothing is seen twice. (On RabbitMQ 4, whose quorum queues count returns
against a delivery limit, browse a DLQ sparingly.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import pika
import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingChannel

from delayq.delivery import Delivery
from delayq.envelope import epoch_ms
from delayq.errors import TopologyMissing
from delayq.parked import ParkedMessage, replay_message
from delayq.sync._connection import close_quietly, connect, translate_channel_error
from delayq.sync.publisher import Publisher
from delayq.topology import Topology
from delayq.urls import resolve_url

__all__ = ["ReplayReport", "browse", "purge", "replay"]


@dataclass
class ReplayReport:
    replayed: list[str] = field(default_factory=list)
    """Message ids sent again (and removed from the parking queue)."""
    seen: int = 0
    """Messages looked at."""
    missing: list[str] = field(default_factory=list)
    """Ids asked for that were not found."""


def _open(url: str | None, queue: str) -> tuple[pika.BlockingConnection, BlockingChannel, int]:
    connection = connect(resolve_url(url), name="delayq-parking")
    channel = connection.channel()
    try:
        count = channel.queue_declare(queue, passive=True).method.message_count
    except pex.ChannelClosedByBroker as exc:
        close_quietly(connection)
        raise TopologyMissing(f"queue {queue!r} does not exist on this broker/vhost") from exc
    return connection, channel, int(count)


def _parked(
    queue: str,
    method: object,
    props: pika.BasicProperties,
    body: bytes,
    dead_letters_of: str | None = None,
) -> ParkedMessage:
    delivery = Delivery(
        queue=queue,
        body=body,
        routing_key=getattr(method, "routing_key", "") or "",
        message_id=props.message_id,
        content_type=props.content_type,
        headers=dict(props.headers or {}),
    )
    return ParkedMessage(delivery, props.timestamp, dead_letters_of)


def browse(
    url: str | None, queue: str, *, limit: int = 100, dead_letters_of: str | None = None
) -> list[ParkedMessage]:
    """Up to ``limit`` messages from the head of ``queue``, left in place.

    ``dead_letters_of``: the queue that dead-letters into ``queue`` (a DLQ's
    destination), so :attr:`ParkedMessage.reason` can tell the broker's reasons.
    """
    connection, channel, _ = _open(url, queue)
    found: list[ParkedMessage] = []
    try:
        while len(found) < limit:
            method, props, body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                break
            found.append(_parked(queue, method, props, body, dead_letters_of))
        channel.basic_nack(0, multiple=True, requeue=True)  # all of them back, in order
    except pex.ChannelClosedByBroker as exc:  # e.g. ACCESS_REFUSED: may not read it
        raise translate_channel_error(exc) from exc
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
) -> ReplayReport:
    """Send parked messages again and remove them from ``queue`` once confirmed.

    ``target`` gives each message's (exchange, routing key); ``ids`` selects
    messages by id (``None``: all that were parked when the replay started).
    """
    wanted = None if ids is None else set(ids)
    report = ReplayReport()
    connection, channel, total = _open(url, queue)
    interval = 1.0 / rate_per_s if rate_per_s else 0.0
    try:
        with Publisher(url, topology) as publisher:
            while report.seen < total:
                method, props, body = channel.basic_get(queue, auto_ack=False)
                if method is None:
                    break
                report.seen += 1
                parked = _parked(queue, method, props, body)
                if wanted is not None and parked.message_id not in wanted:
                    continue  # held unacked, returned at the end
                exchange, routing_key = target(parked)
                started = time.monotonic()
                publisher.send(
                    replay_message(
                        parked.delivery,
                        exchange=exchange,
                        routing_key=routing_key,
                        now_ms=epoch_ms(),
                    )
                )
                channel.basic_ack(method.delivery_tag)  # only once the copy is confirmed
                report.replayed.append(parked.message_id)
                if progress is not None:
                    progress(len(report.replayed), total if wanted is None else len(wanted))
                if interval:
                    time.sleep(max(0.0, interval - (time.monotonic() - started)))
        channel.basic_nack(0, multiple=True, requeue=True)
    except pex.ChannelClosedByBroker as exc:  # e.g. ACCESS_REFUSED: may not read it
        raise translate_channel_error(exc) from exc
    finally:
        close_quietly(connection)
    if wanted is not None:
        report.missing = sorted(wanted - set(report.replayed))
    return report


def purge(url: str | None, queue: str) -> int:
    """Delete every message of ``queue``; returns how many there were."""
    connection, channel, _ = _open(url, queue)
    try:
        return int(channel.queue_purge(queue).method.message_count)
    except pex.ChannelClosedByBroker as exc:  # e.g. ACCESS_REFUSED: may not read it
        raise translate_channel_error(exc) from exc
    finally:
        close_quietly(connection)
