"""The apply marker: a record, on the broker, that an apply of a topology completed.

``apply`` declares every entity of a namespace and, last, a small durable
exchange named after a digest of those declarations::

    <ns>.applied.<12 hex digits>

Publishers check it with a passive declare once per connection (a passive
declare needs no permission, so a least-privilege producer can) and refuse to
send while it is missing: a failed or unfinished apply, or one of another
ladder or queue type, must never leave a publisher whose confirmed messages
expire into a tier that drops them. ``apply`` deletes the marker again when it
finds one of the namespace's entities in conflict, and ``export`` writes it into
the definitions, so a broker that loads them at boot is marked too.

The digest covers the namespace's own entities (ready, unrouted, tiers, retry
tiers, levels), not the destination queues: consumers of different services may
apply their own destinations into one namespace, and a destination that is
missing parks messages in ``<ns>.unrouted`` instead of losing them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from delayq.errors import TopologyNotApplied

if TYPE_CHECKING:
    from delayq.topology.declarations import Declaration

__all__ = ["MARKER_ROLE", "Gate", "digest", "marker_name", "not_applied"]

MARKER_ROLE = "marker"
"""The ``role`` of the marker's exchange declaration."""

_DIGEST_HEX = 12
"""48 bits: two different namespace layouts never meet under one namespace name."""


def _wire(decl: Declaration) -> dict[str, Any]:
    """What the broker holds of a declaration: names, types, arguments, durability
    (``role`` only says why delayq declares it)."""
    fields = {k: v for k, v in dataclasses.asdict(decl).items() if k not in ("role", "legacy")}
    if decl.kind == "binding" and not fields["arguments"]:
        del fields["arguments"]  # a binding without arguments digests as before they existed
    legacy = getattr(decl, "legacy", ())
    if legacy:  # an apply that found the earlier form is as complete as one that made it
        fields["arguments"] = dict(legacy[0])
    return {"kind": decl.kind, **fields}


def digest(declarations: Iterable[Declaration]) -> str:
    """A stable digest of ``declarations`` (order included): the marker's suffix."""
    text = json.dumps([_wire(d) for d in declarations], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_DIGEST_HEX]


def marker_name(namespace: str, declarations_digest: str) -> str:
    return f"{namespace}.applied.{declarations_digest}"


def not_applied(namespace: str, marker: str, where: str) -> TopologyNotApplied:
    """The error of a publisher that finds no marker of its topology at ``where``."""
    return TopologyNotApplied(
        f"namespace {namespace!r} at {where} has no completed `delayq topology apply` of "
        f"this topology (its marker exchange {marker!r} does not exist): the last apply "
        "failed on a conflict or did not finish, none ran yet, or the broker has another "
        "ladder or queue type under this namespace. Nothing was sent: a message confirmed "
        "now could expire into a tier that drops it. Run `delayq topology apply` with this "
        "topology file (or apply_topology()) and fix every conflict it reports."
    )


@dataclass(frozen=True)
class Gate:
    """What a publisher checks, with a passive declare, on each connection it opens."""

    namespace: str
    marker: str
    where: str
    """The broker, for the error (password redacted)."""

    def refusal(self) -> TopologyNotApplied:
        return not_applied(self.namespace, self.marker, self.where)
