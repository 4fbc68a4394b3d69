"""What the delivery report computed (per tier and overall), as plain data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from delayq.topology.fit import LadderFit

if TYPE_CHECKING:
    pass

__all__ = [
    "PERCENTILES",
    "LatenessHistogram",
    "ReportSummary",
    "TierStats",
]


PERCENTILES = (0.5, 0.9, 0.99)


OUTCOMES = ("ack", "duplicate", "retry", "dead-letter")


ALL = "all"


@dataclass(frozen=True)
class TierStats:
    """Counts and timing figures of one tier (or of all, ``tier == "all"``); times in ms."""

    tier: str
    count: int
    outcomes: dict[str, int]
    lateness_ms: dict[str, float | None]
    """``p50``, ``p90``, ``p99``, ``max`` of delivered minus requested due."""
    overshoot_ms: dict[str, float | None]
    """``p50``, ``p90``, ``p99``, ``max`` of tier minus requested delay."""


@dataclass(frozen=True)
class LatenessHistogram:
    """Lateness per tier: positive values in log-spaced bins, the rest counted apart."""

    edges_ms: dict[str, list[float]]
    """Tier -> bin edges (ms), log-spaced over the tier's own range of positive lateness."""
    counts: dict[str, list[int]]
    """Tier -> records per bin (tiers with no late record left out)."""
    on_time: dict[str, int]
    """Tier -> records with a lateness of 0 ms or less (early by the clocks), off the log axis."""


@dataclass(frozen=True)
class ReportSummary:
    """Everything ``report`` computed; ``summary.json`` is this, as JSON."""

    records: int
    skipped: int
    """Lines not read: malformed, or of another record version."""
    tiers: list[TierStats]
    overall: TierStats
    attempts: dict[int, int]
    """Records per attempt (1 = first delivery)."""
    final_attempts: dict[int, int]
    """Final outcomes (ack, dead-letter) per attempt they happened at."""
    dead_letter_rate: float | None
    throughput: list[tuple[int, int]]
    """(bucket start, epoch ms; deliveries in the bucket)."""
    bucket_ms: int
    requested_delays: dict[int, int]
    """Requested delay (ms) -> records, duplicates left out."""
    current: LadderFit | None
    recommended: LadderFit | None
    recommended_same_tiers: LadderFit | None = None
    files: list[str] = field(default_factory=list)
    current_from: str = ""
    """Where the current ladder came from: ``--ladder``, a topology file, or the tiers
    seen in the records (which misses tiers no record went through)."""
    objective: str = "mean"
    """What the recommendation minimises: ``mean`` relative overshoot, or its ``p99``."""
    grid_ms: tuple[int, ...] = ()
    """The round values the recommended tiers were taken from."""
    empty_buckets: int = 0
    """Throughput buckets between the first and the last with no delivery (plot gaps)."""
    not_recommended: str = ""
    """Why there is no recommendation though delays were requested (the grid too short)."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["requested_delays"] = {str(k): v for k, v in sorted(self.requested_delays.items())}
        return data
