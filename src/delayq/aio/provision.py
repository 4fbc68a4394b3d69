"""Declaring a topology with aio-pika: idempotent, and reporting what differs."""

from __future__ import annotations

from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection

from delayq.aio._connection import close_quietly, connect
from delayq.aio._errors import CHANNEL_CLOSED, CONNECTION_ERRORS, channel_error, is_missing
from delayq.errors import ConnectionFailed, TopologyConflict, TopologyMissing
from delayq.links import LinkOptions, gate_for, open_async_link, serves_amqp
from delayq.topology.declarations import (
    BindingDecl,
    ExchangeDecl,
    QueueDecl,
    build_declarations,
)
from delayq.topology.model import Topology
from delayq.topology.report import (
    ApplyReport,
    ApplyResult,
    ApplyStatus,
    existing_queue_missing,
    spoils_marker,
)
from delayq.urls import check_vhost, redact, resolve_url

__all__ = ["apply_topology_async"]


class _Channels:
    """One channel at a time; a new one whenever the broker closes the current one."""

    def __init__(self, connection: AbstractConnection) -> None:
        self._connection = connection
        self._channel: AbstractChannel | None = None

    async def get(self) -> AbstractChannel:
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel(publisher_confirms=False)
        return self._channel

    async def close(self) -> None:
        await close_quietly(self._channel)


async def _declare(chan: AbstractChannel, decl: ExchangeDecl | QueueDecl, passive: bool) -> None:
    arguments: Any = None if passive else dict(decl.arguments)
    if isinstance(decl, ExchangeDecl):
        await chan.declare_exchange(
            decl.name,
            aio_pika.ExchangeType(decl.type),
            durable=decl.durable,
            passive=passive,
            arguments=arguments,
        )
    else:
        await chan.declare_queue(
            decl.name, durable=decl.durable, passive=passive, arguments=arguments
        )


async def _bind(channels: _Channels, decl: BindingDecl) -> ApplyResult:
    channel = await channels.get()
    try:
        arguments: Any = dict(decl.arguments) or None  # aio-pika's FieldTable
        if decl.destination_type == "exchange":
            target = await channel.get_exchange(decl.destination, ensure=False)
            await target.bind(decl.source, decl.routing_key, arguments=arguments)
        else:
            queue = await channel.get_queue(decl.destination, ensure=False)
            await queue.bind(decl.source, decl.routing_key, arguments=arguments)
    except CHANNEL_CLOSED as exc:  # e.g. ACCESS_REFUSED
        raise channel_error(exc) from exc
    return ApplyResult(decl, ApplyStatus.BOUND)


async def _check(channels: _Channels, decl: ExchangeDecl | QueueDecl) -> ApplyResult | None:
    """Phase 1: ``None`` when missing, else present or in conflict (nothing created)."""
    try:
        await _declare(await channels.get(), decl, passive=True)
    except CHANNEL_CLOSED as exc:
        if is_missing(exc):
            return None
        raise channel_error(exc) from exc
    return await _create(channels, decl, ApplyStatus.PRESENT)


async def _create(
    channels: _Channels, decl: ExchangeDecl | QueueDecl, status: ApplyStatus
) -> ApplyResult:
    try:
        await _declare(await channels.get(), decl, passive=False)
    except CHANNEL_CLOSED as exc:
        error = channel_error(exc)
        if not isinstance(error, TopologyConflict):
            raise error from exc
        if status is ApplyStatus.PRESENT and isinstance(decl, QueueDecl):
            for earlier in decl.legacy_forms():
                if (await _create(channels, earlier, status)).conflict is None:
                    return ApplyResult(decl, status, legacy=True)
        return ApplyResult(decl, ApplyStatus.CONFLICT, error)
    return ApplyResult(decl, status)


async def _apply(channels: _Channels, topology: Topology) -> ApplyReport:
    """Check every entity, then create what is missing only if nothing conflicts
    (the two phases of :mod:`delayq.topology.report`)."""
    decls = build_declarations(topology)
    found = [None if isinstance(d, BindingDecl) else await _check(channels, d) for d in decls]
    stopped = any(r is not None and r.conflict is not None for r in found)
    report = ApplyReport()
    for decl, result in zip(decls, found, strict=True):
        if result is None:
            if stopped:
                result = ApplyResult(decl, ApplyStatus.SKIPPED)
            elif isinstance(decl, BindingDecl):
                try:
                    result = await _bind(channels, decl)
                except TopologyMissing as exc:
                    raise existing_queue_missing(topology, decl) or exc from exc
            else:
                result = await _create(channels, decl, ApplyStatus.CREATED)
                stopped = result.conflict is not None  # a racing apply: stop here
        report.results.append(result)
    if found[-1] is not None and spoils_marker(topology, report.results):
        try:
            await (await channels.get()).exchange_delete(decls[-1].name)
        except CHANNEL_CLOSED as exc:  # e.g. ACCESS_REFUSED
            raise channel_error(exc) from exc
        report.marker_removed = True
    return report


async def apply_topology_async(
    topology: Topology,
    url: str | None = None,
    *,
    connection: AbstractConnection | None = None,
    raise_on_conflict: bool = True,
) -> ApplyReport:
    """Declare every entity of ``topology``; applying twice changes nothing.

    The async twin of :func:`delayq.sync.apply_topology`, with the same report
    and the same conflict handling (nothing is declared while an entity
    conflicts, see :mod:`delayq.topology.report`); delayq's own channels are used on a
    ``connection`` you pass, so none of yours is closed by a refused declaration.
    """
    resolved = resolve_url(url)
    if connection is None:
        check_vhost(topology.declared_vhost, resolved)
    if connection is None and not serves_amqp(resolved):  # a memory broker, say
        link = open_async_link(resolved, gate_for(topology, resolved), LinkOptions())
        return await link.apply(topology, raise_on_conflict=raise_on_conflict)
    own = connection is None
    conn = await connect(resolved, name="delayq-provision") if connection is None else connection
    channels = _Channels(conn)
    try:
        report = await _apply(channels, topology)
    except CONNECTION_ERRORS as exc:
        raise ConnectionFailed(
            f"lost the connection to {redact(resolved)} while applying the topology"
        ) from exc
    finally:
        await channels.close()
        if own:
            await close_quietly(conn)
    if raise_on_conflict:
        report.raise_for_conflicts()
    return report
