"""delayq.spark.report on a generated record set whose figures are known by construction."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from delayq.spark import report
from delayq.topology.fit import brute_force_ladder, ladder_overshoot

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

    summary = report(str(source), tmp_path / "out", spark=spark, max_tiers=2)

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
    assert summary.current.mean_relative_overshoot == pytest.approx(
        ladder_overshoot(delays, [1000, 2000]).mean_relative_overshoot
    )
    best = brute_force_ladder(delays, 2)
    assert summary.recommended is not None
    assert summary.recommended.mean_relative_overshoot == pytest.approx(
        best.mean_relative_overshoot
    )
    assert summary.recommended.mean_relative_overshoot <= summary.current.mean_relative_overshoot

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
    assert main(["spark", "report", str(source), "--out", str(tmp_path / "o"),
                 "--ladder", "30 60"]) == 2
