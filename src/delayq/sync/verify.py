"""``delayq topology verify`` with pika (and the management API when it answers).

It gathers what the broker shows and lets :mod:`delayq.ops.verify` judge it:

- the version, from the connection's server properties;
- every exchange and queue: from the management API (type, durability, every
  argument), else over AMQP: a passive declare for existence, then a declare
  with the topology's arguments, which the broker refuses with
  PRECONDITION_FAILED when they differ (it never creates anything);
- bindings and feature flags: management API only;
- a probe that dead-lettering fires (:mod:`delayq.sync.probe`).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from delayq.errors import AccessRefused, ConnectionFailed, DelayqError
from delayq.ops.management import ManagementAPI
from delayq.ops.verify import (
    Check,
    Observed,
    Status,
    check_feature_flags,
    check_leftover_shards,
    check_version,
    check_vhost,
    compare_bindings,
    compare_entity,
    compare_redeclared,
    compare_unconfigurable,
)
from delayq.ops.verify_probe import plan_probe
from delayq.sync._broker import (
    ManagementChoice,
    Reach,
    reach_management,
    server_property,
)
from delayq.sync._connection import close_quietly, connect
from delayq.sync._errors import CHANNEL_CLOSED, CONNECTION_ERRORS, channel_error, is_missing
from delayq.sync.probe import run_probe
from delayq.sync.provision import Channels, declare_checked, declare_entity
from delayq.topology.declarations import BindingDecl, ExchangeDecl, QueueDecl, build_declarations
from delayq.topology.headers import table_text
from delayq.topology.model import Topology
from delayq.urls import redact, resolve_url, url_vhost

__all__ = ["verify_topology"]


def _management_check(reach: Reach) -> Check:
    subject = "management API"
    if reach.api is not None:
        return Check(subject, Status.OK, reach.detail)
    if reach.failed:
        return Check(subject, Status.FAIL, f"{reach.detail}; AMQP checks only")
    return Check(subject, Status.SKIPPED, f"{reach.detail}; AMQP checks only")


def _observed(api: ManagementAPI, vhost: str, decl: ExchangeDecl | QueueDecl) -> Observed | None:
    if isinstance(decl, ExchangeDecl):
        found = api.exchange(vhost, decl.name)
    else:
        found = api.queue(vhost, decl.name)
    if found is None:
        return None
    return Observed(
        type=found.get("type"),
        durable=bool(found.get("durable")),
        arguments=dict(found.get("arguments") or {}),
    )


def _entity_by_api(api: ManagementAPI, vhost: str, decl: ExchangeDecl | QueueDecl) -> Check:
    try:
        return compare_entity(decl, _observed(api, vhost, decl))
    except DelayqError as exc:
        return Check(f"{decl.kind} {decl.name}", Status.FAIL, str(exc))


def _entity_by_amqp(channels: Channels, decl: ExchangeDecl | QueueDecl) -> Check:
    try:
        result = declare_checked(channels, decl, create=False)
    except AccessRefused as exc:  # no configure permission: a producer, a consumer
        return _entity_by_passive(channels, decl, exc)
    except DelayqError as exc:
        return Check(f"{decl.kind} {decl.name}", Status.FAIL, str(exc))
    return compare_redeclared(
        decl,
        existed=result is not None,
        conflict=None if result is None else result.conflict,
        legacy=result is not None and result.legacy,
    )


def _entity_by_passive(
    channels: Channels, decl: ExchangeDecl | QueueDecl, refusal: AccessRefused
) -> Check:
    """What a user who may not declare ``decl`` can still check: that it exists, by a
    passive declare (which needs no permission before RabbitMQ 4.2.6; configure on 4.2.6
    and 4.3.0; any one permission from 4.2.7 and 4.3.1). ``None`` for existed: it may
    not even look."""
    try:
        declare_entity(channels.channel, decl, passive=True)
    except CHANNEL_CLOSED as exc:
        if is_missing(exc):
            return compare_unconfigurable(decl, existed=False, refusal=str(refusal))
        error = channel_error(exc)
        if not isinstance(error, AccessRefused):
            return Check(f"{decl.kind} {decl.name}", Status.FAIL, str(error))
        return compare_unconfigurable(decl, existed=None, refusal=str(refusal))
    return compare_unconfigurable(decl, existed=True, refusal=str(refusal))


def _bindings(api: ManagementAPI | None, topology: Topology, vhost: str) -> Check:
    if api is None:
        return Check(
            "bindings",
            Status.SKIPPED,
            "AMQP cannot list bindings: pass a reachable --management-url to check them",
        )
    decls = build_declarations(topology)
    expected = [d for d in decls if isinstance(d, BindingDecl)]
    sources = sorted({b.source for b in expected})
    observed: dict[str, set[tuple[str, str]]] = {}
    headers = topology.headers_exchange
    try:
        for source in sources:
            rows = api.bindings_from(vhost, source) or []
            observed[source] = {
                (str(r["destination"]), _matched(source == headers, r))
                for r in rows
                if r.get("destination_type") in ("queue", "exchange")
            }
    except DelayqError as exc:
        return Check("bindings", Status.FAIL, str(exc))
    owned = {s for s in sources if s not in (topology.ready_exchange, headers)}
    fanout = {d.name for d in decls if isinstance(d, ExchangeDecl) and d.type == "fanout"}
    return compare_bindings(expected, observed, owned, keyless=fanout)


def _matched(by_headers: bool, row: Mapping[str, Any]) -> str:
    """What a listed binding matches: its x-match table on the headers exchange (as
    :attr:`BindingDecl.match` spells it), else its routing key."""
    if by_headers:
        return table_text(row.get("arguments") or {})
    return str(row.get("routing_key", ""))


def _flags(api: ManagementAPI | None) -> tuple[dict[str, str] | None, str]:
    if api is None:
        return None, "no management API"
    try:
        return api.feature_flags(), ""
    except DelayqError as exc:
        return None, f"the management API did not list them ({exc})"


def _queue_counts(api: ManagementAPI | None, vhost: str) -> dict[str, int] | None:
    """Every queue of the vhost and its messages; ``None`` without the API (or if it fails)."""
    if api is None:
        return None
    try:
        rows = api.queues(vhost, ("name", "messages"))
    except DelayqError:
        return None
    return {str(row["name"]): int(row.get("messages") or 0) for row in rows}


def verify_topology(
    topology: Topology,
    url: str | None = None,
    *,
    management: ManagementChoice | ManagementAPI | None = None,
    probe: bool = True,
    probe_ttl_ms: int = 200,
    probe_bound_ms: int = 10_000,
) -> list[Check]:
    """Every check of the live broker against ``topology``, in a fixed order.

    >>> api = ManagementAPI("http://guest:guest@localhost:15672/")  # doctest: +SKIP
    >>> passed(verify_topology(topology, url, management=api))  # doctest: +SKIP
    True

    Without ``management`` (or when it does not answer) entities are checked
    over AMQP, and bindings and feature flags are skipped. Raises
    :class:`~delayq.errors.ConnectionFailed` when the broker cannot be reached;
    every other problem is a failed check.
    """
    resolved = resolve_url(url)
    plan = plan_probe(
        topology, secrets.token_hex(4), ttl_ms=probe_ttl_ms, bound_ms=probe_bound_ms
    )  # before connecting: bad input is refused before any I/O
    connection = connect(resolved, name="delayq-verify")
    channels = Channels(connection)
    vhost = url_vhost(resolved)
    try:
        version = server_property(connection, "version")
        reach = reach_management(management, connection, vhost)
        api = reach.api
        flags, flags_why = _flags(api)
        checks = [
            check_version(version),
            check_vhost(topology, vhost),
            _management_check(reach),
            check_feature_flags(topology, flags, version, flags_why),
        ]
        for decl in build_declarations(topology):
            if isinstance(decl, BindingDecl):
                continue
            if api is not None:
                checks.append(_entity_by_api(api, vhost, decl))
            else:
                checks.append(_entity_by_amqp(channels, decl))
        checks.append(_bindings(api, topology, vhost))
        checks.append(check_leftover_shards(topology, _queue_counts(api, vhost)))
        if probe:
            checks.append(run_probe(connection, plan))
        else:
            checks.append(Check("dead-lettering probe", Status.SKIPPED, "--no-probe"))
        return checks
    except CONNECTION_ERRORS as exc:
        raise ConnectionFailed(
            f"lost the connection to {redact(resolved)} while verifying ({type(exc).__name__})"
        ) from exc
    finally:
        channels.close()
        close_quietly(connection)
