"""What ``delayq stats`` shows: the queues of a topology and how many messages each holds.

Pure: the adapter (:mod:`delayq.sync.depths`) fills in a :class:`Depth` per
queue, from the management API or from AMQP passive declares, which count
only ready messages (not those delivered and unacknowledged).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from delayq.tables import Column, Table
from delayq.topology.model import Topology

__all__ = [
    "Counted",
    "Depth",
    "StatsRow",
    "Unseen",
    "render_stats",
    "stats_json",
    "stats_queues",
    "stats_rows",
    "stats_table",
]


@dataclass(frozen=True)
class StatsRow:
    """One queue of the table, with its DLQ for a destination."""

    queue: str
    role: str
    """``tier``, ``retry``, ``level``, ``destination``, ``intake`` or ``unrouted``."""
    dlq: str | None = None
    shards: tuple[str, ...] = ()
    """Set on a sharded tier's total: its shards' queues, whose depths it adds up (one
    row each follows it, role ``<role> shard``)."""

    @property
    def label(self) -> str:
        """The queue column: the queue, or a total's tier and its shard count."""
        return f"{self.queue} [{len(self.shards)} shards]" if self.shards else self.queue


@dataclass(frozen=True)
class Depth:
    ready: int
    unacked: int | None
    """``None`` when counted over AMQP, which cannot see unacknowledged messages."""
    consumers: int
    forwarding: int | None = None
    """Dead letters the queue still holds because their target has not accepted them yet
    (a quorum queue with at-least-once dead-lettering; management API only): a count
    that stays above 0 means dead-lettering is stuck (see docs/operations/deployment.md)."""

    @property
    def total(self) -> int:
        """Ready plus unacknowledged (ready only when ``unacked`` is unknown)."""
        return self.ready + (self.unacked or 0)


@dataclass(frozen=True)
class Unseen:
    """A queue this user may not even look at: RabbitMQ 4.2.6 and later refuse a passive
    declare to a user with no permission on the name. Neither a count nor ``missing``."""

    refusal: str


Counted = Depth | Unseen | None
"""A queue's count: its :class:`Depth`, :class:`Unseen`, or ``None`` when it does not exist."""


def stats_rows(topology: Topology) -> list[StatsRow]:
    """Tiers, retry tiers, cascade levels (exact strategy), destinations (with their
    DLQs), intakes' queues (with theirs: what the bridge parked or the broker
    dead-lettered), then ``<ns>.unrouted``; a sharded tier as its total, then each shard."""
    rows = [row for t in topology.ladder.tiers for row in _sharded(topology.tier_shards(t), "tier")]
    rows += [
        row for t in topology.ladder.tiers for row in _sharded(topology.retry_shards(t), "retry")
    ]
    rows += [StatsRow(topology.retry_name(t), "retry") for t in topology.ladder.tiers]  # older
    if topology.exact_enabled:
        rows += [StatsRow(topology.level_name(k), "level") for k in range(topology.exact_levels)]
    rows += [StatsRow(d.queue, "destination", d.dlq) for d in topology.destinations]
    ns = topology.namespace
    rows += [StatsRow(i.queue_name(ns), "intake", i.dlq_name(ns)) for i in topology.intakes]
    rows.append(StatsRow(topology.unrouted, "unrouted"))
    return rows


def _sharded(names: tuple[str, ...], role: str) -> list[StatsRow]:
    """One tier's rows: its queue, or with shards a total then each shard."""
    if len(names) == 1:
        return [StatsRow(names[0], role)]
    return [StatsRow(names[0], role, shards=names)] + [
        StatsRow(name, f"{role} shard") for name in names
    ]


def _depth(row: StatsRow, depths: Mapping[str, Counted]) -> Counted:
    """A queue's depth, or a total's: the sum of its shards' (``None`` if one is missing,
    else :class:`Unseen` if one is)."""
    if not row.shards:
        return depths.get(row.queue)
    parts = [depths.get(name) for name in row.shards]
    if any(part is None for part in parts):
        return None
    found = [part for part in parts if isinstance(part, Depth)]
    if len(found) < len(parts):
        return next(part for part in parts if isinstance(part, Unseen))
    unacked = [part.unacked for part in found]
    forwarding = [part.forwarding for part in found]
    return Depth(
        ready=sum(part.ready for part in found),
        unacked=None if None in unacked else sum(u or 0 for u in unacked),
        consumers=sum(part.consumers for part in found),
        forwarding=None if None in forwarding else sum(f or 0 for f in forwarding),
    )


def stats_queues(rows: Sequence[StatsRow]) -> list[str]:
    """Every queue the rows need counted, DLQs included (a total's shards have rows)."""
    names = [row.queue for row in rows if not row.shards]
    names += [row.dlq for row in rows if row.dlq is not None]
    return names


def _cell(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _total(depth: Counted) -> str:
    if depth is None:
        return "missing"
    return "hidden" if isinstance(depth, Unseen) else _cell(depth.total)


def stats_table(rows: Sequence[StatsRow], depths: Mapping[str, Counted], source: str) -> Table:
    """The table: one line per row; ``missing`` where a queue does not exist, ``hidden``
    where this user may not look at it."""
    table = Table(
        [Column("queue"), Column("role")]
        + [Column(h, right=True) for h in ("depth", "ready", "unacked", "consumers", "dlq depth")],
        before=[f"source: {source}"],
    )
    for row in rows:
        depth = _depth(row, depths)
        dlq = "-" if row.dlq is None else _total(depths.get(row.dlq))
        if not isinstance(depth, Depth):
            cells = [_total(depth), "", "", ""]
        else:
            cells = [
                _cell(depth.total),
                _cell(depth.ready),
                _cell(depth.unacked),
                _cell(depth.consumers),
            ]
        table.add(row.label, row.role, *cells, dlq)
    for row in rows:
        depth = None if row.shards else depths.get(row.queue)
        if isinstance(depth, Depth) and depth.forwarding:
            table.after.append(
                f"{row.queue} holds {depth.forwarding:,} dead letters not yet forwarded; "
                "if this lasts more than a few seconds, dead-lettering is stuck "
                "(docs/operations/deployment.md: 'dead letters that stop moving')"
            )
    if any(isinstance(d, Depth) and d.unacked is None for d in depths.values()):
        table.after.append(
            "AMQP counts ready messages only (unacked: ?); quorum queues' counts can lag a little"
        )
    if any(isinstance(d, Unseen) for d in depths.values()):
        table.after.append(
            "hidden: this user has no permission on the queue, and RabbitMQ 4.2.6 and later "
            "refuse it even a passive declare; count as a user with one (the admin), or "
            "through the management API"
        )
    return table


def render_stats(rows: Sequence[StatsRow], depths: Mapping[str, Counted], source: str) -> str:
    """:func:`stats_table` as plain text."""
    return stats_table(rows, depths, source).plain()


def stats_json(rows: Sequence[StatsRow], depths: Mapping[str, Counted], source: str) -> str:
    """The same as JSON, for scripts and monitoring: ``exists`` is ``null`` and ``hidden``
    true where this user may not look at a queue."""
    queues = []
    for row in rows:
        depth = _depth(row, depths)
        entry: dict[str, object] = {"queue": row.queue, "role": row.role}
        if row.shards:
            entry["shards"] = list(row.shards)
        entry["exists"] = None if isinstance(depth, Unseen) else depth is not None
        if isinstance(depth, Unseen):
            entry["hidden"] = True
        elif depth is not None:
            entry.update(asdict(depth), depth=depth.total)
        if row.dlq is not None:
            dlq_depth = depths.get(row.dlq)
            entry["dlq"] = row.dlq
            entry["dlq_depth"] = dlq_depth.total if isinstance(dlq_depth, Depth) else None
            if isinstance(dlq_depth, Unseen):
                entry["dlq_hidden"] = True
        queues.append(entry)
    return json.dumps({"source": source, "queues": queues}, indent=2) + "\n"
