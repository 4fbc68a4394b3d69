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

It writes ``summary.json``, ``report.md`` and PNG plots (lateness per tier, one
panel each on a log axis; requested-delay distribution against the ladder;
throughput, empty buckets left as gaps), and recommends a ladder of round tiers
(:func:`delayq.topology.fit.recommend_on_grid`: tiers from a grid, the top at or
above the current ladder's) shown beside the current one, both with their tail.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delayq.durations import format_ms
from delayq.errors import InvalidInput
from delayq.observe.records import RECORD_VERSION
from delayq.spark._render import _plot, render_markdown
from delayq.spark._summary import (
    ALL,
    OUTCOMES,
    PERCENTILES,
    LatenessHistogram,
    ReportSummary,
    TierStats,
)
from delayq.topology.fit import (
    DEFAULT_GRID_MS,
    OBJECTIVES,
    ladder_overshoot,
    never_worse,
    recommend_on_grid,
)
from delayq.topology.ladder import Ladder

__all__ = ["PERCENTILES", "RECORDS_SCHEMA", "ReportSummary", "TierStats", "report"]

SEEN = "the tiers seen in the records"
"""Where the current ladder comes from when none is given (``ReportSummary.current_from``)."""

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


RECORDS_SCHEMA = (
    "v int, message_id string, routing_key string, queue string, attempt int, "
    "outcome string, reason string, requested_delay_ms long, tier string, tier_ms long, "
    "published_at_ms long, due_at_ms long, delivered_at_ms long, settled_at_ms long, "
    "handler_ms double, _corrupt_record string"
)


_PLOTS = frozenset({"lateness_by_tier.png", "requested_delays.png", "throughput.png"})


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
    ladder_from: str = "the ladder given",
    max_tiers: int | None = None,
    bucket_ms: int | None = None,
    grid_ms: tuple[int, ...] = DEFAULT_GRID_MS,
    objective: str = "mean",
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
    spanned = (throughput[-1][0] - throughput[0][0]) // bucket_ms + 1 if throughput else 0
    requested = {
        r["requested_delay_ms"]: r["count"]
        for r in df.where(
            (F.col("outcome") != "duplicate") & F.col("requested_delay_ms").isNotNull()
        )
        .groupBy("requested_delay_ms")
        .count()
        .collect()
    }
    if ladder is None:
        ladder_from = SEEN
        if tier_ms:
            ladder = Ladder(sorted(v for v in set(tier_ms.values()) if v > 0) or [1])
    current = (
        ladder_overshoot(requested, [t.ttl_ms for t in ladder]) if ladder and requested else None
    )
    recommended = same = None
    refused = ""
    if any(d > 0 for d in requested):
        tiers_wanted = max_tiers or (len(ladder) if ladder else 9)
        top = ladder.max_ms if ladder else 0
        try:
            recommended = recommend_on_grid(
                requested, tiers_wanted, grid_ms=grid_ms, min_top_ms=top, objective=objective
            )
            if ladder is not None and tiers_wanted != len(ladder):
                same = recommend_on_grid(
                    requested, len(ladder), grid_ms=grid_ms, min_top_ms=top, objective=objective
                )
        except InvalidInput as exc:  # a delay beyond the grid: the rest of the report stands
            refused = str(exc)
        recommended, same, refused = never_worse(
            current, recommended, same, refused, requested, grid_ms, objective
        )
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
        current_from=ladder_from if ladder is not None else "",
        objective=objective,
        grid_ms=grid_ms,
        empty_buckets=spanned - len(throughput),
        not_recommended=refused,
    )


def lateness_histograms(records: DataFrame, bins: int = 40) -> LatenessHistogram:
    """Per tier, counts of positive lateness in ``bins`` log-spaced bins spanning that
    tier's own range (a 30 s tier's milliseconds and a 3 h tier's minutes both resolved),
    and of lateness at or below 0 (on time, or early by the clocks)."""
    from pyspark.sql import functions as F

    df = (
        records.withColumn("lateness_ms", F.col("delivered_at_ms") - F.col("due_at_ms"))
        .where(F.col("lateness_ms").isNotNull())
        .withColumn("tier", F.coalesce(F.col("tier"), F.lit("(none)")))
    )
    on_time = {
        r["tier"]: r["count"]
        for r in df.where(F.col("lateness_ms") <= 0).groupBy("tier").count().collect()
    }
    late = df.where(F.col("lateness_ms") > 0)
    spans = late.groupBy("tier").agg(F.min("lateness_ms"), F.max("lateness_ms")).collect()
    if not spans:
        return LatenessHistogram({}, {}, on_time)
    edges: dict[str, list[float]] = {}
    low: list[Any] = []
    scale: list[Any] = []
    for tier, first, last in spans:
        lo, hi = float(first), float(last)
        if hi == lo:  # one value: one bin around it
            lo, hi = lo / 1.1, hi * 1.1
        edges[tier] = [lo * (hi / lo) ** (i / bins) for i in range(bins + 1)]
        low += [F.lit(tier), F.lit(lo)]
        scale += [F.lit(tier), F.lit(bins / math.log(hi / lo))]
    tier = F.col("tier")
    position = F.log(F.col("lateness_ms") / F.create_map(*low)[tier]) * F.create_map(*scale)[tier]
    index = F.least(F.greatest(F.floor(position), F.lit(0)), F.lit(bins - 1))
    counts: dict[str, list[int]] = {}
    for row in late.groupBy("tier", index.alias("bin")).count().collect():
        counts.setdefault(row["tier"], [0] * bins)[int(row["bin"])] += row["count"]
    return LatenessHistogram(edges, counts, on_time)


def report(
    records: str | DataFrame,
    out: str | Path,
    *,
    spark: SparkSession | None = None,
    ladder: Ladder | None = None,
    ladder_from: str = "the ladder given",
    max_tiers: int | None = None,
    bucket_ms: int | None = None,
    grid_ms: tuple[int, ...] = DEFAULT_GRID_MS,
    objective: str = "mean",
) -> ReportSummary:
    """Compute the report of ``records`` (a path or a DataFrame) and write it to ``out``.

    ``ladder`` is the current ladder, the configured one (pass the topology's,
    ``topology.ladder``; default: the tiers seen in the records, which misses tiers
    no record went through), and ``ladder_from`` says where it came from in the
    report. The recommendation takes its tiers from ``grid_ms`` (round values), keeps
    its top at or above the current ladder's top, has ``max_tiers`` tiers at most
    (default: as many as now) and minimises ``objective``: ``"mean"`` relative
    overshoot or its ``"p99"``. Writes ``report.md``, ``summary.json`` and PNG plots
    into ``out``.
    """
    from delayq.spark._session import local_session

    if bucket_ms is not None and bucket_ms < 1:
        raise InvalidInput(f"bucket_ms must be at least 1, got {bucket_ms}")
    if max_tiers is not None and max_tiers < 1:
        raise InvalidInput(f"max_tiers must be at least 1, got {max_tiers}")
    if objective not in OBJECTIVES:
        raise InvalidInput(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    grid_ms = tuple(sorted(set(grid_ms)))
    if not grid_ms or grid_ms[0] <= 0:
        raise InvalidInput("the grid needs at least one value, each longer than 0 ms")
    if ladder is not None and ladder.max_ms > grid_ms[-1]:
        raise InvalidInput(
            f"the grid's longest value {format_ms(grid_ms[-1])} is below the current "
            f"ladder's top tier {format_ms(ladder.max_ms)}: a recommendation from it would "
            "refuse delays the ladder takes; add a longer value to the grid"
        )
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
        options = {
            "ladder": ladder,
            "ladder_from": ladder_from,
            "max_tiers": max_tiers,
            "bucket_ms": bucket_ms,
            "grid_ms": grid_ms,
            "objective": objective,
        }
        return _write_report(frame, skipped, Path(out), options)
    finally:
        if loaded:
            # Left cached, the next report of the same path in this session would be
            # served these records again (Spark matches the cache by plan), not the files.
            frame.unpersist()


def _write_report(
    frame: DataFrame, skipped: int, target: Path, options: dict[str, Any]
) -> ReportSummary:
    summary = compute(frame, skipped=skipped, **options)
    hist = lateness_histograms(frame)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput(f"cannot write the report to {target}: {exc}") from exc
    plots = _plot(summary, hist, target)
    for stale in _PLOTS - set(plots.values()):  # an earlier report's, not this one's
        (target / stale).unlink(missing_ok=True)
    (target / "report.md").write_text(render_markdown(summary, plots), encoding="utf-8")
    files = ["report.md", "summary.json", *plots.values()]
    final = replace(summary, files=files)
    (target / "summary.json").write_text(
        json.dumps(final.to_json(), indent=2) + "\n", encoding="utf-8"
    )
    return final
