"""delayq.spark.report on a generated record set whose figures are known by construction."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from delayq.spark import report
from delayq.topology.fit import ladder_overshoot
from delayq.topology.ladder import Ladder

T0 = 1_700_000_000_000


def percentile(values: list[int], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), written out."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def record(
    n: int,
    *,
    tier: str,
    tier_ms: int,
    delay: int,
    late: int,
    outcome: str = "ack",
    attempt: int = 1,
) -> dict[str, Any]:
    published = T0 + n * 10
    return {
        "v": 1,
        "message_id": f"m{n}",
        "routing_key": "job.a",
        "queue": "q",
        "attempt": attempt,
        "outcome": outcome,
        "reason": "",
        "requested_delay_ms": delay,
        "tier": tier,
        "tier_ms": tier_ms,
        "published_at_ms": published,
        "due_at_ms": published + delay,
        "delivered_at_ms": published + delay + late,
        "settled_at_ms": published + delay + late,
        "handler_ms": 0.5,
    }


def generated() -> list[dict[str, Any]]:
    records = [
        record(i, tier="1s", tier_ms=1000, delay=1000 - 10 * (i % 10), late=i) for i in range(1000)
    ]
    n = 1000
    for outcome, attempt, count in (
        ("ack", 1, 100),
        ("retry", 1, 30),
        ("ack", 2, 20),
        ("retry", 2, 10),
        ("dead-letter", 3, 10),
        ("duplicate", 1, 5),
    ):
        for _ in range(count):
            records.append(
                record(
                    n, tier="2s", tier_ms=2000, delay=2000, late=5, outcome=outcome, attempt=attempt
                )
            )
            n += 1
    for _ in range(25):
        records.append(record(n, tier="immediate", tier_ms=0, delay=0, late=3))
        n += 1
    return records


def test_the_report_gives_the_known_counts_and_percentiles(spark: Any, tmp_path: Path) -> None:
    records = generated()
    source = tmp_path / "records"
    source.mkdir()
    half = len(records) // 2
    for name, part in (("a.jsonl", records[:half]), ("b.jsonl", records[half:])):
        (source / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    (source / "c.jsonl").write_text(
        'not json\n{"v": 2, "message_id": "future"}\n{"v": 1, "message_id": "no outcome"}\n'
    )
    (source / "ignored.txt").write_text("not a records file\n")

    summary = report(
        str(source), tmp_path / "out", spark=spark, max_tiers=2, grid_ms=(500, 1000, 2000, 5000)
    )

    assert (summary.records, summary.skipped) == (1200, 3)
    tiers = {t.tier: t for t in summary.tiers}
    assert [t.tier for t in summary.tiers] == ["immediate", "1s", "2s"]
    assert tiers["1s"].count == 1000 and tiers["2s"].count == 175
    assert tiers["2s"].outcomes == {"ack": 120, "duplicate": 5, "retry": 40, "dead-letter": 10}
    assert summary.overall.outcomes["ack"] == 1145
    assert summary.dead_letter_rate == pytest.approx(10 / 1155)
    assert summary.attempts == {1: 1160, 2: 30, 3: 10}
    assert summary.final_attempts == {1: 1125, 2: 20, 3: 10}
    assert sum(n for _, n in summary.throughput) == 1200

    late_1s = list(range(1000))
    over_1s = [10 * (i % 10) for i in range(1000)]
    for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        assert tiers["1s"].lateness_ms[key] == pytest.approx(percentile(late_1s, q))
        assert tiers["1s"].overshoot_ms[key] == pytest.approx(percentile(over_1s, q))
    assert tiers["1s"].lateness_ms["p50"] == pytest.approx(499.5)  # by hand: (499 + 500) / 2
    assert tiers["1s"].lateness_ms["max"] == 999 and tiers["1s"].overshoot_ms["max"] == 90
    assert tiers["2s"].lateness_ms == {"p50": 5, "p90": 5, "p99": 5, "max": 5}
    every = late_1s + [5] * 175 + [3] * 25
    assert summary.overall.lateness_ms["p90"] == pytest.approx(percentile(every, 0.9))

    delays = {1000 - 10 * k: 100 for k in range(10)} | {2000: 170, 0: 25}
    assert summary.requested_delays == delays
    assert summary.current is not None and summary.current.tiers_ms == (1000, 2000)
    assert summary.current_from == "the tiers seen in the records"
    assert summary.current.mean_relative_overshoot == pytest.approx(
        ladder_overshoot(delays, [1000, 2000]).mean_relative_overshoot
    )
    # From the grid 500ms 1s 2s 5s, two tiers, the top at least 2s: 1s 2s (every other
    # pair overshoots more), the same ladder as now.
    assert summary.recommended is not None
    assert summary.recommended.tiers_ms == (1000, 2000)
    assert summary.recommended.mean_relative_overshoot <= summary.current.mean_relative_overshoot
    # The tail against a plain-Python recount of the records: tier / delay per delayed,
    # non-duplicate record; p99 the value at rank ceil(0.99 n).
    ratios = sorted(
        r["tier_ms"] / r["requested_delay_ms"]
        for r in records
        if r["outcome"] != "duplicate" and r["requested_delay_ms"] > 0
    )
    assert summary.current.messages == len(ratios) == 1170
    assert summary.current.p99_ratio == pytest.approx(ratios[math.ceil(0.99 * len(ratios)) - 1])
    assert summary.current.max_ratio == pytest.approx(1000 / 910)
    assert summary.current.over_2x == 0.0

    out = tmp_path / "out"
    for name in (
        "report.md",
        "summary.json",
        "lateness_by_tier.png",
        "requested_delays.png",
        "throughput.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert (out / "report.md").read_text().count("![") == 3
    data = json.loads((out / "summary.json").read_text())
    assert data["records"] == 1200 and data["recommended"]["tiers_ms"][-1] == 2000
    assert data["current"]["p99_ratio"] == pytest.approx(summary.current.p99_ratio)
    text = (out / "report.md").read_text()
    assert "| p99 tier / delay | max tier / delay | waiting over 2x |" in text
    assert "Current ladder: the tiers seen in the records." in text
    assert "from the grid 500ms 1s 2s 5s" in text


def test_a_report_of_nothing_readable_fails_and_says_why(spark: Any, tmp_path: Path) -> None:
    from delayq.cli import main
    from delayq.errors import InvalidInput

    source = tmp_path / "records"
    source.mkdir()
    (source / "r.jsonl").write_text(
        'not json\n{"v": 2, "outcome": "ack"}\n{"v": 1}\n{"v": 1, "outcome": "ack"}\n'
    )
    with pytest.raises(InvalidInput, match="all 4 lines were skipped"):
        report(str(source), tmp_path / "out", spark=spark)
    with pytest.raises(InvalidInput, match=r"no delivery records at .*no such file"):
        report(str(tmp_path / "typo"), tmp_path / "out", spark=spark)
    (source / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in generated()[:50]))
    with pytest.raises(InvalidInput, match="bucket_ms must be at least 1"):
        report(str(source), tmp_path / "out", spark=spark, bucket_ms=0)
    with pytest.raises(InvalidInput, match="max_tiers must be at least 1"):
        report(str(source), tmp_path / "out", spark=spark, max_tiers=0)
    assert not (tmp_path / "out").exists()  # nothing written that could pass for a report
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidInput, match="it is a file, not a directory"):
        report(str(source), tmp_path / "file", spark=spark)
    # The same path again, its files changed: before, the first read's cached (all skipped)
    # records were served again in this session. Only immediate deliveries now: no
    # requested-delay plot, and an earlier report's one does not linger.
    out = tmp_path / "again"
    out.mkdir()
    (out / "requested_delays.png").write_bytes(b"an earlier report's plot")
    (source / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in generated()[-25:]))
    summary = report(str(source), out, spark=spark)
    assert summary.records == 25 and "requested_delays.png" not in summary.files
    assert not (out / "requested_delays.png").exists()
    # Records keep arriving: before, the last report's cached records were served again,
    # and the new file's good lines were counted as skipped (25 records, 5 skipped)
    (source / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in generated()[:5]))
    summary = report(str(source), out, spark=spark)
    assert (summary.records, summary.skipped) == (30, 0)
    assert main(["spark", "report", str(tmp_path / "typo"), "--out", str(tmp_path / "o")]) == 2
    # bare numbers in a ladder have no unit: refused, not read as milliseconds
    assert (
        main(["spark", "report", str(source), "--out", str(tmp_path / "o"), "--ladder", "30 60"])
        == 2
    )


def test_tiers_apart_by_hours_each_get_a_log_panel_and_gaps_stay_gaps(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 30 s tier late by milliseconds and a 3 h tier late by minutes, delivered in two
    bursts 100 s apart; a topology ladder whose 24 h top no record went through."""
    from delayq.cli import main
    from delayq.spark import _render
    from delayq.spark.report import lateness_histograms, load_records

    records = [
        record(i, tier="30s", tier_ms=30_000, delay=30_000 - 1000 * (i % 20), late=1 + i % 50)
        for i in range(400)
    ]
    records += [
        record(i, tier="3h", tier_ms=10_800_000, delay=9_000_000, late=60_000 + 1000 * i)
        for i in range(400, 500)
    ]
    # Second burst: 100 s after the first one's last delivery (whole empty buckets between).
    for r in records[200:400]:
        r["delivered_at_ms"] += 100_000
    source = tmp_path / "records"
    source.mkdir()
    (source / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    topo = tmp_path / "topology.yaml"
    topo.write_text("namespace: shop\nladder: [30s, 1m, 5m, 3h, 24h]\n")

    figures: dict[str, Any] = {}
    save = _render._save

    def keep(fig: Any, path: Path) -> None:
        figures[path.name] = fig
        save(fig, path)

    monkeypatch.setattr(_render, "_save", keep)
    out = tmp_path / "out"
    code = main(
        ["spark", "report", str(source), "--out", str(out), "--file", str(topo),
         "--bucket", "1s", "--objective", "p99", "--max-tiers", "3"]
    )  # fmt: skip
    assert code == 0
    data = json.loads((out / "summary.json").read_text())

    # Lateness: one panel per tier, each on a log axis, its counts a plain recount.
    lateness = figures["lateness_by_tier.png"]
    assert [ax.get_title(loc="left") for ax in lateness.axes] == ["30s", "3h"]
    assert all(ax.get_xscale() == "log" for ax in lateness.axes)
    frame, _ = load_records(spark, str(source))
    hist = lateness_histograms(frame)
    frame.unpersist()
    for tier in ("30s", "3h"):  # each tier's bins span its own lateness, log-spaced
        late = [r["delivered_at_ms"] - r["due_at_ms"] for r in records if r["tier"] == tier]
        edges = hist.edges_ms[tier]
        assert (edges[0], edges[-1]) == (min(late), max(late)) and len(edges) == 41
        ratio = edges[1] / edges[0]
        assert all(b / a == pytest.approx(ratio) for a, b in itertools.pairwise(edges))
        recount = [0] * 40
        for value in late:
            i = math.floor(math.log(value / edges[0]) * 40 / math.log(edges[-1] / edges[0]))
            recount[min(max(i, 0), 39)] += 1
        assert hist.counts[tier] == recount
    # The second burst's records are later by 100 s: the 30 s tier's panel spans ms to
    # minutes, the 3 h tier's minutes (7m40s to 9m19s) only, each readable on its own axis.
    assert lateness.axes[0].get_xlim() == pytest.approx((1, 100_050))
    assert lateness.axes[1].get_xlim() == pytest.approx((460_000, 559_000))

    # Throughput: buckets of 1 s; the empty ones between the bursts are NaN (a gap).
    buckets = {r["delivered_at_ms"] // 1000 for r in records}
    empty = max(buckets) - min(buckets) + 1 - len(buckets)
    assert empty > 90 and data["empty_buckets"] == empty
    [line] = figures["throughput.png"].axes[0].get_lines()
    ys = list(line.get_ydata())
    assert sum(1 for y in ys if math.isnan(y)) == empty and len(ys) == empty + len(buckets)
    assert sum(y for y in ys if not math.isnan(y)) == len(records)  # per s, buckets of 1 s

    # The current ladder is the topology's, its 24 h top included; the recommendation
    # is round, keeps 24 h, and both ladders show their tail.
    assert data["current"]["tiers_ms"] == [30_000, 60_000, 300_000, 10_800_000, 86_400_000]
    assert data["current_from"] == f"the topology file {topo}"
    recommended = data["recommended"]["tiers_ms"]
    assert recommended[-1] == 86_400_000 and len(recommended) <= 3
    from delayq.topology.fit import DEFAULT_GRID_MS

    assert set(recommended) <= set(DEFAULT_GRID_MS) and data["objective"] == "p99"
    text = (out / "report.md").read_text()
    assert f"Current ladder: the topology file {topo}." in text
    assert "`--objective p99`" in text
    for fit in ("current", "recommended"):
        ratios = sorted(
            min(t for t in data[fit]["tiers_ms"] if t >= r["requested_delay_ms"])
            / r["requested_delay_ms"]
            for r in records
        )
        assert data[fit]["p99_ratio"] == pytest.approx(ratios[math.ceil(0.99 * 500) - 1])
        assert data[fit]["max_ratio"] == pytest.approx(ratios[-1])
        assert data[fit]["over_2x"] == pytest.approx(sum(x > 2 for x in ratios) / 500)


def test_the_current_ladder_without_a_topology_and_grid_misuse(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from delayq.cli import main
    from delayq.errors import InvalidInput

    source = tmp_path / "records"
    source.mkdir()
    (source / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in generated()))
    monkeypatch.chdir(tmp_path)  # no topology/delayq.yaml here: the records' tiers
    assert main(["spark", "report", str(source), "--out", "o", "--grid", "1s 2s 5s"]) == 0
    out = capsys.readouterr().out
    assert "the current ladder is from the tiers seen in the records" in out
    assert "recommended ladder: 1s 2s (" in out and "p99 1.10x" in out
    # A named topology file that is not there is an error, not a silent fallback.
    assert main(["spark", "report", str(source), "--out", "o", "--file", "nope.yaml"]) == 2
    # The grid must reach the current ladder's top, and hold durations.
    with pytest.raises(InvalidInput, match="longest value 5s is below the current ladder's top"):
        report(str(source), tmp_path / "o", spark=spark, ladder=Ladder.parse(["1s", "1m"]),
               grid_ms=(1000, 5000))  # fmt: skip
    with pytest.raises(InvalidInput, match="objective must be one of mean, p99"):
        report(str(source), tmp_path / "o", spark=spark, objective="median")
    assert main(["spark", "report", str(source), "--out", "o", "--grid", "1 2"]) == 2
    assert main(["spark", "report", str(source), "--out", "o", "--grid", " "]) == 2
    assert main(["spark", "report", str(source), "--out", "o", "--objective", "max"]) == 2
    # A delay beyond the grid: the report stands, without a recommendation, and says why.
    code = main(["spark", "report", str(source), "--out", "o", "--grid", "1s", "--ladder", "1s"])
    captured = capsys.readouterr()
    assert code == 0 and "no ladder recommended: the grid's longest value 1s" in captured.err
    assert (
        "No recommendation: the grid's longest value 1s" in (tmp_path / "o/report.md").read_text()
    )
