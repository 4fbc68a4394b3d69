"""The exact strategy's pure core: a binary cascade of fixed-TTL levels.

Level ``k`` is a topic exchange and a quorum queue whose messages all wait
``2**k`` units, dead-lettering to level ``k - 1`` (level 0 to the delivery
exchange). A delay of ``d`` units is published to the level of its highest set
bit with a routing key that spells its bits, most significant first::

    <bit N-1>.<bit N-2>. ... .<bit 0>.<kind>.<target>

Level ``k``'s exchange sends keys whose bit ``k`` is ``1`` to its queue and
keys whose bit ``k`` is ``0`` straight on to level ``k - 1`` (topic bindings
``*.`` repeated ``N-1-k`` times, then ``1.#`` or ``0.#``), so a message waits
in exactly the levels of its set bits: ``popcount(d)`` hops, every one exact.

``kind`` is ``r`` (route: ``target`` is the destination routing key, dots
included, matched by the queues' own binding keys behind the prefix) or ``q``
(address: ``target`` is one queue's name, for retries that must reach the
failing queue alone). The key is always rebuilt from the target, never from a
received key, so it never grows across retries or replays: its length is
``2 * N + 2 + len(target)``.

>>> key = encode_key(10, 4, Kind.ROUTE, "orders.remind")
>>> key
'1.0.1.0.r.orders.remind'
>>> decode_key(key, 4)
CascadeKey(units=10, kind=<Kind.ROUTE: 'r'>, target='orders.remind')
>>> entry_level(10), hops(10)
(3, 2)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from delayq.durations import format_ms
from delayq.errors import DelayTooLong

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_LEVELS",
    "CascadeKey",
    "CascadePlan",
    "Kind",
    "Strategy",
    "decode_key",
    "default_levels",
    "delivery_binding_key",
    "encode_key",
    "entry_level",
    "hops",
    "key_overhead",
    "level_binding_keys",
    "plan_cascade",
    "units_for",
]

MAX_LEVELS = 28
"""As NServiceBus: 2**28 - 1 units (8.5 years at 1 s)."""

MAX_KEY_BYTES = 255
"""AMQP's limit on a routing key (a short string)."""


class Strategy(str, enum.Enum):
    """How a delay is waited out."""

    TIERED = "tiered"
    """One hop into the smallest tier at or above the delay: late by at most the gap."""
    EXACT = "exact"
    """The binary cascade: never early, late by less than one unit, ``popcount`` hops."""


class Kind(str, enum.Enum):
    """What the target at the end of a cascade key is."""

    ROUTE = "r"
    """A destination routing key, matched by the destinations' binding keys."""
    ADDRESS = "q"
    """A queue name: the message reaches that queue alone (retries)."""


@dataclass(frozen=True, slots=True)
class CascadeKey:
    """A cascade routing key taken apart."""

    units: int
    kind: Kind
    target: str


@dataclass(frozen=True, slots=True)
class CascadePlan:
    """Where a delay enters the cascade and how long it waits."""

    units: int
    level: int
    """The entry level (highest set bit); publish to its exchange."""
    hops: int
    wait_ms: int
    """The time actually waited: ``units * unit_ms`` (never less than the delay)."""
    routing_key: str


def units_for(delay_ms: int, unit_ms: int) -> int:
    """Whole units for a delay, rounded up so a message is never early."""
    return -(-delay_ms // unit_ms)


def entry_level(units: int) -> int:
    """The level of the highest set bit (``units`` must be at least 1)."""
    return units.bit_length() - 1


def hops(units: int) -> int:
    """How many level queues a message waits in: one per set bit."""
    return bin(units).count("1")


def key_overhead(levels: int) -> int:
    """Bytes a cascade key adds to its target: ``N`` bits, the kind, and their dots."""
    return 2 * levels + 2


def default_levels(max_ms: int, unit_ms: int) -> int:
    """Enough levels for ``max_ms`` (``2**N - 1`` units at least), capped at :data:`MAX_LEVELS`."""
    return max(1, min(MAX_LEVELS, units_for(max_ms, unit_ms).bit_length()))


def encode_key(units: int, levels: int, kind: Kind, target: str) -> str:
    """The routing key for ``units`` over ``levels`` levels, ending in ``kind.target``."""
    if not 0 <= units < 2**levels:
        raise ValueError(f"{units} units do not fit in {levels} levels")
    bits = format(units, f"0{levels}b") if levels else ""
    return ".".join((*bits, kind.value, target))


def decode_key(key: str, levels: int) -> CascadeKey:
    """Take a cascade key apart; the target comes back exactly, dots included.

    Raises ``ValueError`` for a key not made by :func:`encode_key` for ``levels``.
    """
    parts = key.split(".", levels + 1)
    if len(parts) != levels + 2 or any(p not in ("0", "1") for p in parts[:levels]):
        raise ValueError(f"{key!r} is not a cascade key of {levels} levels")
    try:
        kind = Kind(parts[levels])
    except ValueError:
        raise ValueError(f"{key!r} has no cascade kind ('r' or 'q') after its bits") from None
    units = int("".join(parts[:levels]), 2) if levels else 0
    return CascadeKey(units, kind, parts[levels + 1])


def level_binding_keys(level: int, levels: int) -> tuple[str, str]:
    """Level ``level``'s topic binding keys: (bit set: to its queue, bit clear: onwards)."""
    prefix = "*." * (levels - 1 - level)
    return f"{prefix}1.#", f"{prefix}0.#"


def delivery_binding_key(levels: int, kind: Kind, target: str) -> str:
    """The delivery exchange's binding key for a destination binding or a queue address."""
    return "*." * levels + f"{kind.value}.{target}"


def plan_cascade(
    delay_ms: int, unit_ms: int, levels: int, kind: Kind, target: str
) -> CascadePlan | None:
    """Where a delay of ``delay_ms`` enters the cascade; ``None`` means immediate.

    Raises :class:`~delayq.errors.DelayTooLong` above ``2**levels - 1`` units.
    """
    if delay_ms <= 0:
        return None
    units = units_for(delay_ms, unit_ms)
    if units >= 2**levels:
        raise DelayTooLong(
            f"delay {format_ms(delay_ms)} is longer than the exact strategy's maximum "
            f"{format_ms((2**levels - 1) * unit_ms)} ({levels} levels of "
            f"{format_ms(unit_ms)}); raise exact.levels (at most {MAX_LEVELS}) or exact.unit"
        )
    return CascadePlan(
        units=units,
        level=entry_level(units),
        hops=hops(units),
        wait_ms=units * unit_ms,
        routing_key=encode_key(units, levels, kind, target),
    )
