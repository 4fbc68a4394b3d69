"""Finding dead letters that stopped moving, from snapshots of the queues: the pure part.

A tier queue (quorum, ``x-dead-letter-strategy: at-least-once``) keeps each
expired message until its dead-letter target confirmed it. Those messages are
neither ready nor unacknowledged, so they show in the management API's counts
only as ``messages - messages_ready - messages_unacknowledged`` (RabbitMQ 3.10
has no column of its own for them). A working dead-letter worker forwards a
burst at thousands per second; a count that stays above 0 and never goes down
for ``threshold`` means the worker stopped (on 3.10.8 it can, after the queue's
leader node was lost: docs/operations/deployment.md).

:class:`StallDetector` is fed one :class:`QueueSample` per queue per look and
says which queues are stalled. It knows nothing of HTTP or of how a stall is
healed: :mod:`delayq.ops.watchdog` does both.

>>> detector = StallDetector(threshold="30s")
>>> s = QueueSample("ns.tier.5m", messages=900, ready=0, unacked=0, leader="rabbit@b",
...                 members=("rabbit@a", "rabbit@b", "rabbit@c"),
...                 online=("rabbit@b", "rabbit@c"))
>>> detector.observe([s], now_s=0.0), len(detector.observe([s], now_s=31.0))
([], 1)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from delayq.durations import Duration, to_ms
from delayq.errors import InvalidInput

if TYPE_CHECKING:  # the CLI's help reads the defaults here: no pydantic for it
    from delayq.topology.model import Topology

__all__ = [
    "DEFAULT_INTERVAL",
    "DEFAULT_THRESHOLD",
    "QueueSample",
    "Stall",
    "StallDetector",
    "forwarding_queues",
    "sample_from_api",
]

DEFAULT_THRESHOLD: Duration = "60s"
"""How long dead letters may wait without any going out before the queue counts as stalled.
Far above the few seconds a working worker needs (and the management API's 5 s refresh)."""
DEFAULT_INTERVAL: Duration = "10s"
"""How often the watchdog looks."""


@dataclass(frozen=True)
class QueueSample:
    """One queue as the management API showed it at one moment."""

    queue: str
    messages: int
    ready: int
    unacked: int
    leader: str | None = None
    members: tuple[str, ...] = ()
    online: tuple[str, ...] = ()

    @property
    def waiting(self) -> int:
        """Dead letters held for their target: neither ready nor unacknowledged."""
        return max(0, self.messages - self.ready - self.unacked)

    @property
    def targets(self) -> tuple[str, ...]:
        """Online members that could take over from the leader."""
        return tuple(node for node in self.online if node != self.leader)


@dataclass(frozen=True)
class Stall:
    """A queue whose dead letters have not moved for ``stalled_s``."""

    sample: QueueSample
    stalled_s: float

    @property
    def queue(self) -> str:
        return self.sample.queue

    @property
    def waiting(self) -> int:
        return self.sample.waiting

    def describe(self) -> str:
        leader = self.sample.leader or "no leader"
        return (
            f"{self.queue} holds {self.waiting:,} dead letters that have not moved for "
            f"{self.stalled_s:.0f} s (leader {leader})"
        )


@dataclass
class _Track:
    since_s: float
    waiting: int
    leader: str | None
    reported: bool = False


@dataclass
class StallDetector:
    """Which queues hold dead letters that stopped moving.

    A queue's clock starts when it is first seen holding dead letters, and starts
    again whenever the count goes down (some went out), its leader changes (a new
    leader starts a new dead-letter worker) or :meth:`forget` is called (after a
    heal). It is stalled once the clock passes ``threshold``; it is reported once
    per stall, then again only after its clock restarted and ran out again.
    """

    threshold: Duration = DEFAULT_THRESHOLD
    _tracks: dict[str, _Track] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.threshold_s = to_ms(self.threshold, what="threshold") / 1000
        if self.threshold_s <= 0:
            raise InvalidInput(f"threshold must be above 0, not {self.threshold!r}")

    def observe(self, samples: Iterable[QueueSample], now_s: float) -> list[Stall]:
        """Take one look at every queue; return the stalls found in it (new ones only)."""
        stalls = []
        seen = set()
        for sample in samples:
            seen.add(sample.queue)
            track = self._tracks.get(sample.queue)
            if sample.waiting == 0:
                self._tracks.pop(sample.queue, None)
                continue
            if track is None or sample.waiting < track.waiting or sample.leader != track.leader:
                self._tracks[sample.queue] = _Track(now_s, sample.waiting, sample.leader)
                continue
            track.waiting = sample.waiting
            stalled_s = now_s - track.since_s
            if stalled_s >= self.threshold_s and not track.reported:
                track.reported = True
                stalls.append(Stall(sample, stalled_s))
        for gone in set(self._tracks) - seen:  # deleted, or no longer watched
            del self._tracks[gone]
        return stalls

    def forget(self, queue: str) -> None:
        """Start ``queue``'s clock again at its next sample (after trying to heal it)."""
        self._tracks.pop(queue, None)

    def waiting(self) -> dict[str, int]:
        """Queues holding dead letters at the last look, and how many."""
        return {name: track.waiting for name, track in self._tracks.items()}


def forwarding_queues(topology: Topology) -> list[str]:
    """The queues of ``topology`` that dead-letter at least once to a target: every tier
    and retry tier (each shard) and each level of the exact cascade. Not the
    destinations: their dead letters go to a DLQ only past the delivery limit, and
    moving a work queue's leader is not harmless (docs/operations/deployment.md)."""
    names: list[str] = []
    for tier in topology.ladder.tiers:
        names += topology.tier_shards(tier)
        names += topology.retry_shards(tier)
        names.append(topology.retry_name(tier))  # the older, unsharded retry tier
    if topology.exact_enabled:
        names += [topology.level_name(k) for k in range(topology.exact_levels)]
    return list(dict.fromkeys(names))


def sample_from_api(row: Mapping[str, Any]) -> QueueSample | None:
    """A :class:`QueueSample` from one row of ``GET /api/queues/<vhost>``; ``None`` for a
    queue that is not a quorum queue (only those dead-letter at least once)."""
    if row.get("type") != "quorum":
        return None
    members = tuple(str(m) for m in row.get("members") or ())
    return QueueSample(
        queue=str(row["name"]),
        messages=int(row.get("messages") or 0),
        ready=int(row.get("messages_ready") or 0),
        unacked=int(row.get("messages_unacknowledged") or 0),
        leader=str(row["leader"]) if row.get("leader") else None,
        members=members,
        online=tuple(str(m) for m in row.get("online") or members),
    )
