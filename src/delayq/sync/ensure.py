"""What a consumer does with the topology at start: apply it, or, when its user may not
configure (the least-privilege consumer grant, see :mod:`delayq.ops.grant`), check that
it exists.

The check is passive: the apply marker (an apply of this very topology finished: its
exchanges and queues, with their arguments), the consumer's queues and DLQs and the
exchanges it writes to must exist, or :class:`~delayq.errors.TopologyMissing` names the
first that does not (apply the topology with the admin user). Each is a name the consumer
grant gives a permission on: RabbitMQ 4.2.6+ refuses a passive declare to a user with
none. Bindings cannot be read without the management API; ``delayq topology verify``
checks them.
"""

from __future__ import annotations

import logging

import pika

from delayq.errors import AccessRefused
from delayq.ops.grant import consumer_checks
from delayq.sync._errors import CHANNEL_CLOSED, channel_error
from delayq.sync.provision import Channels, apply_topology, declare_entity
from delayq.topology.model import Topology

__all__ = ["check_topology", "ensure_topology"]

log = logging.getLogger("delayq.consumer")


def check_topology(topology: Topology, connection: pika.BlockingConnection) -> int:
    """Check with passive declares that ``topology`` was applied: its apply marker, the
    consumer's queues and DLQs and the exchanges it writes to
    (:func:`~delayq.ops.grant.consumer_checks`); returns how many were checked."""
    channels = Channels(connection)
    checked = 0
    try:
        for decl in consumer_checks(topology):
            try:
                declare_entity(channels.channel, decl, passive=True)
            except CHANNEL_CLOSED as exc:
                raise channel_error(exc) from exc
            checked += 1
    finally:
        channels.close()
    return checked


def ensure_topology(topology: Topology, connection: pika.BlockingConnection) -> None:
    """Apply ``topology``; a user refused the right to declare checks it instead."""
    try:
        apply_topology(topology, connection=connection)
        return
    except AccessRefused as refused:
        reason = refused
    checked = check_topology(topology, connection)
    log.info(
        "the topology of namespace %r was not applied (%s); its %d exchanges and queues "
        "exist, checked with passive declares (apply it with the admin user: "
        "`delayq topology apply`)",
        topology.namespace,
        reason,
        checked,
    )
