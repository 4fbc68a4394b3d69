"""The delivery report written out (report.md in Markdown and the PNG plots)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from delayq.durations import format_ms
from delayq.topology.fit import LadderFit

if TYPE_CHECKING:
    pass

from delayq.spark._summary import ALL, ReportSummary

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
