"""The schedule index beside the tier queues (``delayq stats --index``): for each tier,
how many messages the index says wait there and how many its queues hold. Pure: the
counts come from the index (:meth:`~delayq.schedule.base.ScheduleStore.tiers`) and
from :mod:`delayq.sync.depths`.

The two need not be equal. A tier holds *more* than the index says when it also holds
copies that will be acked unhandled (cancelled, or the older copy of a rescheduled
message), or messages published without an index. A tier holding *fewer* is the
disagreement worth a look: entries shown waiting whose messages left the tier without
a report (a consumer with no ``ScheduleReporter``, one killed before its reporter
wrote, a queue purged outside delayq).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from delayq.ops.depths import Counted, Depth
from delayq.tables import Column, Table
from delayq.topology.model import Topology

__all__ = ["REPLAYED", "TierBeside", "beside", "beside_json", "beside_table"]

REPLAYED = ""
"""The tier of a DLQ replay's entries (:mod:`delayq.schedule.replays`): sent to their
queues at once, waiting there until a consumer takes them, in no tier."""


@dataclass(frozen=True)
class TierBeside:
    """One tier: its label, its queues, what the index and the queues say."""

    tier: str
    queues: tuple[str, ...]
    indexed: int
    """Waiting entries (scheduled, rescheduled) of the tier in the index."""
    queued: int | None
    """Messages its queues hold (``None``: not counted: a queue missing or hidden)."""

    @property
    def unheld(self) -> int:
        """Entries the index shows waiting beyond what the queues hold."""
        return 0 if self.queued is None else max(0, self.indexed - self.queued)


def beside(
    topology: Topology, tiers: Mapping[str, int], depths: Mapping[str, Counted]
) -> list[TierBeside]:
    """A row per tier of the ladder (and the exact strategy's levels as ``exact``), then
    one per tier the index names that the ladder has not (queues: none)."""
    places: dict[str, tuple[str, ...]] = {
        t.label: topology.tier_shards(t) for t in topology.ladder.tiers
    }
    if topology.exact_enabled:
        places["exact"] = tuple(topology.level_name(k) for k in range(topology.exact_levels))
    rows = []
    for label, queues in places.items():
        counted = [depths.get(q) for q in queues]
        queued = (
            sum(d.total for d in counted if isinstance(d, Depth))
            if all(isinstance(d, Depth) for d in counted)
            else None
        )
        rows.append(TierBeside(label, queues, tiers.get(label, 0), queued))
    rows += [TierBeside(t, (), n, None) for t, n in sorted(tiers.items()) if t not in places]
    return rows


def _notes(rows: list[TierBeside]) -> list[str]:
    notes = [
        f"tier {r.tier}: the index shows {r.unheld:,} more waiting than its queues hold "
        "(left without a report: a consumer without a ScheduleReporter or killed before "
        "it wrote, or a queue purged outside delayq)"
        for r in rows
        if r.unheld
    ]
    notes += [
        f"tier {r.tier}: {r.indexed:,} waiting in the index, but the topology has no such "
        "tier (its ladder changed?)"
        for r in rows
        if not r.queues and r.tier != REPLAYED
    ]
    return notes


def beside_table(rows: list[TierBeside]) -> Table:
    table = Table([Column("tier"), Column("in the index"), Column("in its queues")])
    for r in rows:
        queued = "?" if r.queued is None else f"{r.queued:,}"
        if r.tier == REPLAYED:
            table.add("(none: replayed)", f"{r.indexed:,}", "at their destinations")
            continue
        table.add(r.tier, f"{r.indexed:,}", queued)
    table.after += _notes(rows)
    return table


def beside_json(rows: list[TierBeside]) -> dict[str, object]:
    return {
        "tiers": [{**asdict(r), "queues": list(r.queues), "unheld": r.unheld} for r in rows],
        "disagrees": bool(_notes(rows)),
    }
