"""Pure comparison of a live broker with the topology: what ``delayq topology verify`` decides.

The adapter (:mod:`delayq.sync.verify`) gathers what the broker shows, from the
management API when it is reachable or over AMQP otherwise, and hands it to
these functions, each of which returns one :class:`Check`. Nothing here talks
to a broker.

>>> check_version("3.9.29").status
<Status.FAIL: 'FAIL'>
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from delayq.errors import TopologyConflict
from delayq.tables import Column, Table
from delayq.topology.declarations import BindingDecl, ExchangeDecl, QueueDecl
from delayq.topology.headers import table_text
from delayq.topology.model import QueueType, Topology
from delayq.topology.shards import leftover_shards

__all__ = [
    "MIN_VERSION",
    "REQUIRED_FEATURE_FLAGS",
    "Check",
    "Observed",
    "Status",
    "check_feature_flags",
    "check_leftover_shards",
    "check_version",
    "check_vhost",
    "checks_table",
    "compare_bindings",
    "compare_entity",
    "compare_redeclared",
    "compare_unconfigurable",
    "passed",
    "render_checks",
]

MIN_VERSION = (3, 10)
"""Quorum queues with message TTL and at-least-once dead-lettering need RabbitMQ 3.10."""

REQUIRED_FEATURE_FLAGS = ("quorum_queue", "stream_queue")
"""Flags at-least-once dead-lettering needs: quorum queues, and on 3.10+ ``stream_queue``
(at-least-once dead-lettering is refused while it is disabled)."""

SHOWN = 4
"""Bindings named in one check's detail; the rest are counted."""



class Status(str, enum.Enum):
    OK = "OK"
    """The broker is as the topology wants."""
    FAIL = "FAIL"
    """It is not; the detail says what differs and what to do."""
    SKIPPED = "SKIPPED"
    """It could not be checked from here; the detail says why."""


@dataclass(frozen=True)
class Check:
    subject: str
    status: Status
    detail: str


def passed(checks: Iterable[Check]) -> bool:
    """True when no check failed (skipped ones do not fail a verify)."""
    return all(check.status is not Status.FAIL for check in checks)


# Broker-wide checks -------------------------------------------------------------


def _version_tuple(version: str | None) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    if match is None:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


def check_version(version: str | None) -> Check:
    """The broker's version (from the connection's server properties) is new enough."""
    parsed = _version_tuple(version)
    if parsed is None:
        return Check("broker version", Status.SKIPPED, f"unknown version {version!r}")
    wanted = ".".join(map(str, MIN_VERSION))
    if parsed[:2] < MIN_VERSION:
        return Check(
            "broker version",
            Status.FAIL,
            f"RabbitMQ {version}: delayq needs {wanted} or newer (quorum-queue TTLs and "
            "at-least-once dead-lettering)",
        )
    return Check("broker version", Status.OK, f"RabbitMQ {version} (>= {wanted})")


def check_feature_flags(
    topology: Topology, flags: Mapping[str, str] | None, version: str | None, unknown_why: str
) -> Check:
    """The feature flags at-least-once dead-lettering needs are enabled.

    ``flags`` maps names to states (``None`` when they cannot be listed, which
    ``unknown_why`` explains: AMQP cannot read them).
    """
    subject = "feature flags"
    if topology.queue_type is QueueType.CLASSIC:
        return Check(
            subject, Status.SKIPPED, "classic queues: no at-least-once dead-lettering to enable"
        )
    if flags is None:
        return Check(
            subject,
            Status.SKIPPED,
            f"{unknown_why}; AMQP cannot list feature flags (the dead-lettering probe "
            "shows whether dead-lettering fires)",
        )
    parsed = _version_tuple(version) or (0,)
    problems = []
    for name in REQUIRED_FEATURE_FLAGS:
        state = flags.get(name)
        if state is None and parsed[0] >= 4:
            continue  # graduated: always on, no longer listed
        if state != "enabled":
            problems.append(f"{name} is {state or 'unknown to this broker'}")
    if problems:
        return Check(
            subject,
            Status.FAIL,
            "; ".join(problems) + ": enable with `rabbitmqctl enable_feature_flag <name>` "
            "(at-least-once dead-lettering needs them)",
        )
    return Check(subject, Status.OK, ", ".join(f"{n} enabled" for n in REQUIRED_FEATURE_FLAGS))


def check_vhost(topology: Topology, vhost: str) -> Check:
    """The URL's vhost (``vhost``) is the topology's: the one it names, or, when it names
    none, the URL's, as for apply, publishers and consumers
    (:attr:`~delayq.topology.model.Topology.declared_vhost`, :func:`delayq.urls.check_vhost`)."""
    declared = topology.declared_vhost
    if declared in (None, vhost):
        named = "" if declared else " (the URL's: the topology names none)"
        return Check("vhost", Status.OK, f"{vhost!r}{named}")
    return Check(
        "vhost",
        Status.FAIL,
        f"the topology names vhost {declared!r}, the URL connects to vhost {vhost!r}: put "
        "the topology's vhost in the URL, or change the topology's vhost",
    )


# Entities -----------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """An exchange or a queue as the management API shows it."""

    type: str | None
    """The exchange type, or the queue type (``quorum``, ``classic``)."""
    durable: bool
    arguments: Mapping[str, object]


def _subject(decl: ExchangeDecl | QueueDecl) -> str:
    return f"{decl.kind} {decl.name}"


def _same(a: object, b: object) -> bool:
    # RabbitMQ holds 1000 and 1000.0 inequivalent; Python's == does not.
    return type(a) is type(b) and a == b


def _argument_differences(wanted: Mapping[str, object], current: Mapping[str, object]) -> list[str]:
    problems = []
    for key in sorted(set(wanted) | set(current)):
        if key not in current:
            problems.append(f"{key} is not set, the topology wants {wanted[key]!r}")
        elif key not in wanted:
            problems.append(f"{key}={current[key]!r} is set, the topology does not set it")
        elif not _same(wanted[key], current[key]):
            problems.append(f"{key} is {current[key]!r}, the topology wants {wanted[key]!r}")
    return problems


def compare_entity(decl: ExchangeDecl | QueueDecl, observed: Observed | None) -> Check:
    """Compare one exchange or queue with what the management API shows."""
    subject = _subject(decl)
    if observed is None:
        return Check(subject, Status.FAIL, "missing: run `delayq topology apply`")
    problems = []
    if isinstance(decl, ExchangeDecl):
        wanted_type: str | None = decl.type
    else:
        wanted_type = str(decl.arguments.get("x-queue-type", "classic"))
    if observed.type != wanted_type:
        problems.append(f"type is {observed.type!r}, the topology wants {wanted_type!r}")
    if observed.durable != decl.durable:
        problems.append(f"durable is {observed.durable}, the topology wants {decl.durable}")
    differences = _argument_differences(decl.arguments, observed.arguments)
    if differences and isinstance(decl, QueueDecl):
        for earlier in decl.legacy:
            if not _argument_differences(earlier, observed.arguments) and not problems:
                return Check(subject, Status.OK, _legacy_detail(decl, wanted_type))
    problems += differences
    if problems:
        return Check(
            subject,
            Status.FAIL,
            "; ".join(problems) + f". RabbitMQ cannot change this in place: delete the "
            f"{decl.kind} (after draining it) and apply again, or change the topology",
        )
    count = len(decl.arguments)
    arguments = {0: "no arguments", 1: "1 argument"}.get(count, f"{count} arguments")
    durable = "durable" if decl.durable else "transient"
    return Check(subject, Status.OK, f"{wanted_type}, {durable}, {arguments} as declared")


def _legacy_detail(decl: QueueDecl, queue_type: str | None) -> str:
    return (
        f"{queue_type}, as an earlier delayq declared it (without "
        f"{', '.join(sorted(set(decl.arguments) - set(decl.legacy[0])))}): on RabbitMQ 4.x "
        "`delayq dlq|unrouted list` refuses to browse it; see the guarantees page to move it"
    )


def compare_redeclared(
    decl: ExchangeDecl | QueueDecl,
    existed: bool,
    conflict: TopologyConflict | None,
    *,
    legacy: bool = False,
) -> Check:
    """Judge one entity over AMQP: a passive declare, then a re-declare with its arguments
    (``legacy``: accepted only with the arguments of an earlier delayq)."""
    subject = _subject(decl)
    if not existed:
        return Check(subject, Status.FAIL, "missing: run `delayq topology apply`")
    if legacy and isinstance(decl, QueueDecl) and decl.legacy:
        return Check(subject, Status.OK, _legacy_detail(decl, "exists"))
    if conflict is not None:
        return Check(subject, Status.FAIL, str(conflict))
    return Check(
        subject,
        Status.OK,
        f"exists; re-declare with its {'type and ' if decl.kind == 'exchange' else ''}"
        "arguments accepted",
    )


def compare_unconfigurable(
    decl: ExchangeDecl | QueueDecl, existed: bool | None, refusal: str
) -> Check:
    """Judge one entity that this user may not declare (no configure permission: the
    re-declare was refused with ``refusal``): whether it exists, from a passive declare
    (``None``: refused too, as RabbitMQ 4.2.6 and later refuse a user with no permission
    on it); its arguments are left to a user who may declare it, or to the management API."""
    subject = _subject(decl)
    if existed is False:
        return Check(subject, Status.FAIL, "missing: run `delayq topology apply`")
    if existed is None:
        return Check(
            subject,
            Status.SKIPPED,
            f"not checked: this user has no permission on it ({refusal}; RabbitMQ 4.2.6 "
            "and later refuse even a passive declare then). Verify as a user with "
            "configure permission, or with --management-url",
        )
    return Check(
        subject,
        Status.SKIPPED,
        f"exists; its {'type and ' if decl.kind == 'exchange' else ''}arguments not "
        f"compared: this user may not declare it ({refusal}). Verify as a user with "
        "configure permission, or with --management-url",
    )


def compare_bindings(
    expected: Sequence[BindingDecl],
    observed: Mapping[str, Collection[tuple[str, str]]],
    owned: Collection[str],
    keyless: Collection[str] = (),
) -> Check:
    """Every binding the topology wants exists; delayq's own exchanges have no others.

    ``observed`` maps a source exchange to its (queue, routing key) bindings; on the
    headers exchange, (queue, x-match table as :func:`~delayq.topology.headers.table_text`
    spells it).
    ``owned`` are the exchanges only delayq binds from (tiers, retries,
    unrouted): another queue bound there would receive copies of every message.
    The ready exchange is not owned: other applications' queues bind there.
    ``keyless`` exchanges (fanout) ignore routing keys, so their keys are not compared.
    """

    def key(source: str, routing_key: str) -> str:
        return "" if source in keyless else routing_key

    def wants(b: BindingDecl) -> str:
        return table_text(b.arguments) if b.arguments else key(b.source, b.routing_key)

    wanted = {(b.source, b.destination, wants(b)) for b in expected}
    present = {
        (src, dest, key(src, routing_key))
        for src, pairs in observed.items()
        for dest, routing_key in pairs
    }
    missing = sorted(wanted - present)
    unexpected = sorted(b for b in present - wanted if b[0] in owned)
    if not missing and not unexpected:
        return Check("bindings", Status.OK, f"{len(wanted)} bindings present, no stray ones")

    def show(items: list[tuple[str, str, str]]) -> str:
        shown = ", ".join(f"{s} -> {d} [{k or '(any)'}]" for s, d, k in items[:SHOWN])
        return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")

    problems = []
    if missing:
        problems.append(
            f"{len(missing)} of {len(wanted)} missing: {show(missing)} "
            "(run `delayq topology apply`)"
        )
    if unexpected:
        problems.append(
            f"unexpected on delayq's own exchanges: {show(unexpected)} (these queues get a "
            "copy of every message: unbind them)"
        )
    return Check("bindings", Status.FAIL, "; ".join(problems))


# Output -------------------------------------------------------------------------------


def check_leftover_shards(topology: Topology, queues: Mapping[str, int] | None) -> Check:
    """Shards of a higher, earlier shard count still declared (``queues``: the vhost's
    queues and their message counts, from the management API; ``None``: not known)."""
    subject = "leftover shards"
    if queues is None:
        return Check(subject, Status.SKIPPED, "needs the management API (it lists the vhost)")
    tiers = topology.ladder.tiers
    bases = [topology.tier_name(t) for t in tiers] + [topology.retry_direct_name(t) for t in tiers]
    found = leftover_shards(bases, topology.shards, queues)
    if not found:
        return Check(subject, Status.OK, f"none beyond shards: {topology.shards}")
    held = sum(queues[name] for name in found)
    found.sort(key=lambda name: -queues[name])  # those holding messages first
    shown = ", ".join(f"{name}: {queues[name]:,}" for name in found[:6])
    return Check(
        subject,
        Status.FAIL,
        f"{len(found)} queues of a higher shard count are still declared ({shown}"
        f"{', ...' if len(found) > 6 else ''}), holding {held:,} messages: nothing publishes "
        "to them any more and what they hold is still delivered when due; delete them once "
        "empty (docs/concepts/topology.md, 'Changing K')",
    )


def checks_table(checks: Sequence[Check]) -> Table:
    """The table ``delayq topology verify`` prints, with a summary line."""
    table = Table([Column("status"), Column("check"), Column("detail")])
    for c in checks:
        table.add(c.status.value, c.subject, c.detail)
    counts = {s: sum(1 for c in checks if c.status is s) for s in Status}
    table.after.append(
        f"{len(checks)} checks: {counts[Status.OK]} OK, {counts[Status.FAIL]} FAIL, "
        f"{counts[Status.SKIPPED]} SKIPPED"
    )
    return table


def render_checks(checks: Sequence[Check]) -> str:
    """:func:`checks_table` as plain text."""
    return checks_table(checks).plain()
