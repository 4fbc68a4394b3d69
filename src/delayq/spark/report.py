"""``delayq spark report``: what the delays did in production, from delivery records.

Reads the JSON-lines records of :mod:`delayq.observe.records` (version 1; lines of other
versions and malformed lines are skipped and counted) and computes, per tier
and overall:

* counts by outcome (ack, duplicate, retry, dead-letter);
* **lateness**, delivered minus the requested due time (published at plus the
  requested delay): what a user waited beyond what they asked for;
* **overshoot**, the tier minus the requested delay: the part of the lateness
  the ladder causes (the rest is the broker and the consumer);
* p50 / p90 / p99 / max of both (exact percentiles, linear interpolation);
* the retry distribution (records per attempt; final outcomes per attempt),
  the dead-letter rate (dead-letter / (ack + dead-letter)) and the throughput
  per time bucket.

It writes ``summary.json``, ``report.md`` and PNG plots (lateness histogram per
tier, requested-delay distribution against the ladder, throughput), and
recommends a ladder (:func:`delayq.topology.fit.recommend_ladder`) shown beside
the current one.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delayq.durations import format_ms
from delayq.errors import InvalidInput
from delayq.observe.records import RECORD_VERSION
from delayq.topology.fit import LadderFit, ladder_overshoot, recommend_ladder
from delayq.topology.ladder import Ladder

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["PERCENTILES", "RECORDS_SCHEMA", "ReportSummary", "TierStats", "report"]

RECORDS_SCHEMA = (
    "v int, message_id string, routing_key string, queue string, attempt int, "
    "outcome string, reason string, requested_delay_ms long, tier string, tier_ms long, "
    "published_at_ms long, due_at_ms long, delivered_at_ms long, settled_at_ms long, "
    "handler_ms double, _corrupt_record string"
)
PERCENTILES = (0.5, 0.9, 0.99)
_PLOTS = frozenset({"lateness_by_tier.png", "requested_delays.png", "throughput.png"})
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

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["requested_delays"] = {str(k): v for k, v in sorted(self.requested_delays.items())}
        return data


def _quantiles(df: DataFrame, column: str, group: str | None) -> dict[str, dict[str, Any]]:
    from pyspark.sql import functions as F

    keys = [F.col(group)] if group else [F.lit(ALL).alias("tier")]
    rows = (
        df.where(F.col(column).isNotNull())
        .groupBy(*keys)
        .agg(
            F.percentile(F.col(column), list(PERCENTILES)).alias("p"),
            F.max(column).alias("max"),
        )
        .collect()
    )
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        figures: dict[str, Any] = {
            f"p{round(q * 100)}": float(v) for q, v in zip(PERCENTILES, row["p"], strict=True)
        }
        figures["max"] = float(row["max"])
        out[row[0]] = figures
    return out


def _empty_figures() -> dict[str, float | None]:
    return {**{f"p{round(q * 100)}": None for q in PERCENTILES}, "max": None}


def load_records(spark: SparkSession, path: str) -> tuple[DataFrame, int]:
    """Version-1 records under ``path`` (a file or a directory of ``*.jsonl``), and how many
    lines were skipped."""
    from pyspark.sql import functions as F

    raw = (
        spark.read.schema(RECORDS_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt_record")
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.jsonl")
        .json(path)
        .cache()
    )
    # A v1 line without an outcome or a delivery time (`{"v": 1}`) is no record: counted as
    # one it would make a report of nothing look like a report.
    good = raw.where(
        F.col("_corrupt_record").isNull()
        & (F.col("v") == RECORD_VERSION)
        & F.col("outcome").isNotNull()
        & F.col("delivered_at_ms").isNotNull()
    )
    total = raw.count()
    good = good.drop("_corrupt_record").cache()
    kept = good.count()
    raw.unpersist()
    return good, total - kept


def compute(
    records: DataFrame,
    *,
    skipped: int = 0,
    ladder: Ladder | None = None,
    max_tiers: int | None = None,
    bucket_ms: int | None = None,
) -> ReportSummary:
    """The figures of a report from a DataFrame of version-1 records."""
    from pyspark.sql import functions as F

    df = records.withColumn(
        "lateness_ms", F.col("delivered_at_ms") - F.col("due_at_ms")
    ).withColumn("overshoot_ms", F.col("tier_ms") - F.col("requested_delay_ms"))
    df = df.withColumn("tier", F.coalesce(F.col("tier"), F.lit("(none)"))).cache()
    counts = df.groupBy("tier", "outcome").count().collect()
    if not counts:
        df.unpersist()  # left cached, a later report of the same plan would find it empty
        raise InvalidInput(
            "no delivery records (version 1) were found"
            + (
                f": all {skipped:,} lines were skipped (malformed, or another record version)"
                if skipped
                else ""
            )
        )
    per_tier: dict[str, dict[str, int]] = {}
    tier_ms: dict[str, int] = {}
    for row in counts:
        per_tier.setdefault(row["tier"], {})[row["outcome"]] = row["count"]
    for row in df.groupBy("tier").agg(F.max("tier_ms").alias("ms")).collect():
        if row["ms"] is not None:
            tier_ms[row["tier"]] = row["ms"]
    late = _quantiles(df, "lateness_ms", "tier")
    late_all = _quantiles(df, "lateness_ms", None)
    over = _quantiles(df, "overshoot_ms", "tier")
    over_all = _quantiles(df, "overshoot_ms", None)

    def stats(tier: str, outcomes: dict[str, int], lateness: Any, overshoot: Any) -> TierStats:
        return TierStats(
            tier=tier,
            count=sum(outcomes.values()),
            outcomes={
                o: outcomes.get(o, 0) for o in (*OUTCOMES, *sorted(set(outcomes) - set(OUTCOMES)))
            },
            lateness_ms=lateness or _empty_figures(),
            overshoot_ms=overshoot or _empty_figures(),
        )

    order = sorted(per_tier, key=lambda t: (t != "immediate", tier_ms.get(t, math.inf), t))
    tiers = [stats(t, per_tier[t], late.get(t), over.get(t)) for t in order]
    total: dict[str, int] = {}
    for outcomes in per_tier.values():
        for outcome, n in outcomes.items():
            total[outcome] = total.get(outcome, 0) + n
    overall = stats(ALL, total, late_all.get(ALL), over_all.get(ALL))

    attempts = {r["attempt"]: r["count"] for r in df.groupBy("attempt").count().collect()}
    final_attempts = {
        r["attempt"]: r["count"]
        for r in df.where(F.col("outcome").isin("ack", "dead-letter"))
        .groupBy("attempt")
        .count()
        .collect()
    }
    finals = total.get("ack", 0) + total.get("dead-letter", 0)
    dead_letter_rate = total.get("dead-letter", 0) / finals if finals else None

    span = df.agg(F.min("delivered_at_ms"), F.max("delivered_at_ms")).first()
    assert span is not None
    first, last = span[0] or 0, span[1] or 0
    if bucket_ms is None:  # about 60 buckets, in whole seconds
        bucket_ms = max(1000, math.ceil((last - first + 1) / 60 / 1000) * 1000)
    throughput = sorted(
        (r["bucket"] * bucket_ms, r["count"])
        for r in df.groupBy(F.floor(F.col("delivered_at_ms") / bucket_ms).alias("bucket"))
        .count()
        .collect()
    )
    requested = {
        r["requested_delay_ms"]: r["count"]
        for r in df.where(
            (F.col("outcome") != "duplicate") & F.col("requested_delay_ms").isNotNull()
        )
        .groupBy("requested_delay_ms")
        .count()
        .collect()
    }
    if ladder is None and tier_ms:
        ladder = Ladder(sorted(v for v in set(tier_ms.values()) if v > 0) or [1])
    current = (
        ladder_overshoot(requested, [t.ttl_ms for t in ladder]) if ladder and requested else None
    )
    recommended = same = None
    if any(d > 0 for d in requested):
        tiers_wanted = max_tiers or (len(ladder) if ladder else 9)
        recommended = recommend_ladder(requested, tiers_wanted)
        if ladder is not None and tiers_wanted != len(ladder):
            same = recommend_ladder(requested, len(ladder))
    df.unpersist()
    return ReportSummary(
        records=overall.count,
        skipped=skipped,
        tiers=tiers,
        overall=overall,
        attempts=dict(sorted(attempts.items())),
        final_attempts=dict(sorted(final_attempts.items())),
        dead_letter_rate=dead_letter_rate,
        throughput=throughput,
        bucket_ms=bucket_ms,
        requested_delays=requested,
        current=current,
        recommended=recommended,
        recommended_same_tiers=same,
    )


def lateness_histograms(
    records: DataFrame, bins: int = 40
) -> tuple[list[float], dict[str, list[int]]]:
    """Bin edges (ms) and, per tier, counts of lateness in each bin (shared edges)."""
    from pyspark.sql import functions as F

    df = records.withColumn("lateness_ms", F.col("delivered_at_ms") - F.col("due_at_ms")).where(
        F.col("lateness_ms").isNotNull()
    )
    span = df.agg(F.min("lateness_ms"), F.max("lateness_ms")).first()
    if span is None or span[0] is None:
        return [], {}
    low, high = float(span[0]), float(span[1])
    width = max(1.0, (high - low) / bins)
    edges = [low + i * width for i in range(bins + 1)]
    index = F.least(F.floor((F.col("lateness_ms") - F.lit(low)) / width), F.lit(bins - 1))
    counts: dict[str, list[int]] = {}
    for row in (
        df.withColumn("tier", F.coalesce(F.col("tier"), F.lit("(none)")))
        .groupBy("tier", index.alias("bin"))
        .count()
        .collect()
    ):
        counts.setdefault(row["tier"], [0] * bins)[int(row["bin"])] += row["count"]
    return edges, counts


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 10_000:
        return f"{value / 1000:,.1f} s"
    return f"{value:,.1f} ms"


def _ladder_text(fit: LadderFit | None) -> str:
    if fit is None:
        return "-"
    return " ".join(format_ms(t) for t in fit.tiers_ms)


def render_markdown(summary: ReportSummary, plots: dict[str, str]) -> str:
    """The report as Markdown (pure)."""
    lines = [
        "# Delivery report",
        "",
        f"{summary.records:,} delivery records"
        + (
            f" ({summary.skipped:,} lines skipped: malformed or another version)"
            if summary.skipped
            else ""
        )
        + ".",
        "",
        "Lateness is delivered minus the requested due time (published + requested delay);",
        "overshoot is the tier minus the requested delay (what the ladder adds).",
        "",
        "| tier | records | ack | dup | retry | dead-letter | lateness p50 | p90 | p99 | max "
        "| overshoot p50 | p90 | p99 | max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in [*summary.tiers, summary.overall]:
        o, la, ov = t.outcomes, t.lateness_ms, t.overshoot_ms
        name = f"**{t.tier}**" if t.tier == ALL else t.tier
        lines.append(
            f"| {name} | {t.count:,} | {o.get('ack', 0):,} | {o.get('duplicate', 0):,} | "
            f"{o.get('retry', 0):,} | {o.get('dead-letter', 0):,} | "
            + " | ".join(_ms(la[k]) for k in ("p50", "p90", "p99", "max"))
            + " | "
            + " | ".join(_ms(ov[k]) for k in ("p50", "p90", "p99", "max"))
            + " |"
        )
    rate = summary.dead_letter_rate
    lines += [
        "",
        "## Retries and dead letters",
        "",
        f"Dead-letter rate: {'-' if rate is None else f'{rate:.2%}'} "
        "(dead-lettered / (acked + dead-lettered)).",
        "",
        "| attempt | records | final outcomes at this attempt |",
        "|---:|---:|---:|",
    ]
    for attempt, n in summary.attempts.items():
        lines.append(f"| {attempt} | {n:,} | {summary.final_attempts.get(attempt, 0):,} |")
    lines += ["", "## Ladder", ""]
    cur, rec, same = summary.current, summary.recommended, summary.recommended_same_tiers
    lines += [
        "| ladder | tiers | mean relative overshoot | messages served | too long |",
        "|---|---|---:|---:|---:|",
    ]
    for label, fit in (
        ("current", cur),
        ("recommended", rec),
        ("recommended, as many tiers as now", same),
    ):
        if fit is not None:
            lines.append(
                f"| {label} | {_ladder_text(fit)} | {fit.mean_relative_overshoot:.1%} | "
                f"{fit.messages:,} | {fit.too_long:,} |"
            )
    lines += [
        "",
        "The recommendation minimises the mean of (tier - delay) / delay over the observed",
        "requested delays (immediate ones left out): an exact search over the distinct delays.",
        "",
        "## Throughput",
        "",
        f"Deliveries per {format_ms(summary.bucket_ms)}: "
        + (
            f"peak {max(n for _, n in summary.throughput):,}, "
            f"mean {sum(n for _, n in summary.throughput) / len(summary.throughput):,.0f} "
            f"over {len(summary.throughput)} buckets."
            if summary.throughput
            else "none."
        ),
        "",
    ]
    for title, name in plots.items():
        lines += [f"![{title}]({name})", ""]
    return "\n".join(lines)


def _plot(
    summary: ReportSummary, edges: list[float], hist: dict[str, list[int]], out: Path
) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots: dict[str, str] = {}
    if hist:
        tiers = [t.tier for t in summary.tiers if t.tier in hist]
        fig, axes = plt.subplots(len(tiers), 1, figsize=(8, 1.8 * len(tiers) + 1), squeeze=False)
        width = edges[1] - edges[0] if len(edges) > 1 else 1
        for ax, tier in zip(axes[:, 0], tiers, strict=True):
            ax.bar(edges[:-1], hist[tier], width=width, align="edge")
            ax.set_ylabel(tier)
        axes[-1, 0].set_xlabel("lateness (ms): delivered - requested due")
        fig.suptitle("Lateness per tier")
        fig.tight_layout()
        fig.savefig(out / "lateness_by_tier.png", dpi=100)
        plt.close(fig)
        plots["Lateness per tier"] = "lateness_by_tier.png"
    positive = sorted((d, n) for d, n in summary.requested_delays.items() if d > 0)
    if positive:
        fig, ax = plt.subplots(figsize=(8, 4))
        low, high = positive[0][0], positive[-1][0]
        bins = (
            [low * (high / low) ** (i / 50) for i in range(51)]
            if high > low
            else [low * 0.9, low * 1.1]
        )
        ax.hist([d for d, _ in positive], bins=bins, weights=[n for _, n in positive])
        ax.set_xscale("log")
        for fit, style, label in (
            (summary.current, "-", "current ladder"),
            (summary.recommended, "--", "recommended"),
        ):
            if fit is not None:
                for i, rung_ms in enumerate(fit.tiers_ms):
                    ax.axvline(
                        rung_ms,
                        linestyle=style,
                        color="C1" if style == "-" else "C2",
                        label=label if i == 0 else None,
                    )
        ax.set_xlabel("requested delay (ms, log scale)")
        ax.set_ylabel("messages")
        ax.legend()
        ax.set_title("Requested delays against the ladder")
        fig.tight_layout()
        fig.savefig(out / "requested_delays.png", dpi=100)
        plt.close(fig)
        plots["Requested delays against the ladder"] = "requested_delays.png"
    if summary.throughput:
        fig, ax = plt.subplots(figsize=(8, 3))
        start = summary.throughput[0][0]
        ax.plot(
            [(t - start) / 1000 for t, _ in summary.throughput],
            [n / (summary.bucket_ms / 1000) for _, n in summary.throughput],
        )
        ax.set_xlabel("seconds since the first delivery")
        ax.set_ylabel("deliveries / s")
        ax.set_title("Throughput")
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=100)
        plt.close(fig)
        plots["Throughput"] = "throughput.png"
    return plots


def report(
    records: str | DataFrame,
    out: str | Path,
    *,
    spark: SparkSession | None = None,
    ladder: Ladder | None = None,
    max_tiers: int | None = None,
    bucket_ms: int | None = None,
) -> ReportSummary:
    """Compute the report of ``records`` (a path or a DataFrame) and write it to ``out``.

    ``ladder`` is the current ladder (default: the tiers seen in the records);
    ``max_tiers`` the tiers of the recommended ladder (default: as many as now).
    Writes ``report.md``, ``summary.json`` and PNG plots into ``out``.
    """
    from delayq.spark._session import local_session

    if bucket_ms is not None and bucket_ms < 1:
        raise InvalidInput(f"bucket_ms must be at least 1, got {bucket_ms}")
    if max_tiers is not None and max_tiers < 1:
        raise InvalidInput(f"max_tiers must be at least 1, got {max_tiers}")
    if Path(out).exists() and not Path(out).is_dir():
        raise InvalidInput(f"cannot write the report to {out}: it is a file, not a directory")
    skipped = 0
    loaded = isinstance(records, (str, Path))
    if isinstance(records, (str, Path)):
        if "://" not in str(records) and not Path(records).exists():  # local, not hdfs:// etc.
            raise InvalidInput(f"no delivery records at {records}: no such file or directory")
        session = spark or local_session()
        frame, skipped = load_records(session, str(records))
    else:
        frame = records
    try:
        return _write_report(frame, skipped, Path(out), ladder, max_tiers, bucket_ms)
    finally:
        if loaded:
            # Left cached, the next report of the same path in this session would be
            # served these records again (Spark matches the cache by plan), not the files.
            frame.unpersist()


def _write_report(
    frame: DataFrame,
    skipped: int,
    target: Path,
    ladder: Ladder | None,
    max_tiers: int | None,
    bucket_ms: int | None,
) -> ReportSummary:
    summary = compute(
        frame, skipped=skipped, ladder=ladder, max_tiers=max_tiers, bucket_ms=bucket_ms
    )
    edges, hist = lateness_histograms(frame)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"cannot write the report to {target}: {exc}") from exc
    plots = _plot(summary, edges, hist, target)
    for stale in _PLOTS - set(plots.values()):  # an earlier report's, not this one's
        (target / stale).unlink(missing_ok=True)
    (target / "report.md").write_text(render_markdown(summary, plots), encoding="utf-8")
    files = ["report.md", "summary.json", *plots.values()]
    final = replace(summary, files=files)
    (target / "summary.json").write_text(
        json.dumps(final.to_json(), indent=2) + "\n", encoding="utf-8"
    )
    return final
