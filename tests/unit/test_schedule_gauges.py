"""The schedule index's Prometheus gauges (issue 51): waiting messages by tier, due
within each window, overdue, and the index's health; read at most once per max_age; an
index that does not answer shows as down with no guessed figures; and
``delayq scheduled metrics`` serving them until SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from delayq.errors import StoreError
from delayq.schedule.entry import Entry, State
from delayq.schedule.gauges import SCHEDULE_METRICS, ScheduleGauges
from delayq.schedule.memory import MemorySchedule
from delayq.schedule.query import Query
from delayq.schedule.sqlite import SQLiteSchedule

NOW = 10_000_000


def scheduled(store: Any, n: int, due_in_ms: int, tier: str, namespace: str = "shop") -> None:
    entry = Entry(
        f"{namespace}-{n}", namespace, "order.remind", due_at_ms=NOW + due_in_ms, tier=tier,
        published_at_ms=0, size=1,
    )  # fmt: skip
    store.add([entry])
    store.move([entry.id], State.SCHEDULED, now_ms=0)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[str, ...]], float]:
    return {
        (s.name, tuple(s.labels.values())): s.value
        for family in registry.collect()
        for s in family.samples
    }


class Counting(MemorySchedule):
    reads = 0
    down = False

    def count(self, query: Query) -> int:
        self.reads += 1
        if self.down:
            raise StoreError("the index went away")
        return super().count(query)


def test_the_gauges_say_what_waits_by_tier_and_window_and_what_is_overdue() -> None:
    store = Counting()
    scheduled(store, 1, 30_000, "1m")
    scheduled(store, 2, 50 * 60_000, "1h")
    scheduled(store, 3, 2 * 3_600_000, "3h")
    scheduled(store, 4, -10 * 60_000, "1m")  # due ten minutes ago: overdue
    scheduled(store, 5, 30_000, "1m", namespace="other")  # another namespace
    store.move(["shop-2"], State.HANDLED, now_ms=1)  # no longer waiting
    scheduled(store, 6, 40 * 60_000, "1h")
    registry = CollectorRegistry()
    ScheduleGauges(store, "shop", registry=registry, clock_ms=lambda: NOW)
    got = samples(registry)
    assert got[("delayq_scheduled_messages", ("shop", "1m"))] == 2
    assert got[("delayq_scheduled_messages", ("shop", "1h"))] == 1
    assert got[("delayq_scheduled_messages", ("shop", "3h"))] == 1
    assert [
        got[("delayq_scheduled_due_messages", ("shop", w))] for w in ("1m", "5m", "1h", "24h")
    ] == [2, 2, 3, 4]
    assert got[("delayq_scheduled_overdue_messages", ("shop",))] == 1
    assert got[("delayq_schedule_index_up", ("shop",))] == 1
    assert {name for name, _ in got} == set(SCHEDULE_METRICS)


def test_reads_are_shared_within_max_age_and_a_dead_index_shows_down_only() -> None:
    store = Counting()
    scheduled(store, 1, 30_000, "1m")
    registry = CollectorRegistry()
    ScheduleGauges(store, "shop", registry=registry, clock_ms=lambda: NOW, max_age="1h")
    assert store.reads == 0  # registering reads nothing
    samples(registry)
    reads = store.reads
    samples(registry)
    assert store.reads == reads  # the second scrape used the first read
    down = CollectorRegistry()
    store.down = True
    ScheduleGauges(store, "shop", registry=down, clock_ms=lambda: NOW)
    assert samples(down) == {("delayq_schedule_index_up", ("shop",)): 0}


def test_bad_settings_are_refused() -> None:
    from delayq.errors import InvalidDelay, InvalidInput

    with pytest.raises(InvalidInput):
        ScheduleGauges(MemorySchedule(), "")
    with pytest.raises(InvalidInput):
        ScheduleGauges(MemorySchedule(), "shop", windows="1h")  # type: ignore[arg-type]
    with pytest.raises(InvalidDelay):
        ScheduleGauges(MemorySchedule(), "shop", windows=["60"])


def test_the_metrics_command_serves_the_gauges_until_sigterm(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(
        "namespace: shop\nladder: [1m, 1h]\n"
        "destinations:\n  - queue: orders\n    bindings: [order.*]\n"
    )
    index = SQLiteSchedule(tmp_path / "index.db")
    scheduled(index, 1, 10**12, "1h")  # far in the future
    index.close()
    command = [sys.executable, "-m", "delayq", "scheduled", "metrics", "--port", "0",
               "-f", str(tmp_path / "t.yaml"), "--index", str(tmp_path / "index.db")]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:"), line
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
        assert 'delayq_scheduled_messages{namespace="shop",tier="1h"} 1.0' in text, text
        assert 'delayq_schedule_index_up{namespace="shop"} 1.0' in text
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    bad = subprocess.run([*command[:5], "99999", *command[6:]], capture_output=True, text=True)
    assert bad.returncode == 2 and "--port" in bad.stderr
