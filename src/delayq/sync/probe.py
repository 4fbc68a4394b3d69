"""The dead-lettering probe of ``delayq topology verify``, with pika.

It proves on the live broker what no declaration can show: that a message
expiring from a queue wired like a tier is dead-lettered through the ready
exchange and arrives. It creates, in this order,

1. an inbox ``<ns>.verify.<hex>.in`` (exclusive: gone with the connection),
   bound to ``<ns>.ready`` with the probe's routing key;
2. the probe queue ``<ns>.verify.<hex>``, wired like a tier (same queue type
   and dead-letter arguments, a TTL of a few hundred ms, and ``x-expires`` as a
   backstop);

publishes one confirmed, persistent message to the probe queue, waits for it
in the inbox, and deletes both queues afterwards, also when anything failed.
"""

from __future__ import annotations

import time

import pika
from pika.adapters.blocking_connection import BlockingChannel

from delayq.ops.verify import Check
from delayq.ops.verify_probe import ProbePlan, check_probe
from delayq.sync._connection import close_quietly
from delayq.sync._errors import CHANNEL_CLOSED, NOT_TAKEN, channel_error

__all__ = ["run_probe"]

POLL_S = 0.02


def _wait_for(channel: BlockingChannel, plan: ProbePlan, started: float) -> int | None:
    """Milliseconds from publish to arrival in the inbox, or ``None`` past the bound."""
    deadline = started + plan.bound_ms / 1000
    while time.monotonic() < deadline:
        method, props, _body = channel.basic_get(plan.inbox, auto_ack=True)
        if method is not None and props.message_id == plan.message_id:
            return round((time.monotonic() - started) * 1000)
        if method is None:
            time.sleep(POLL_S)
    return None


def _send_and_wait(channel: BlockingChannel, plan: ProbePlan) -> int | None:
    channel.queue_declare(plan.inbox, exclusive=True, auto_delete=True)
    channel.queue_bind(plan.inbox, plan.exchange, plan.routing_key, arguments=plan.headers or None)
    channel.queue_declare(plan.queue.name, durable=True, arguments=dict(plan.queue.arguments))
    channel.confirm_delivery()
    started = time.monotonic()
    channel.basic_publish(
        "",  # the default exchange: straight into the probe queue
        plan.routing_key,
        b"delayq verify probe",
        pika.BasicProperties(
            message_id=plan.message_id, delivery_mode=2, headers=dict(plan.headers) or None
        ),
        mandatory=True,
    )
    return _wait_for(channel, plan, started)


def _clean_up(connection: pika.BlockingConnection, plan: ProbePlan) -> str | None:
    """Delete the probe's queues on a fresh channel (the probe's may have been closed).

    Returns why a queue could not be deleted, or ``None``.
    """
    for name in (plan.queue.name, plan.inbox):
        channel = connection.channel()
        try:
            channel.queue_delete(name)  # deleting a missing queue is a no-op
        except CHANNEL_CLOSED as exc:
            return f"could not delete {name}: {channel_error(exc)}"
        finally:
            close_quietly(channel)
    return None


def run_probe(connection: pika.BlockingConnection, plan: ProbePlan) -> Check:
    """Run the probe on ``connection`` and judge it; its queues are deleted in every case."""
    channel = connection.channel()
    arrived_ms: int | None = None
    error: str | None = None
    try:
        arrived_ms = _send_and_wait(channel, plan)
    except CHANNEL_CLOSED as exc:
        error = str(channel_error(exc))
    except NOT_TAKEN as exc:
        error = f"the probe message was not accepted ({type(exc).__name__})"
    finally:
        close_quietly(channel)
        leftover = _clean_up(connection, plan)
    return check_probe(plan, arrived_ms, error, leftover)
