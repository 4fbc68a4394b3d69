"""A parking queue as pika reads it: opened with its count (and the delivery-limit check
on 4.x), and each message taken from it made a :class:`~delayq.ops.parked.ParkedMessage`
(for :mod:`delayq.sync.parking`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel

from delayq.consume.delivery import H_DEAD_LETTER_REASON, H_ERROR_MESSAGE, Delivery
from delayq.errors import TopologyMissing
from delayq.ops.parked import ParkedMessage
from delayq.sync._broker import server_property
from delayq.sync._connection import close_quietly, connect
from delayq.sync._errors import CHANNEL_CLOSED, channel_error, reply_code
from delayq.sync._unreadable import tolerate_unreadable_headers, unreadable
from delayq.topology.conflicts import conflict_from_reply, parked_at_risk
from delayq.topology.declarations import parked_arguments
from delayq.topology.model import QueueType
from delayq.urls import resolve_url

__all__ = ["UNREADABLE_HEADERS", "Identify", "open_parked", "parked", "ready", "unsendable"]


UNREADABLE_HEADERS = "unreadable-headers"
"""The reason a parked message whose headers pika cannot read is listed with (a NaN or a
timestamp past 9999 that a Java or JavaScript publisher sent)."""


def open_parked(
    url: str | None, queue: str, *, returns: bool = True
) -> tuple[pika.BlockingConnection, BlockingChannel, int, str | None]:
    """A connection, a channel, the message count of ``queue`` and a warning to log once
    the queue was read (see :func:`check_limit`); with ``returns`` (the caller gives
    messages back), only if that cannot cost the queue its messages."""
    connection = connect(resolve_url(url), name="delayq-parking")
    tolerate_unreadable_headers(connection)  # listed, and left parked by a replay
    channel = connection.channel()
    try:
        count = ready(channel, queue)
    except CHANNEL_CLOSED as exc:
        close_quietly(connection)
        error = channel_error(exc)
        if isinstance(error, TopologyMissing):  # 404
            error = TopologyMissing(f"queue {queue!r} does not exist on this broker/vhost")
        # RabbitMQ 4.2.6+ refuses the passive declare (403) to a user who has no permission
        # on the queue: an access error, not a missing queue
        raise error from exc
    warning = None
    if returns:
        try:
            warning = check_limit(connection, queue)
        except BaseException:
            close_quietly(connection)
            raise
    return connection, channel, count, warning


def check_limit(connection: pika.BlockingConnection, queue: str) -> str | None:
    """Raise :class:`ParkedAtRisk` when returning messages to ``queue`` counts against a
    delivery limit that browsing could reach (see :func:`parked_at_risk`).

    The queue is declared again with the parked arguments: the broker changes nothing
    and names the first argument that differs. A user who may not declare it (no
    configure permission) cannot tell; the browse goes on, with the warning returned on
    4.x: logged once a read succeeded, so a user who may not read the queue either sees
    the refusal alone."""
    version = server_property(connection, "version") or ""
    channel = connection.channel()
    try:
        channel.queue_declare(queue, durable=True, arguments=parked_arguments(QueueType.QUORUM))
    except CHANNEL_CLOSED as exc:
        risk = parked_at_risk(conflict_from_reply(getattr(exc, "reply_text", "") or ""), version)
        if risk is not None:
            raise risk from None
        if reply_code(exc) == 403 and version[:1].isdigit() and int(version.split(".")[0]) >= 4:
            return (
                f"could not check the delivery limit of {queue} (this user may not declare "
                f"it): on RabbitMQ {version}, a queue declared without delayq's limit loses "
                "its messages after 20 browses"
            )
        return None
    if channel.is_open:
        channel.close()
    return None


Identify = Callable[[Delivery, Mapping[str, Any]], str]
"""The id of a parked message its publisher gave none, from the message and its AMQP
properties (pika's names): an intake's (:func:`delayq.intake.relay.intake_id`), as its
bridge gives it."""

PROPERTY_NAMES = (
    "content_type", "content_encoding", "correlation_id", "reply_to", "type", "app_id",
    "user_id", "priority", "timestamp", "expiration", "delivery_mode",
)  # fmt: skip


def unsendable(props: pika.BasicProperties) -> str | None:
    """Why a parked message cannot be sent again as it is (``None``: it can): pika could
    not read its headers, or read a header name that is not UTF-8 text."""
    why = unreadable(props)
    if why is None:
        names = [name for name in props.headers or {} if not isinstance(name, str)]
        if names:
            why = f"a header name is not UTF-8 text: {names[0]!r}"
    return why


def parked(
    queue: str,
    method: object,
    props: pika.BasicProperties,
    body: bytes,
    dead_letters_of: str | None = None,
    identify: Identify | None = None,
) -> ParkedMessage:
    why = unsendable(props)
    headers = dict(props.headers or {})
    if why is not None:  # shown with its reason; never replayed (it cannot be sent again)
        kept = {k: v for k, v in headers.items() if isinstance(k, str)}
        headers = {**kept, H_DEAD_LETTER_REASON: UNREADABLE_HEADERS, H_ERROR_MESSAGE: why}
    delivery = Delivery(
        queue=queue,
        body=body,
        routing_key=getattr(method, "routing_key", "") or "",
        message_id=props.message_id,
        content_type=props.content_type,
        headers=headers,
    )
    if not props.message_id and identify is not None and why is None:
        properties = {name: getattr(props, name, None) for name in PROPERTY_NAMES}
        delivery = replace(delivery, message_id=identify(delivery, properties))
    return ParkedMessage(delivery, props.timestamp, dead_letters_of)


def ready(channel: BlockingChannel, queue: str) -> int:
    """The ready count of ``queue`` (a passive declare)."""
    return int(channel.queue_declare(queue, passive=True).method.message_count)
