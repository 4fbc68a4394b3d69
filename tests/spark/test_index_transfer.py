"""A schedule moved through Spark (issue 51): ``delayq spark export --bodies`` writes one
namespace's index as Parquet, the source is purged, and ``delayq spark import`` publishes
the waiting messages into another namespace on a real broker: each arrives there once, not
before its original due time and within a tier step of it (at once if that passed),
recorded in the target's index with its labels. An export without bodies, another
Parquet folder or a missing one are refused and send nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq import Message
from delayq.cli import main
from delayq.schedule.api import Schedule
from delayq.schedule.entry import Entry, State
from delayq.schedule.memory import MemorySchedule
from delayq.schedule.query import Query
from delayq.schedule.record import ScheduleIndex
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.spark.index import read_index
from delayq.stores.memory import InMemoryStore
from delayq.sync import Consumer, Publisher, apply_topology
from delayq.topology.model import Topology
from tests.integration.conftest import SyncConsumerHandle

from ..amqp import depth
from ..waiting import wait_for


def _file(tmp_path: Path, name: str, topology: Topology) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    return path


def test_a_schedule_exported_as_parquet_is_delivered_once_from_another_namespace(
    spark: Any,
    make_topology: Callable[..., Topology],
    rabbitmq_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ladder = ["1s", "2s", "8s", "1h"]
    source, target = make_topology(ladder), make_topology(ladder)
    for topology in (source, target):
        apply_topology(topology, rabbitmq_url)
    files = {"a": _file(tmp_path, "a", source), "b": _file(tmp_path, "b", target)}
    index, store = SQLiteSchedule(tmp_path / "a.db"), InMemoryStore()
    arrived: dict[str, list[float]] = {}
    lock = threading.Lock()

    def handler(value: str) -> None:
        with lock:
            arrived.setdefault(value, []).append(time.time() * 1000)

    def consume(topology: Topology, keys: Any) -> SyncConsumerHandle:
        queue = f"{topology.namespace}.work"
        return SyncConsumerHandle(Consumer(rabbitmq_url, topology, queue, handler, store=keys))

    # The source's consumer starts once the purge marked its copies cancelled: the copies
    # wait in its queue meanwhile, however long the exports take.
    handles = [consume(target, InMemoryStore())]
    try:
        recording = ScheduleIndex(index, labels={"tenant": "acme"}, keep_bodies=1024)
        with Publisher(rabbitmq_url, source, store=store, schedule=recording) as publisher:
            publisher.publish_many(
                [Message(f"m{n}", "job.remind", "8s", message_id=f"m{n}") for n in range(20)]
            )
            publisher.publish("late", "job.remind", "50m", message_id="late")
        due = {e.id: e.due_at_ms for e in Schedule(index).iterate() if e.id != "late"}
        common = ["--no-ui", "--url", rabbitmq_url]
        out, bare = str(tmp_path / "export"), str(tmp_path / "bare")
        a = ["--index", str(tmp_path / "a.db"), "--file", str(files["a"]), "--no-ui"]
        assert main(["spark", "export", out, *a, "--bodies"]) == 0
        assert main(["spark", "export", bare, *a]) == 0
        with Publisher(rabbitmq_url, source, store=store, schedule=ScheduleIndex(index)) as p:
            assert Schedule(index, p).purge(Query()).stopped == 21
        handles.append(consume(source, store))
        capsys.readouterr()

        # Refused, nothing sent: bodies not kept (each named), another folder, none.
        b = ["--file", str(files["b"]), *common]
        never = str(tmp_path / "never.db")
        assert main(["spark", "import", bare, *b, "--index", never]) == 2
        assert "exported without --bodies" in capsys.readouterr().err
        assert not Path(never).exists()  # a refused run makes no index
        assert main(["spark", "import", str(files["b"]), *b]) == 2  # a file, not Parquet
        assert "is not a Parquet file" in capsys.readouterr().err
        assert main(["spark", "import", str(tmp_path), *b, "--index", "/nope/x.db"]) == 2
        unbound = str(tmp_path / "unbound")
        strange = MemorySchedule()
        strange.add([Entry("zz", source.namespace, "zzz.q", due_at_ms=due["m0"], tier="8s",
                           published_at_ms=0, size=2, body=b"{}", headers={},
                           content_type="application/json")])  # fmt: skip
        strange.move(["zz"], State.SCHEDULED, now_ms=1)
        read_index(spark, strange, unbound, bodies=True)
        assert main(["spark", "import", unbound, *b]) == 2
        assert "entry 'zz': routing key 'zzz.q'" in capsys.readouterr().err
        spark.range(3).write.parquet(str(tmp_path / "other"))
        assert main(["spark", "import", str(tmp_path / "other"), *b]) == 2
        assert "not an export of the schedule index" in capsys.readouterr().err
        assert main(["spark", "import", str(tmp_path / "none"), *b]) == 2
        assert depth(rabbitmq_url, target.tier_name(target.ladder.tiers[-1])) == 0

        started = time.time() * 1000
        assert main(["spark", "import", out, *b, "--index", str(tmp_path / "b.db")]) == 0
        assert "published 21 of 21 again" in capsys.readouterr().out
        late_tier = target.tier_name(target.ladder.tiers[-1])
        assert main(["spark", "import", out, *b, "--index", str(tmp_path / "b.db")]) == 0
        assert "already scheduled in the target index" in capsys.readouterr().err
        assert depth(rabbitmq_url, late_tier) == 1  # imported once

        def all_arrived() -> bool:
            with lock:
                return len(arrived) == 20

        wait_for(all_arrived, 30, "every message in the target namespace")
        queues = [source.tier_name(t) for t in source.ladder.tiers[:3]] + [
            f"{source.namespace}.work"
        ]
        wait_for(lambda: all(depth(rabbitmq_url, q) == 0 for q in queues), 30, "source empty")
    finally:
        for handle in handles:
            handle.stop(10)
    assert index.count(Query(states={State.CANCELLED})) == 21
    with lock:
        for message_id, times in arrived.items():
            assert len(times) == 1, message_id
            # never early; at its due time, or at once where that passed before the import
            latest = max(due[message_id], started) + 4_000
            assert due[message_id] - 50 <= times[0] <= latest, message_id
    # Recorded in the target's index, as any publish: what still waited (late, and the
    # others if the steps above took less than their 8 s; overdue ones are sent at once).
    moved = SQLiteSchedule(tmp_path / "b.db")
    entries = {e.id: e for e in Schedule(moved).iterate(Query(states=set(State)))}
    assert "late" in entries and set(entries) <= {*due, "late"}
    assert entries["late"].state is State.SCHEDULED and entries["late"].tier == "1h"
    assert {e.namespace for e in entries.values()} == {target.namespace}
    assert all(dict(e.labels) == {"tenant": "acme"} for e in entries.values())
    moved.close()
    index.close()
