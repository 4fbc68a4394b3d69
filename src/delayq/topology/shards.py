"""Tier shards: one tier spread over ``shards`` queues, chosen by the message id.

A tier is one queue, and one queue is one Erlang process on one node: a burst
of due messages dead-letters only as fast as that process goes (about 13,000
messages a second on a quorum queue here). ``shards: K`` in the topology
declares each tier (and each retry tier) as ``K`` exchange-and-queue pairs and
publishes a message into shard ``crc32(message_id) mod K``:

* shard 0 keeps the unsharded name and arguments (``<ns>.tier.5m``), so
  ``shards: 1`` (the default) declares exactly what delayq always declared,
  and raising ``shards`` only adds queues;
* shard ``i >= 1`` is ``<base>.s<i>`` (``<ns>.tier.5m.s1``,
  ``<ns>.retry.5m.direct.s3``); on quorum queues it carries
  ``x-queue-leader-locator: balanced`` (RabbitMQ 3.10+), so a cluster places
  its leader on the node with the fewest quorum queue leaders;
* the hash is CRC-32 of the id's UTF-8 bytes: the same id lands in the same
  shard in every process, on every machine and in every delayq version, so a
  re-send or a duplicate of a message waits where the first one did.

Every shard dead-letters where the tier did, so which shard a message waited
in changes nothing downstream. Ordering between messages holds only within
one shard: two messages are ordered only if their ids map to one shard.

>>> shard_names("shop.tier.5m", 3)
('shop.tier.5m', 'shop.tier.5m.s1', 'shop.tier.5m.s2')
>>> shard_of("order-42", 4) == shard_of("order-42", 4)
True
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

__all__ = [
    "LEADER_LOCATOR",
    "MAX_SHARDS",
    "SHARD_SUFFIX_PATTERN",
    "check_shards",
    "leftover_shards",
    "shard_names",
    "shard_of",
]

MAX_SHARDS = 64
"""The most queues one tier may be spread over: each is a Raft group (on quorum
queues) per tier and per retry tier, and past the cores of a cluster more shards
only cost memory."""

LEADER_LOCATOR = {"x-queue-leader-locator": "balanced"}
"""What shards 1.. of a quorum tier carry (RabbitMQ 3.10 accepts it on quorum queues
only, and compares it on redeclare: it is part of the queue's arguments)."""

SHARD_SUFFIX_PATTERN = r"(?:\.s[0-9]+)?"
"""A regex for the optional shard suffix of a tier name (the grants use it)."""


def check_shards(value: object) -> int:
    """``value`` as a shard count: a whole number from 1 to :data:`MAX_SHARDS`.

    Raises ``ValueError`` (the topology model reports it as
    :class:`~delayq.errors.InvalidTopology`).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"must be a whole number of queues per tier from 1 to {MAX_SHARDS}, "
            f"not {value!r} ({type(value).__name__})"
        )
    if not 1 <= value <= MAX_SHARDS:
        raise ValueError(
            f"must be from 1 to {MAX_SHARDS} queues per tier, not {value} "
            "(1: one queue per tier, as without shards)"
        )
    return value


def shard_names(base: str, shards: int) -> tuple[str, ...]:
    """The names of a tier's ``shards`` exchanges and queues: ``base``, ``base.s1``, ..."""
    return (base, *(f"{base}.s{i}" for i in range(1, shards)))


def shard_of(message_id: str, shards: int) -> int:
    """The shard of ``message_id``: CRC-32 of its UTF-8 bytes, modulo ``shards``
    (stable across processes and versions, unlike Python's salted ``hash()``)."""
    if shards == 1:
        return 0
    return zlib.crc32(message_id.encode("utf-8")) % shards


def leftover_shards(bases: Iterable[str], shards: int, names: Iterable[str]) -> list[str]:
    """Of ``names`` (a vhost's queues), the shards of ``bases`` at or above ``shards``:
    declared by an earlier, higher shard count, and no longer published to.

    >>> leftover_shards(["shop.tier.5m"], 2, ["shop.tier.5m", "shop.tier.5m.s1",
    ...                                        "shop.tier.5m.s3", "shop.tier.5m.sx"])
    ['shop.tier.5m.s3']
    """
    wanted = set(bases)
    found = []
    for name in names:
        base, dot_s, index = name.rpartition(".s")
        if dot_s and base in wanted and index.isdigit() and not index.startswith("0"):
            if int(index) >= shards:
                found.append(name)
    return sorted(found)
