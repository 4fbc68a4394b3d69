"""Declaring a topology with pika: idempotent, and reporting what differs."""

from __future__ import annotations

import pika
from pika.adapters.blocking_connection import BlockingChannel

from delayq.errors import ConnectionFailed, TopologyConflict, TopologyMissing
from delayq.links import LinkOptions, gate_for, open_link, serves_amqp
from delayq.sync._connection import close_quietly, connect
from delayq.sync._errors import CHANNEL_CLOSED, CONNECTION_ERRORS, channel_error, is_missing
from delayq.sync._quiet import expected_closes
from delayq.topology.declarations import (
    BindingDecl,
    Declaration,
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

__all__ = ["apply_topology", "delete_topology"]


class Channels:
    """One channel at a time; a new one whenever the broker closes the current one."""

    def __init__(self, connection: pika.BlockingConnection) -> None:
        self._connection = connection
        self._channel: BlockingChannel | None = None

    @property
    def channel(self) -> BlockingChannel:
        if self._channel is None or not self._channel.is_open:
            with expected_closes():  # pika's INFO record of each channel opened again
                self._channel = self._connection.channel()
        return self._channel

    def close(self) -> None:
        close_quietly(self._channel)


def declare_entity(chan: BlockingChannel, decl: ExchangeDecl | QueueDecl, passive: bool) -> None:
    """Declare one exchange or queue; ``passive`` only checks that it exists (pika's
    warning of a missing one is not logged: the caller reports it, if it matters)."""
    if passive:
        with expected_closes():
            _declare(chan, decl, passive)
    else:
        _declare(chan, decl, passive)


def _declare(chan: BlockingChannel, decl: ExchangeDecl | QueueDecl, passive: bool) -> None:
    if isinstance(decl, ExchangeDecl):
        chan.exchange_declare(
            decl.name,
            decl.type,
            passive=passive,
            durable=decl.durable,
            arguments=None if passive else dict(decl.arguments),
        )
    else:
        chan.queue_declare(
            decl.name,
            passive=passive,
            durable=decl.durable,
            arguments=None if passive else dict(decl.arguments),
        )


def declare_checked(
    channels: Channels, decl: ExchangeDecl | QueueDecl, *, create: bool = True
) -> ApplyResult | None:
    """A passive declare, then a declare with the topology's arguments.

    Created, present, or conflict (the broker refused the arguments: nothing
    changed). With ``create=False`` a missing entity stays missing: ``None``.
    """
    try:
        declare_entity(channels.channel, decl, passive=True)
        existed = True
    except CHANNEL_CLOSED as exc:
        if not is_missing(exc):
            raise channel_error(exc) from exc
        existed = False
    if not existed and not create:
        return None
    try:
        declare_entity(channels.channel, decl, passive=False)
    except CHANNEL_CLOSED as exc:
        error = channel_error(exc)
        if not isinstance(error, TopologyConflict):
            raise error from exc
        if existed and isinstance(decl, QueueDecl):
            for earlier in decl.legacy_forms():
                found = declare_checked(channels, earlier, create=False)
                if found is not None and found.conflict is None:
                    return ApplyResult(decl, ApplyStatus.PRESENT, legacy=True)
        return ApplyResult(decl, ApplyStatus.CONFLICT, error)
    return ApplyResult(decl, ApplyStatus.PRESENT if existed else ApplyStatus.CREATED)


def _apply_one(channels: Channels, decl: Declaration) -> ApplyResult:
    if isinstance(decl, BindingDecl):
        try:
            arguments = dict(decl.arguments) or None
            if decl.destination_type == "exchange":
                channels.channel.exchange_bind(
                    decl.destination, decl.source, decl.routing_key, arguments=arguments
                )
            else:
                channels.channel.queue_bind(
                    decl.destination, decl.source, decl.routing_key, arguments=arguments
                )
        except CHANNEL_CLOSED as exc:  # e.g. ACCESS_REFUSED
            raise channel_error(exc) from exc
        return ApplyResult(decl, ApplyStatus.BOUND)
    result = declare_checked(channels, decl)
    assert result is not None  # created when missing
    return result


def _apply(channels: Channels, topology: Topology) -> ApplyReport:
    """Check every entity, then create what is missing only if nothing conflicts
    (the two phases of :mod:`delayq.topology.report`)."""
    decls = build_declarations(topology)
    found = [
        None if isinstance(d, BindingDecl) else declare_checked(channels, d, create=False)
        for d in decls
    ]
    stopped = any(r is not None and r.conflict is not None for r in found)
    report = ApplyReport()
    for decl, result in zip(decls, found, strict=True):
        if result is None:
            if stopped:
                result = ApplyResult(decl, ApplyStatus.SKIPPED)
            else:
                try:
                    result = _apply_one(channels, decl)
                except TopologyMissing as exc:
                    raise existing_queue_missing(topology, decl) or exc from exc
                stopped = result.conflict is not None  # a racing apply: stop here
        report.results.append(result)
    marker = decls[-1]
    if found[-1] is not None and spoils_marker(topology, report.results):
        channels.channel.exchange_delete(marker.name)
        report.marker_removed = True
    return report


def apply_topology(
    topology: Topology,
    url: str | None = None,
    *,
    connection: pika.BlockingConnection | None = None,
    raise_on_conflict: bool = True,
) -> ApplyReport:
    """Declare every entity of ``topology``; applying twice changes nothing.

    Every existing entity is checked first: if one exists with other arguments,
    nothing is declared (the others are reported ``skipped``), and the apply
    marker of a former apply is removed when the conflict is on the namespace's
    own entities, so publishers refuse the namespace until an apply succeeds
    (see :mod:`delayq.topology.report`). With ``raise_on_conflict`` (the default)
    the first conflict is raised as :class:`~delayq.errors.TopologyConflict`.
    Pass ``connection`` to reuse one: delayq opens and closes its own channels on
    it, so the caller's channels are never closed by a refused declaration.
    """
    resolved = resolve_url(url)
    if connection is None:
        check_vhost(topology.declared_vhost, resolved)
    if connection is None and not serves_amqp(resolved):  # a memory broker, say
        link = open_link(resolved, gate_for(topology, resolved), LinkOptions())
        return link.apply(topology, raise_on_conflict=raise_on_conflict)
    own = connection is None
    conn = connect(resolved, name="delayq-provision") if connection is None else connection
    channels = Channels(conn)
    try:
        report = _apply(channels, topology)
    except CHANNEL_CLOSED as exc:  # e.g. ACCESS_REFUSED deleting the marker
        raise channel_error(exc) from exc
    except CONNECTION_ERRORS as exc:
        raise ConnectionFailed(
            f"lost the connection to {redact(resolved)} while applying the topology"
        ) from exc
    finally:
        channels.close()
        if own:
            close_quietly(conn)
    if raise_on_conflict:
        report.raise_for_conflicts()
    return report


def delete_topology(
    topology: Topology,
    url: str | None = None,
    *,
    connection: pika.BlockingConnection | None = None,
) -> None:
    """Delete every queue and exchange of ``topology``, messages included.

    Destructive by design: for tests, demos and throwaway namespaces. Entities
    that do not exist are skipped.
    """
    own = connection is None
    conn = connect(resolve_url(url), name="delayq-teardown") if connection is None else connection
    channels = Channels(conn)
    try:
        for decl in reversed(build_declarations(topology)):
            if isinstance(decl, ExchangeDecl):
                channels.channel.exchange_delete(decl.name)
            elif isinstance(decl, QueueDecl):
                channels.channel.queue_delete(decl.name)
    finally:
        channels.close()
        if own:
            close_quietly(conn)
