"""The async twin of :mod:`delayq.sync.ensure`: apply the topology at a consumer's start,
or check that it exists when the user may not configure."""

from __future__ import annotations

import logging

from aio_pika.abc import AbstractConnection

from delayq.aio._errors import CHANNEL_CLOSED, channel_error
from delayq.aio.provision import _Channels, _declare, apply_topology_async
from delayq.errors import AccessRefused
from delayq.ops.grant import consumer_checks
from delayq.topology.model import Topology

__all__ = ["check_topology", "ensure_topology"]

log = logging.getLogger("delayq.consumer")


async def check_topology(topology: Topology, connection: AbstractConnection) -> int:
    """Check with passive declares that ``topology`` was applied: its apply marker, the
    consumer's queues and DLQs and the exchanges it writes to
    (:func:`~delayq.ops.grant.consumer_checks`); returns how many were checked."""
    channels = _Channels(connection)
    checked = 0
    try:
        for decl in consumer_checks(topology):
            try:
                await _declare(await channels.get(), decl, passive=True)
            except CHANNEL_CLOSED as exc:
                raise channel_error(exc) from exc
            checked += 1
    finally:
        await channels.close()
    return checked


async def ensure_topology(topology: Topology, connection: AbstractConnection) -> None:
    """Apply ``topology``; a user refused the right to declare checks it instead."""
    try:
        await apply_topology_async(topology, connection=connection)
        return
    except AccessRefused as refused:
        reason = refused
    checked = await check_topology(topology, connection)
    log.info(
        "the topology of namespace %r was not applied (%s); its %d exchanges and queues "
        "exist, checked with passive declares (apply it with the admin user: "
        "`delayq topology apply`)",
        topology.namespace,
        reason,
        checked,
    )
