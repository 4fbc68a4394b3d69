"""The delivery report written out (report.md in Markdown and the PNG plots)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delayq.durations import format_ms
from delayq.spark._summary import ALL, LatenessHistogram, ReportSummary
from delayq.topology.fit import LadderFit

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = []


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
    lines += ["", *_ladder_section(summary)]
    busy = summary.throughput
    lines += [
        "## Throughput",
        "",
        f"Deliveries per {format_ms(summary.bucket_ms)}: "
        + (
            f"peak {max(n for _, n in busy):,}, "
            f"mean {sum(n for _, n in busy) / len(busy):,.0f} over {len(busy)} buckets "
            f"with deliveries; {summary.empty_buckets:,} empty between the first and the "
            "last (gaps in the plot, no line drawn across)."
            if busy
            else "none."
        ),
        "",
    ]
    for title, name in plots.items():
        lines += [f"![{title}]({name})", ""]
    return "\n".join(lines)


_TAIL_HEADER = (
    "| ladder | tiers | mean relative overshoot | p99 tier / delay | max tier / delay "
    "| waiting over 2x | messages served | too long |"
)


def _ladder_section(summary: ReportSummary) -> list[str]:
    cur, rec, same = summary.current, summary.recommended, summary.recommended_same_tiers
    lines = ["## Ladder", "", _TAIL_HEADER, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for label, fit in (
        ("current", cur),
        ("recommended", rec),
        ("recommended, as many tiers as now", same),
    ):
        if fit is not None:
            lines.append(
                f"| {label} | {_ladder_text(fit)} | {fit.mean_relative_overshoot:.1%} | "
                f"{fit.p99_ratio:.2f}x | {fit.max_ratio:.2f}x | {fit.over_2x:.1%} | "
                f"{fit.messages:,} | {fit.too_long:,} |"
            )
    goal = (
        "the mean of (tier - delay) / delay"
        if summary.objective == "mean"
        else "the p99 of tier / delay (then the messages above it, then the mean)"
    )
    lines += [
        "",
        f"Current ladder: {summary.current_from or 'none (no tier in the records)'}.",
        "A message asking for a delay waits in the smallest tier at or above it: tier / delay",
        "is how many times its request it waits (p99: 99% wait at most that; immediate",
        "messages left out, and those longer than the top tier, counted as too long).",
        "",
    ]
    if summary.not_recommended:
        lines += [f"No recommendation: {summary.not_recommended}.", ""]
    elif rec is not None:
        lines += [
            f"The recommendation minimises {goal} over the observed requested delays",
            f"(`--objective {summary.objective}`), exactly, with tiers taken only from the grid "
            + " ".join(format_ms(g) for g in summary.grid_ms)
            + " and its top tier",
            "at or above the current ladder's top and the longest delay, so that no delay the",
            "current ladder takes would be refused.",
            "",
        ]
    return lines


def _save(fig: Figure, path: Path) -> None:
    """Write one plot (tests wrap this to see the figures)."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)


def _duration_tick(value: float) -> str:
    return format_ms(round(value)) if value >= 1 else f"{value:g}ms"


def _duration_formatter(*, minor: bool) -> Any:
    """Log-axis tick labels as durations (``1m40s``, not ``10^5``), on the ticks
    matplotlib's own log formatter would label."""
    from matplotlib.ticker import LogFormatterSciNotation

    class DurationLog(LogFormatterSciNotation):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return _duration_tick(x) if super().__call__(x, pos) else ""

    return DurationLog(labelOnlyBase=not minor)


def _lateness_figure(summary: ReportSummary, hist: LatenessHistogram) -> Figure:
    """One panel per tier, each on a log axis (a 30 s tier and a 3 h one both readable)."""
    import matplotlib.pyplot as plt

    tiers = [t.tier for t in summary.tiers if t.tier in hist.counts or t.tier in hist.on_time]
    fig, axes = plt.subplots(len(tiers), 1, figsize=(8, 1.9 * len(tiers) + 1), squeeze=False)
    for ax, tier in zip(axes[:, 0], tiers, strict=True):
        counts = hist.counts.get(tier)
        if counts:
            edges = hist.edges_ms[tier]
            ax.stairs(counts, edges, fill=True)
            ax.set_xlim(edges[0], edges[-1])
        else:
            ax.set_xlim(1, 10)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_duration_formatter(minor=False))
        ax.xaxis.set_minor_formatter(_duration_formatter(minor=True))
        ax.set_ylabel("records")
        early = hist.on_time.get(tier, 0)
        ax.set_title(
            f"{tier}" + (f"  ({early:,} on time or early, not drawn)" if early else ""),
            fontsize=9,
            loc="left",
        )
    axes[-1, 0].set_xlabel("lateness, log scale: delivered - requested due")
    fig.suptitle("Lateness per tier")
    fig.tight_layout()
    return fig


def _throughput_figure(summary: ReportSummary) -> Figure:
    """Deliveries per second per bucket; an empty bucket is a gap (NaN), not a line."""
    import matplotlib.pyplot as plt

    bucket = summary.bucket_ms
    start = summary.throughput[0][0]
    seen = dict(summary.throughput)
    slots = range(start, summary.throughput[-1][0] + bucket, bucket)
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.plot(
        [(t - start) / 1000 for t in slots],
        [seen[t] / (bucket / 1000) if t in seen else math.nan for t in slots],
        marker=".",
    )
    ax.set_xlabel("seconds since the first delivery")
    ax.set_ylabel("deliveries / s")
    ax.set_title(
        "Throughput"
        + (f" ({summary.empty_buckets:,} empty buckets: gaps)" if summary.empty_buckets else "")
    )
    fig.tight_layout()
    return fig


def _plot(summary: ReportSummary, hist: LatenessHistogram, out: Path) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots: dict[str, str] = {}
    if hist.counts or hist.on_time:
        _save(_lateness_figure(summary, hist), out / "lateness_by_tier.png")
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
        _save(fig, out / "requested_delays.png")
        plots["Requested delays against the ladder"] = "requested_delays.png"
    if summary.throughput:
        _save(_throughput_figure(summary), out / "throughput.png")
        plots["Throughput"] = "throughput.png"
    return plots
