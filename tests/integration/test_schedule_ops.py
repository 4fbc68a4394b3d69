"""The schedule index's operator story (issue 51) on a real broker: messages across the
ladder with some cancelled, some promoted, some purged by label and some delivered; the
index's counts and due windows are exact at each step, and no purged or cancelled
message reaches the handler."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from delayq import Message
from delayq.schedule.api import Schedule
from delayq.schedule.entry import State
from delayq.schedule.query import Query
from delayq.schedule.record import ScheduleIndex
from delayq.schedule.report import ScheduleReporter
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.stores.memory import InMemoryStore
from delayq.sync import Publisher, apply_topology
from delayq.topology.model import Topology

from .test_consumer import until


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
    tenant = lambda m: {"tenant": m.headers["tenant"]}  # noqa: E731
    with Publisher(
        rabbitmq_url,
        topo,
        store=store,
        schedule=ScheduleIndex(index, labels=tenant, keep_bodies=1024),
    ) as publisher:
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
