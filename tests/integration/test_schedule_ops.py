"""The schedule index's operator story (issue 51) on a real broker: messages across the
ladder with some cancelled, some promoted, some purged by label and some delivered; the
index's counts and due windows are exact at each step, and no purged or cancelled
message reaches the handler."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from delayq import Message
from delayq.cli import EXIT_OK, main
from delayq.schedule.api import Schedule
from delayq.schedule.entry import State
from delayq.schedule.query import Query
from delayq.schedule.record import ScheduleIndex
from delayq.schedule.report import ScheduleReporter
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.stores.memory import InMemoryStore
from delayq.sync import Publisher, apply_topology
from delayq.topology.model import Topology

from ..amqp import depth
from .test_consumer import until


def tenant_publisher(url: str, topo: Topology, index: Any, store: Any) -> Publisher:
    """A publisher recording in ``index`` (bodies kept), each entry labelled with its
    message's ``tenant`` header."""
    tenant = lambda m: {"tenant": m.headers["tenant"]}  # noqa: E731
    index = ScheduleIndex(index, labels=tenant, keep_bodies=1024)
    return Publisher(url, topo, store=store, schedule=index)


def test_count_list_promote_cancel_purge_on_a_real_broker(
    make_topology: Callable[..., Topology],
    rabbitmq_url: str,
    start_consumer: Callable[..., Any],
    tmp_path: Path,
) -> None:
    topo = make_topology(["1s", "2s", "1h"])
    apply_topology(topo, rabbitmq_url)
    index, store = SQLiteSchedule(tmp_path / "index.db"), InMemoryStore()
    handled: list[int] = []
    lock = threading.Lock()

    def handler(value: int) -> None:
        with lock:
            handled.append(value)

    reporter = ScheduleReporter(index, interval="100ms")
    start_consumer(topo, f"{topo.namespace}.work", handler, store=store, observers=[reporter])
    with tenant_publisher(rabbitmq_url, topo, index, store) as publisher:
        schedule = Schedule(index, publisher)
        # 0-99 soon (1s, x); 100-149 purged before due (2s, z); 150-299 in an hour (y)
        plan = [(n, "1s", "x") for n in range(100)]
        plan += [(n, "2s", "z") for n in range(100, 150)]
        plan += [(n, "30m", "y") for n in range(150, 300)]
        publisher.publish_many(
            [
                Message(n, "job.remind", d, message_id=f"m{n}", headers={"tenant": t})
                for n, d, t in plan
            ]
        )
        report = schedule.purge(Query(labels={"tenant": "z"}))
        assert report.stopped == 50
        assert schedule.count() == 250
        publisher.cancel_many(message_ids=[f"m{n}" for n in range(150, 160)])
        schedule.promote([f"m{n}" for n in range(160, 165)])
        assert schedule.count(Query(labels={"tenant": "y"})) == 135

        def settled() -> bool:
            with lock:
                return len(handled) == 105

        assert until(settled, 30), len(handled)
        assert until(lambda: schedule.count(Query(labels={"tenant": "x"})) == 0, 10)
        # the purged ones came due meanwhile: acked as cancelled, never handled
        assert until(lambda: index.count(Query(states={State.CANCELLED})) == 60, 10)
        with lock:
            assert sorted(handled) == [*range(100), *range(160, 165)]
        assert schedule.count() == 135
        assert schedule.count(Query(states={State.HANDLED})) == 105
        soon = schedule.list(Query(due_before_ms=publisher.factory.now_ms() + 600_000))
        assert soon == []  # nothing due in the next 10 minutes
        later = list(schedule.iterate(Query(), page=50))
        assert [e.id for e in later] == [f"m{n}" for n in range(165, 300)]
    reporter.close()
    index.close()


def test_export_and_import_move_the_schedule_to_another_namespace(
    make_topology: Callable[..., Topology],
    rabbitmq_url: str,
    start_consumer: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Migrate: export A's index, purge A, import into B: every message arrives in B
    once, not before its original due time and within one tier step of it."""
    source, target = make_topology(), make_topology()
    for topo in (source, target):
        apply_topology(topo, rabbitmq_url)
    files = {}
    for name, topo in (("a", source), ("b", target)):
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(
            f"namespace: {topo.namespace}\nladder: [1s, 2s, 4s, 8s]\ndestinations:\n"
            f"  - queue: {topo.namespace}.work\n    bindings: ['job.#']\n"
        )
    monkeypatch.setenv("DELAYQ_URL", rabbitmq_url)
    index, store = SQLiteSchedule(tmp_path / "a.db"), InMemoryStore()
    arrived: dict[str, list[float]] = {}
    lock = threading.Lock()

    def handler(value: str) -> None:
        with lock:
            arrived.setdefault(value, []).append(time.time() * 1000)

    start_consumer(source, f"{source.namespace}.work", handler, store=store)
    start_consumer(target, f"{target.namespace}.work", handler, store=InMemoryStore())
    with Publisher(
        rabbitmq_url, source, store=store, schedule=ScheduleIndex(index, keep_bodies=1024)
    ) as publisher:
        publisher.publish_many(
            [Message(f"m{n}", "job.remind", "6s", message_id=f"m{n}") for n in range(20)]
        )
    due = {e.id: e.due_at_ms for e in Schedule(index).iterate()}
    export = tmp_path / "a.jsonl"
    assert main(["scheduled", "export", "-f", str(files["a"]), "--index", str(tmp_path / "a.db"),
                 "-o", str(export)]) == EXIT_OK  # fmt: skip
    with Publisher(rabbitmq_url, source, store=store, schedule=ScheduleIndex(index)) as publisher:
        assert Schedule(index, publisher).purge(Query()).stopped == 20
    assert main(["scheduled", "import", "-f", str(files["b"]), "-i", str(export),
                 "--index", str(tmp_path / "b.db")]) == EXIT_OK  # fmt: skip
    capsys.readouterr()

    def all_arrived() -> bool:
        with lock:
            return len(arrived) == 20

    assert until(all_arrived, 30)
    # the source's copies come due too and are acked as cancelled, never handled
    queues = [source.tier_name(t) for t in source.ladder.tiers] + [f"{source.namespace}.work"]
    assert until(lambda: all(depth(rabbitmq_url, q) == 0 for q in queues), 30)
    assert index.count(Query(states={State.CANCELLED})) == 20
    with lock:
        for message_id, times in arrived.items():
            assert len(times) == 1, message_id
            assert due[message_id] - 50 <= times[0] <= due[message_id] + 4_000, message_id
    index.close()


def test_stats_shows_the_index_beside_each_tier_and_says_when_it_shows_more(
    make_topology: Callable[..., Topology],
    rabbitmq_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    import pika

    topo = make_topology(["1m", "1h"])
    apply_topology(topo, rabbitmq_url)
    (tmp_path / "t.yaml").write_text(
        json.dumps(json.loads(topo.model_dump_json(exclude_defaults=True)))
    )
    index = SQLiteSchedule(tmp_path / "index.db")
    with Publisher(rabbitmq_url, topo, schedule=ScheduleIndex(index)) as pub:
        pub.publish_many([Message(n, "job.remind", "45s") for n in range(7)])
        pub.publish_many([Message(n, "job.remind", "50m") for n in range(3)])
    index.close()
    command = ["stats", "--url", rabbitmq_url, "-f", str(tmp_path / "t.yaml"),
               "--index", str(tmp_path / "index.db"), "--json"]  # fmt: skip
    assert main(command) == EXIT_OK
    found = json.loads(capsys.readouterr().out)["index"]
    assert [(t["tier"], t["indexed"], t["queued"]) for t in found["tiers"]] == [
        ("1m", 7, 7),
        ("1h", 3, 3),
    ]
    assert found["disagrees"] is False
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:  # the 1m tier emptied behind delayq's back
        connection.channel().queue_purge(topo.tier_name(topo.ladder.tiers[0]))
    finally:
        connection.close()
    assert main(command[:-1]) == EXIT_OK
    out = capsys.readouterr().out
    assert "the schedule index beside the tiers" in out
    assert "tier 1m: the index shows 7 more waiting than its queues hold" in out
