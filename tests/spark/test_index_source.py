"""The schedule index as a Spark DataFrame (issue 51): ``delayq.spark.index`` reads every
entry a query matches, page by page, into Parquet; the forecast counts the waiting ones
due in each minute ahead (empty minutes included, overdue and finished ones left out);
the histogram counts them by tier and due window; ``delayq spark forecast | export``
print and write them, refusing bad input before Spark starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq import Topology
from delayq.cli import main
from delayq.errors import InvalidInput
from delayq.schedule.entry import Entry, State
from delayq.schedule.memory import MemorySchedule
from delayq.schedule.query import Query
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.spark.index import (
    due_histogram,
    forecast,
    index_frame,
    ladder_advice,
    read_index,
    requested_delays,
)

NOW = 1_800_000_000_000 - 1_800_000_000_000 % 60_000 + 15_000  # 15 s into a minute
MINUTE = 60_000


def _entries(store: Any, specs: list[tuple[str, int, str, State]], **extra: Any) -> None:
    """``(id, due_at_ms, tier, state)`` entries, each through its moves."""
    made = [
        Entry(i, "shop", "order.paid", due_at_ms=due, tier=tier, published_at_ms=NOW - 1000,
              size=10, destinations=("orders",), labels={"n": i}, **extra)
        for i, due, tier, _ in specs
    ]  # fmt: skip
    store.add(made)
    for i, _, _, state in specs:
        if state is not State.PENDING:
            store.move([i], State.SCHEDULED, now_ms=NOW - 500)
        if state not in (State.PENDING, State.SCHEDULED):
            store.move([i], state, now_ms=NOW - 400)


def test_every_entry_a_query_matches_is_read_page_by_page(spark: Any, tmp_path: Path) -> None:
    store = MemorySchedule()
    specs = [(f"m{n:04}", NOW + n * 1000, "1h", State.SCHEDULED) for n in range(2_500)]
    specs += [("done", NOW, "1h", State.HANDLED), ("pending", NOW, "1h", State.PENDING)]
    _entries(store, specs, body=b'{"a": 1}', content_type="application/json", headers={"h": 1})
    pages: list[int] = []
    df = read_index(spark, store, str(tmp_path / "a"), page=1_000, progress=pages.append)
    assert pages == [1_000, 2_000, 2_500]
    rows = {r["id"]: r for r in df.collect()}
    assert sorted(rows) == [s[0] for s in specs[:2_500]]  # waiting ones only, by default
    first = rows["m0000"]
    assert (first["due_at_ms"], first["tier"], first["state"]) == (NOW, "1h", "scheduled")
    assert (first["destinations"], first["labels"]) == (["orders"], {"n": "m0000"})
    assert first["body"] is None and first["headers"] is None  # not asked for

    everything = Query(states=set(State))
    df = read_index(spark, store, str(tmp_path / "b"), query=everything, bodies=True)
    rows = {r["id"]: r for r in df.collect()}
    assert len(rows) == 2_502 and rows["done"]["state"] == "handled"
    assert bytes(rows["m0001"]["body"]) == b'{"a": 1}'
    assert json.loads(rows["m0001"]["headers"]) == {"h": 1}

    empty = read_index(spark, MemorySchedule(), str(tmp_path / "c"))
    assert empty.count() == 0 and "due_at_ms" in empty.columns


def test_bad_arguments_are_refused_before_anything_is_written(spark: Any, tmp_path: Path) -> None:
    store = MemorySchedule()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(InvalidInput, match="not an empty folder"):
        read_index(spark, store, str(tmp_path / "full"))
    for page in (0, -1, True, 1.5):
        with pytest.raises(InvalidInput, match="page"):
            read_index(spark, store, str(tmp_path / "p"), page=page)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="URL or store"):
        read_index(spark, object(), str(tmp_path / "s"))  # type: ignore[arg-type]
    assert not (tmp_path / "p").exists() and not (tmp_path / "s").exists()
    df = read_index(spark, store, str(tmp_path / "e"))
    for horizon, bucket in (("1m", "1h"), ("24h", "0s"), ("1000d", "1ms"), ("24h", 60)):
        with pytest.raises(InvalidInput):
            forecast(df, now_ms=NOW, horizon=horizon, bucket=bucket)


def test_the_forecast_counts_each_minute_ahead_and_nothing_else(spark: Any) -> None:
    store = MemorySchedule()
    specs = [
        ("a", NOW + 10_000, "1m", State.SCHEDULED),  # the first (cut) minute
        ("b", NOW + 50_000, "1m", State.SCHEDULED),  # the next minute (NOW is :15)
        ("c", NOW + 50_000, "30m", State.RESCHEDULED),
        ("d", NOW + 3 * MINUTE, "1h", State.SCHEDULED),
        ("late", NOW - 5_000, "1m", State.SCHEDULED),  # overdue: not in the forecast
        ("far", NOW + 24 * 60 * MINUTE, "24h", State.SCHEDULED),  # past the horizon
        ("gone", NOW + 10_000, "1m", State.CANCELLED),
        ("pend", NOW + 10_000, "1m", State.PENDING),
    ]
    _entries(store, specs)
    with index_frame(spark, store, query=Query(states=set(State))) as df:
        rows = forecast(df, now_ms=NOW).collect()
        by_tier = {
            (r["tier"], r["window"]): r["due"] for r in due_histogram(df, now_ms=NOW).collect()
        }
        staged = Path(df.inputFiles()[0]).parent
    assert len(rows) == 1_441  # 24 hours of whole minutes, the first and last cut at NOW
    assert rows[0]["start_ms"] == NOW - 15_000 and rows[1]["start_ms"] == NOW + 45_000
    assert [r["due"] for r in rows[:5]] == [1, 2, 0, 1, 0]
    assert sum(r["due"] for r in rows) == 4
    assert rows[0]["start"].timestamp() * 1000 == NOW - 15_000
    assert by_tier == {
        ("1m", "overdue"): 1, ("1m", "1m"): 2, ("30m", "1m"): 1,
        ("1h", "5m"): 1, ("24h", "later"): 1,
    }  # fmt: skip
    assert not staged.exists()  # the temporary folder went with the block


def _topology_file(tmp_path: Path) -> Path:
    topology = Topology(
        namespace="shop",
        ladder=["1m", "1h"],
        destinations=[{"queue": "orders", "bindings": ["order.*"]}],
    )
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    return path


def test_the_commands_print_write_and_refuse(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from delayq.message.envelope import epoch_ms

    now = epoch_ms()
    db = tmp_path / "schedule.db"
    store = SQLiteSchedule(db)
    specs = [(f"m{n}", now + 90_000 + n * MINUTE, "1h", State.SCHEDULED) for n in range(30)]
    _entries(store, [*specs, ("x", now + 90_000, "1h", State.HANDLED)], delay_ms=45 * MINUTE)
    store.close()
    common = ["--index", str(db), "--file", str(_topology_file(tmp_path)), "--no-ui"]

    out = tmp_path / "f.csv"
    assert main(["spark", "forecast", *common, "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["entries"] == 30 and sum(b["due"] for b in printed["buckets"]) == 30
    lines = out.read_text().splitlines()
    assert lines[0] == "start,start_ms,due" and len(lines) == 1 + 1_441
    assert main(["spark", "forecast", *common, "--label", "n=m3", "--horizon", "2h"]) == 0
    text = capsys.readouterr().out
    assert "1 entries read; 1 due in the next 2h; 0 overdue" in text
    assert "the ladder, for the delays 1 waiting messages asked for:" in text
    assert "current: 1m 1h (mean relative overshoot" in text

    assert main(["spark", "export", str(tmp_path / "out"), *common, "--state", "all"]) == 0
    assert "exported 31 entries" in capsys.readouterr().out
    assert spark.read.parquet(str(tmp_path / "out")).count() == 31
    assert main(["spark", "export", str(tmp_path / "out"), *common]) == 2  # exists
    assert "exists" in capsys.readouterr().err
    assert main(["spark", "export", str(db / "under"), *common]) == 2  # under a file
    assert "is a file, not a folder" in capsys.readouterr().err
    assert main(["spark", "export", " ", *common]) == 2
    assert "OUT is empty" in capsys.readouterr().err
    for out_path, said in ((tmp_path / "no" / "f.csv", "no folder"), (tmp_path, "a folder")):
        assert main(["spark", "forecast", *common, "--out", str(out_path)]) == 2
        assert said in capsys.readouterr().err

    missing = ["--index", str(tmp_path / "none.db"), *common[2:]]
    assert main(["spark", "forecast", *missing]) == 1
    assert "no schedule index" in capsys.readouterr().err
    assert main(["spark", "forecast", *common, "--bucket", "2d"]) == 2
    assert main(["spark", "forecast", *common, "--horizon", "24"]) == 2
    assert not (tmp_path / "none.db").exists()


def test_the_requested_delays_feed_the_ladder_advice(spark: Any) -> None:
    from delayq.topology.ladder import Ladder

    store = MemorySchedule()
    _entries(store, [(f"d{n}", NOW + n, "30m", State.SCHEDULED) for n in range(100)],
             delay_ms=15 * MINUTE)  # fmt: skip
    _entries(store, [("done", NOW, "30m", State.HANDLED)], delay_ms=7 * MINUTE)  # not waiting
    _entries(store, [("old", NOW, "30m", State.SCHEDULED)])  # an older delayq's: none
    with index_frame(spark, store, query=Query(states=set(State))) as df:
        delays = requested_delays(df)
    assert delays == {15 * MINUTE: 100}
    ladder = Ladder.parse(["30s", "1m", "5m", "30m", "1h"])
    current, recommended, why = ladder_advice(delays, ladder)
    assert current is not None and current.mean_relative_overshoot == pytest.approx(1.0)
    assert recommended is not None and why == ""
    assert 15 * MINUTE in recommended.tiers_ms and recommended.tiers_ms[-1] == 60 * MINUTE
    assert recommended.mean_relative_overshoot == 0.0 and len(recommended.tiers_ms) <= 5
    assert ladder_advice({30 * MINUTE: 5}, Ladder.parse(["30m"]))[1:] == (
        None,
        "the ladder is already the best of its size on the grid",
    )
    assert ladder_advice({}, ladder) == (None, None, "no waiting entry asked for a delay")
