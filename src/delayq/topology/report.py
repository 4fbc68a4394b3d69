"""What ``apply`` did to each declaration: the report both adapters return.

An apply runs in two phases, the same in every adapter:

1. **check**: every exchange and queue that exists is declared again with the
   topology's arguments; the broker refuses one that differs
   (PRECONDITION_FAILED) and changes nothing. Missing ones are only noted.
2. **create**, only when nothing conflicts: the missing entities, every
   binding, and last the apply marker (:mod:`delayq.topology.marker`).

So a conflict leaves the broker as it was (nothing half-applied), and a
publisher refuses the namespace until an apply completes. A conflict that
appears between the phases (another apply racing this one) stops the creation
there: the marker is not declared, and publishers still refuse.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from delayq.errors import TopologyConflict, TopologyMissing
from delayq.topology.declarations import BindingDecl, Declaration, is_destination_entity
from delayq.topology.model import Topology

__all__ = ["ApplyReport", "ApplyResult", "ApplyStatus", "spoils_marker"]


class ApplyStatus(str, enum.Enum):
    CREATED = "created"
    """The entity did not exist and was declared."""
    PRESENT = "present"
    """The entity existed with the same arguments; nothing changed."""
    BOUND = "bound"
    """A binding was declared (bindings are idempotent and cannot be inspected over AMQP)."""
    CONFLICT = "conflict"
    """The entity exists with other arguments; it was left as it is."""
    SKIPPED = "skipped"
    """Not declared: an apply declares nothing while any entity is in conflict."""


@dataclass(frozen=True)
class ApplyResult:
    declaration: Declaration
    status: ApplyStatus
    conflict: TopologyConflict | None = None
    legacy: bool = False
    """Present in the form an earlier delayq declared (:attr:`QueueDecl.legacy`)."""


@dataclass
class ApplyReport:
    results: list[ApplyResult] = field(default_factory=list)
    marker_removed: bool = False
    """A conflict on the namespace's own entities made this apply delete the marker a
    former apply left: publishers refuse the namespace until an apply succeeds."""

    @property
    def conflicts(self) -> list[TopologyConflict]:
        return [r.conflict for r in self.results if r.conflict is not None]

    @property
    def ok(self) -> bool:
        return not self.conflicts

    def count(self, status: ApplyStatus) -> int:
        return sum(1 for r in self.results if r.status is status)

    def raise_for_conflicts(self) -> None:
        """Raise the first conflict (the others are in ``results``)."""
        if self.conflicts:
            raise self.conflicts[0]

    def summary(self) -> str:
        parts = [f"{self.count(s)} {s.value}" for s in ApplyStatus if self.count(s)]
        return ", ".join(parts) or "nothing to declare"


def spoils_marker(topology: Topology, results: Sequence[ApplyResult]) -> bool:
    """Whether a conflict is on one of the namespace's own entities, which the apply
    marker vouches for (a conflicting destination queue does not lose delayed messages:
    nothing binds it, and what is due for it is parked in ``<ns>.unrouted``)."""
    return any(
        r.conflict is not None and not is_destination_entity(topology, r.declaration)
        for r in results
    )


def existing_queue_missing(topology: Topology, decl: Declaration) -> TopologyMissing | None:
    """The error of a binding refused as missing when its queue is a destination the
    topology declares ``existing: true`` (an application's own queue, which delayq binds
    and never creates): create it, not "apply" again (``None`` for any other)."""
    if not isinstance(decl, BindingDecl):
        return None
    if decl.destination not in {d.queue for d in topology.destinations if d.existing}:
        return None
    return TopologyMissing(
        f"queue {decl.destination!r} does not exist: the topology declares it `existing: "
        "true` (an application's own queue, which delayq binds but never creates). Create "
        "it as the application has it (durable, its own arguments), then apply again; "
        "what apply declared so far stays, applying twice changes nothing"
    )
