"""How long a consumer's store must keep cancel marks: retention against the topology.

A cancel is a mark in the consumers' store (see ``docs/concepts/cancel.md``), pruned
``retention`` after it was made, like a completed key. A mark that expires before the
last copy it is meant to stop arrives lets that copy be handled: a cancelled message
runs, and nothing says so. So a consumer with a store that keeps marks refuses, when
it is built, a ``retention`` shorter than the longest a copy can still arrive after a
cancel:

    the largest wait of the topology + the retry horizon + a margin

* the **largest wait**: the largest tier of the ladder, or the exact strategy's
  cascade maximum when the topology has the cascade (a publish may use it), whichever
  is longer;
* the **retry horizon**: the waits of every retry of the consumer's policy, as the
  topology routes them (each delay rounded up to its tier);
* the **margin**: :data:`RETENTION_MARGIN_MS` (consumers stopped, queues backed up).

>>> from delayq import Topology
>>> from delayq.consume.retry import FixedBackoff
>>> topology = Topology(namespace="shop", ladder=["1m", "1h"],
...                     destinations=[{"queue": "orders", "bindings": ["order.*"]}])
>>> need = needed_retention(topology, FixedBackoff(delay="1m", max_attempts=3))
>>> (need.largest_wait_ms, need.retry_horizon_ms, need.total_ms)
(3600000, 120000, 90120000)
"""

from __future__ import annotations

from dataclasses import dataclass

from delayq.consume.retry import RetryPolicy
from delayq.durations import format_ms
from delayq.errors import InvalidInput
from delayq.topology.model import Topology
from delayq.topology.route import Router

__all__ = ["RETENTION_MARGIN_MS", "RetentionNeed", "check_mark_retention", "needed_retention"]

RETENTION_MARGIN_MS = 86_400_000
"""A day on top of the longest a copy can take: a consumer stopped over a night, a
backed-up queue, clocks apart. The default retention (7 days) covers ladders up to
about 5 days with the default retry policy."""


@dataclass(frozen=True, slots=True)
class RetentionNeed:
    """The shortest safe retention for one consumer, and what it is made of."""

    largest_wait_ms: int
    largest_wait: str
    """That wait in words: ``"the largest tier 24h"``."""
    retry_horizon_ms: int
    retries: int
    margin_ms: int = RETENTION_MARGIN_MS

    @property
    def total_ms(self) -> int:
        return self.largest_wait_ms + self.retry_horizon_ms + self.margin_ms

    def __str__(self) -> str:
        return (
            f"{format_ms(self.total_ms)} = {self.largest_wait} "
            f"+ {format_ms(self.retry_horizon_ms)} of retries ({self.retries}) "
            f"+ a margin of {format_ms(self.margin_ms)}"
        )


def needed_retention(topology: Topology, policy: RetryPolicy) -> RetentionNeed:
    """The retention a store keeping cancel marks needs for ``policy`` on ``topology``
    (``policy`` must fit the topology: see :func:`~delayq.consume.retry.check_policy`)."""
    largest_ms = topology.ladder.max_ms
    largest = f"the largest tier {topology.ladder.tiers[-1].label}"
    if topology.exact_enabled:
        cascade_ms = (2**topology.exact_levels - 1) * topology.exact_unit_ms
        if cascade_ms > largest_ms:
            largest_ms = cascade_ms
            largest = f"the exact cascade's maximum {format_ms(cascade_ms)}"
    rows = policy.schedule(Router(topology))
    horizon = rows[-1].cumulative_ms if rows else 0
    return RetentionNeed(largest_ms, largest, horizon, len(rows))


def check_mark_retention(
    retention_ms: int,
    topology: Topology,
    policy: RetryPolicy,
    *,
    what: str = "retention",
    queue: str | None = None,
) -> RetentionNeed:
    """The need, if ``retention_ms`` meets it; else :class:`~delayq.errors.InvalidInput`
    naming both figures and the fixes (``what`` names the setting: ``retention``, or a
    store's own ``retention_ms``)."""
    need = needed_retention(topology, policy)
    if retention_ms >= need.total_ms:
        return need
    where = f" of the consumer of {queue!r}" if queue else ""
    raise InvalidInput(
        f"{what} {format_ms(retention_ms)}{where} is shorter than a cancel mark must last: "
        f"{need}. A mark pruned before the copy it stops arrives lets a cancelled message "
        f"be handled. Set {what} to at least {format_ms(need.total_ms)} (or shorten the "
        "ladder or the retry policy); if this consumer's messages are never cancelled, "
        "pass check_retention=False"
    )
