"""What ``apply`` did to each declaration: the report both adapters return."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from delayq.declarations import Declaration
from delayq.errors import TopologyConflict

__all__ = ["ApplyReport", "ApplyResult", "ApplyStatus"]


class ApplyStatus(str, enum.Enum):
    CREATED = "created"
    """The entity did not exist and was declared."""
    PRESENT = "present"
    """The entity existed with the same arguments; nothing changed."""
    BOUND = "bound"
    """A binding was declared (bindings are idempotent and cannot be inspected over AMQP)."""
    CONFLICT = "conflict"
    """The entity exists with other arguments; it was left as it is."""


@dataclass(frozen=True)
class ApplyResult:
    declaration: Declaration
    status: ApplyStatus
    conflict: TopologyConflict | None = None


@dataclass
class ApplyReport:
    results: list[ApplyResult] = field(default_factory=list)

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
