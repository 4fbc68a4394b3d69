"""Issue 51's "done when", at its size, on every server CI runs: 100,000 messages across
the ladder, some delivered, some cancelled, some promoted, a label purged; the operator's
commands (``delayq scheduled count`` and ``list --due-before 10m --json``) answer
exactly, and no purged message reaches the handler."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from delayq import Message
from delayq.cli import EXIT_OK, main
from delayq.schedule.api import Schedule
from delayq.schedule.query import Query
from delayq.schedule.report import ScheduleReporter
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.stores.memory import InMemoryStore
from delayq.sync import apply_topology
from delayq.topology.model import Topology

from ..amqp import depth
from .test_consumer import until
from .test_schedule_ops import tenant_publisher

# (tenant, delay, count): delivered soon; purged before due; due within 10 minutes
# (some cancelled, some promoted); due in an hour and a day.
PLAN = [("a", "1s", 20_000), ("c", "5m", 20_000), ("d", "1h", 20_000), ("e", "24h", 20_000),
        ("b", "15s", 20_000)]  # fmt: skip
CANCELLED = [f"c{n}" for n in range(2_000)]
PROMOTED = [f"c{n}" for n in range(2_000, 3_000)]


@pytest.mark.parametrize("driver_kind", ["async"])
def test_a_hundred_thousand_across_the_ladder_get_exact_answers_and_a_purge_delivers_none(
    make_topology: Callable[..., Topology],
    rabbitmq_url: str,
    start_consumer: Callable[..., Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topo = make_topology(["1s", "15s", "5m", "1h", "24h"])
    apply_topology(topo, rabbitmq_url)
    topology_file = tmp_path / "t.yaml"
    topology_file.write_text(json.dumps(json.loads(topo.model_dump_json(exclude_defaults=True))))
    index_path = tmp_path / "index.db"
    index, store = SQLiteSchedule(index_path), InMemoryStore()
    handled: set[str] = set()
    twice: list[str] = []
    lock = threading.Lock()

    def handler(message_id: str) -> None:
        with lock:
            (twice.append if message_id in handled else handled.add)(message_id)

    reporter = ScheduleReporter(index, interval="200ms")
    start_consumer(topo, f"{topo.namespace}.work", handler, store=store, observers=[reporter])

    def cli(*args: str) -> Any:
        command = ["scheduled", *args, "-f", str(topology_file), "--index", str(index_path)]
        assert main([*command, "--json"]) == EXIT_OK
        return json.loads(capsys.readouterr().out)

    with tenant_publisher(rabbitmq_url, topo, index, store) as publisher:
        schedule = Schedule(index, publisher)
        for name, delay, count in PLAN:
            for start in range(0, count, 10_000):
                publisher.publish_many(
                    [
                        Message(
                            f"{name}{n}",
                            "job.x",
                            delay,
                            message_id=f"{name}{n}",
                            headers={"tenant": name},
                        )
                        for n in range(start, start + 10_000)
                    ]
                )
            if name == "b":  # purged as soon as sent: 15 s before the first comes due
                assert schedule.purge(Query(labels={"tenant": "b"})).stopped == count
        publisher.cancel_many(message_ids=CANCELLED)
        schedule.promote(PROMOTED)

        def settled() -> bool:
            with lock:
                return len(handled) == 21_000

        assert until(settled, 120), len(handled)
        # The purged ones came due meanwhile: acked as cancelled, never handled.
        tier_b = topo.tier_name(topo.ladder.tiers[1])
        assert until(lambda: depth(rabbitmq_url, tier_b) == 0, 60)
        assert until(lambda: depth(rabbitmq_url, f"{topo.namespace}.work") == 0, 60)
        assert until(lambda: schedule.count(Query(labels={"tenant": "a"})) == 0, 30)
    reporter.close()
    with lock:
        assert handled == {f"a{n}" for n in range(20_000)} | set(PROMOTED)
        assert twice == []
    assert cli("count") == {"count": 57_000}
    assert cli("count", "--state", "cancelled") == {"count": 22_000}
    assert cli("count", "--state", "handled") == {"count": 21_000}
    assert cli("count", "--label", "tenant=b", "--state", "all") == {"count": 20_000}
    soon = cli("list", "--due-before", "10m", "--limit", "100000")
    ids = [e["id"] for e in soon["entries"]]
    assert sorted(ids) == sorted(f"c{n}" for n in range(3_000, 20_000))
    dues = [e["due_at_ms"] for e in soon["entries"]]
    assert dues == sorted(dues) and soon["next"] is None
    index.close()
