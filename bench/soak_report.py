"""Pure helpers of ``bench/soak.py``: percentiles, lateness summaries, RSS series, tables.

No broker, no process, no clock: everything here takes numbers and returns
numbers or text, so ``tests/unit/test_soak_report.py`` can check it. The
consumer child (``bench/soak_consumer.py``) and the driver (``bench/soak.py``)
share the record format defined here.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from delayq.durations import format_ms, to_ms

RECORD = struct.Struct("<qq")
"""One handled delivery, as the consumer child writes it: sequence number, epoch ms."""

SEQ = struct.Struct("<q")
"""The first 8 bytes of every soak body: the message's sequence number."""

IMMEDIATE = "immediate"
"""The tier label of a message with no delay (``Receipt.tier`` is ``None``)."""


# Durations and ladders --------------------------------------------------------------------


def parse_ladder(text: str) -> list[int]:
    """``"1s,2s,5s,10s"`` (commas or spaces) as sorted, distinct TTLs in ms."""
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts:
        raise ValueError("the ladder is empty")
    values = sorted({to_ms(p, what="tier") for p in parts})
    if values[0] <= 0:
        raise ValueError("a tier must be longer than 0s")
    return values


# Percentiles and lateness -----------------------------------------------------------------


def percentile(sorted_values: Sequence[int], p: float) -> int:
    """Nearest-rank percentile of already sorted values (``p`` in (0, 100]).

    The smallest value with at least ``p`` % of the values at or below it, so
    it is always one of the values: p100 is the maximum, p50 of 1..4 is 2.
    """
    if not sorted_values:
        raise ValueError("no values")
    if not 0 < p <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {p}")
    rank = math.ceil(p / 100 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


@dataclass(frozen=True)
class Handled:
    """One message's delivery, as the report needs it (all epoch or duration ms)."""

    tier: str
    tier_ms: int
    delay_ms: int
    published_at_ms: int
    delivered_at_ms: int

    @property
    def lateness_ms(self) -> int:
        """Delivered minus requested due (published + delay): includes the tier's rounding."""
        return self.delivered_at_ms - (self.published_at_ms + self.delay_ms)

    @property
    def after_ttl_ms(self) -> int:
        """Delivered minus the tier's due (published + TTL): what broker and consumer add."""
        return self.delivered_at_ms - (self.published_at_ms + self.tier_ms)


@dataclass(frozen=True)
class TierSummary:
    """Lateness of one tier's deliveries (or of all of them), in ms."""

    tier: str
    count: int
    late_p50: int
    late_p99: int
    late_max: int
    after_ttl_p50: int
    after_ttl_p99: int
    after_ttl_max: int
    early: int
    """Delivered before the requested due: must be 0."""
    before_ttl: int
    """Delivered before the tier's TTL ran out (counted from the publish): must be 0."""

    @classmethod
    def of(cls, tier: str, handled: Sequence[Handled]) -> TierSummary:
        late = sorted(h.lateness_ms for h in handled)
        after = sorted(h.after_ttl_ms for h in handled)
        return cls(
            tier=tier,
            count=len(handled),
            late_p50=percentile(late, 50),
            late_p99=percentile(late, 99),
            late_max=late[-1],
            after_ttl_p50=percentile(after, 50),
            after_ttl_p99=percentile(after, 99),
            after_ttl_max=after[-1],
            early=sum(1 for x in late if x < 0),
            before_ttl=sum(1 for x in after if x < 0),
        )


def summarize(handled: Iterable[Handled]) -> list[TierSummary]:
    """One summary per tier, shortest TTL first (``immediate`` first), then ``all``."""
    by_tier: dict[tuple[int, str], list[Handled]] = {}
    everything: list[Handled] = []
    for h in handled:
        by_tier.setdefault((h.tier_ms, h.tier), []).append(h)
        everything.append(h)
    if not everything:
        return []
    rows = [TierSummary.of(tier, group) for (_, tier), group in sorted(by_tier.items())]
    return [*rows, TierSummary.of("all", everything)]


def lateness_table(rows: Sequence[TierSummary]) -> str:
    """The per-tier table: count, lateness and time after the TTL (p50/p99/max), early."""
    header = (
        f"{'tier':<10}{'count':>10}  {'late p50':>9}{'p99':>8}{'max':>8}  "
        f"{'after TTL p50':>13}{'p99':>7}{'max':>7}  {'early':>6}{'before TTL':>11}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        if r.tier == "all":
            lines.append("-" * len(header))
        lines.append(
            f"{r.tier:<10}{r.count:>10,}  {r.late_p50:>9,}{r.late_p99:>8,}{r.late_max:>8,}  "
            f"{r.after_ttl_p50:>13,}{r.after_ttl_p99:>7,}{r.after_ttl_max:>7,}  "
            f"{r.early:>6}{r.before_ttl:>11}"
        )
    return "\n".join(lines)


# Accounting -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Accounting:
    """What was sent, confirmed and handled; ``lost`` and ``early`` decide the exit code."""

    sent: int
    confirmed: int
    handled: int
    """Distinct confirmed messages the handler saw."""
    duplicates: int
    """Handler calls beyond the first for a message."""
    unconfirmed_handled: int
    """Messages handled whose publish was not confirmed (a possible outcome, not a loss)."""

    @property
    def not_confirmed(self) -> int:
        return self.sent - self.confirmed

    @property
    def lost(self) -> int:
        return self.confirmed - self.handled


def account(sent: int, confirmed: Sequence[int], seen: Sequence[int]) -> Accounting:
    """Count from per-sequence figures: ``confirmed[n]`` (0 or 1) and ``seen[n]`` (handler
    calls of message ``n``)."""
    if len(confirmed) != sent or len(seen) != sent:
        raise ValueError("confirmed and seen must have one entry per message sent")
    handled = duplicates = unconfirmed_handled = 0
    for ok, calls in zip(confirmed, seen, strict=True):
        if calls:
            duplicates += calls - 1
            if ok:
                handled += 1
            else:
                unconfirmed_handled += 1
    return Accounting(
        sent=sent,
        confirmed=sum(1 for ok in confirmed if ok),
        handled=handled,
        duplicates=duplicates,
        unconfirmed_handled=unconfirmed_handled,
    )


def counts_line(counts: Mapping[str, object]) -> str:
    """``{"handled": 1200, "retried": 0}`` as ``handled 1,200, retried 0``; a field that
    is not a count (``None``: not known yet) as it is, ``-`` for ``None``."""
    return ", ".join(f"{key.replace('_', ' ')} {_count(value)}" for key, value in counts.items())


def _count(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "-" if value is None else str(value)


def accounting_table(a: Accounting) -> str:
    rows = [
        ("sent", a.sent, ""),
        ("confirmed by the broker", a.confirmed, ""),
        ("not confirmed", a.not_confirmed, "publish failed: the caller was told"),
        ("handled (distinct, confirmed)", a.handled, ""),
        ("lost (confirmed - handled)", a.lost, "must be 0"),
        ("duplicates (extra handler calls)", a.duplicates, "at-least-once: allowed, counted"),
        ("handled but not confirmed", a.unconfirmed_handled, ""),
    ]
    return "\n".join(f"{label:<34}{value:>10,}   {note}".rstrip() for label, value, note in rows)


# RSS --------------------------------------------------------------------------------------


def parse_vmrss_kib(status_text: str) -> int:
    """The ``VmRSS`` line of a ``/proc/<pid>/status`` text, in KiB."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            fields = line.split()
            if len(fields) < 3 or fields[2] != "kB" or not fields[1].isdigit():
                raise ValueError(f"unexpected VmRSS line: {line!r}")
            return int(fields[1])
    raise ValueError("no VmRSS line (is the process a zombie, or not on Linux?)")


@dataclass(frozen=True)
class RssSample:
    at_s: float
    """Seconds since the consumer was ready."""
    kib: int
    broker: str = ""
    """The broker's memory at that moment, in brief (``broker_memory_brief``), if known."""


@dataclass(frozen=True)
class RssGrowth:
    first_kib: int
    last_kib: int
    max_kib: int
    after_warmup_kib: int | None
    """The second sample (one interval in, with every buffer warmed up), if any."""

    @property
    def growth_kib(self) -> int:
        return self.last_kib - self.first_kib

    @property
    def growth_after_warmup_kib(self) -> int | None:
        return None if self.after_warmup_kib is None else self.last_kib - self.after_warmup_kib


def rss_growth(samples: Sequence[RssSample]) -> RssGrowth:
    if not samples:
        raise ValueError("no RSS samples")
    return RssGrowth(
        first_kib=samples[0].kib,
        last_kib=samples[-1].kib,
        max_kib=max(s.kib for s in samples),
        after_warmup_kib=samples[1].kib if len(samples) > 2 else None,
    )


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


def signed_mib(kib: int) -> str:
    return f"{kib / 1024:+.1f} MiB"


def rss_table(samples: Sequence[RssSample]) -> str:
    """The RSS series, one sample a line, then the growth first to last."""
    lines = [f"{'at':>8}  {'consumer RSS':>12}  broker memory".rstrip()]
    for s in samples:
        lines.append(f"{format_ms(round(s.at_s) * 1000):>8}  {mib(s.kib):>12}  {s.broker}".rstrip())
    g = rss_growth(samples)
    pct = g.growth_kib / g.first_kib if g.first_kib else 0.0
    line = f"growth first to last: {signed_mib(g.growth_kib)} ({pct:+.1%}), max {mib(g.max_kib)}"
    after = g.growth_after_warmup_kib
    if after is not None:
        line += f"; from the second sample to the last: {signed_mib(after)}"
    lines.append(line)
    return "\n".join(lines)


# Broker memory ----------------------------------------------------------------------------

MEMORY_KEYS = ("quorum_queue_procs", "quorum_ets", "binary", "msg_index", "other_proc")
"""The ``rabbitmqctl status`` memory categories a parked backlog shows up in."""


def broker_memory_line(memory: Mapping[str, object]) -> str:
    """One line from ``rabbitmqctl status --formatter json``'s ``memory`` object."""
    total = memory.get("total")
    parts = []
    if isinstance(total, Mapping):
        for key in ("rss", "erlang"):
            value = total.get(key)
            if isinstance(value, int):
                parts.append(f"{key} {value / 2**20:,.0f} MiB")
    for key in MEMORY_KEYS:
        value = memory.get(key)
        if isinstance(value, int):
            parts.append(f"{key} {value / 2**20:,.1f} MiB")
    return ", ".join(parts) or "no figures"


def broker_memory_brief(memory: Mapping[str, object]) -> str:
    """The broker's total RSS and its two largest categories: ``rss 912 MiB (quorum_ets
    609, binary 158)``."""
    total = memory.get("total")
    rss = total.get("rss") if isinstance(total, Mapping) else None
    sizes = sorted(
        ((v, k) for k, v in memory.items() if k in MEMORY_KEYS and isinstance(v, int)),
        reverse=True,
    )
    top = ", ".join(f"{k} {v / 2**20:,.0f}" for v, k in sizes[:2])
    head = f"rss {rss / 2**20:,.0f} MiB" if isinstance(rss, int) else "rss ?"
    return f"{head} ({top})" if top else head
