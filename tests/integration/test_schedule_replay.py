"""A DLQ replay recorded in the schedule index (`delayq dlq replay --schedule-index`),
against a real broker.

Three delayed messages, published through an indexed `Publisher` with a label, fail to
the DLQ of a consumer whose `ScheduleReporter` moves their entries to dead-lettered. Two
are replayed with `--schedule-index` while no consumer runs: their entries are written
afresh, waiting (due now, no tier, to the queue the replay sent them to) with their
labels kept; the third stays dead-lettered. A consumer then handles the two and its
reporter moves them to handled. Misuse: an intake's DLQ refuses the option (its bridge
records); through the library, an index that cannot take the pending write stops the
replay with the message still parked, and one that fails after the confirm reports the
id as not recorded, the copy delivered once.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import yaml

from delayq import FixedBackoff, SQLiteStore
from delayq.errors import ScheduleNotRecorded, StoreError
from delayq.schedule.entry import State
from delayq.schedule.record import ScheduleIndex
from delayq.schedule.replays import ReplayRecord
from delayq.schedule.report import ScheduleReporter
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.sync import Consumer, Publisher, apply_topology, parking
from delayq.topology.model import Topology
from tests.integration.conftest import SyncConsumerHandle
from tests.integration.test_apply_marker import depth
from tests.integration.test_cli_replay_uncancel import Flaky, _delayq
from tests.waiting import wait_for


def _consumer(url: str, topology: Topology, handler: Any, tmp: Any, index: Any) -> Any:
    reporter = ScheduleReporter(index, interval="50ms")
    consumer = Consumer(
        url, topology, f"{topology.namespace}.work", handler,
        store=SQLiteStore(tmp / "keys.db"), policy=FixedBackoff(delay="1s", max_attempts=1),
        observers=[reporter],
    )  # fmt: skip
    return SyncConsumerHandle(consumer), reporter


def _parked(url: str, queue: str) -> list[str]:
    return sorted(p.message_id for p in parking.browse(url, f"{queue}.dlq"))


def test_replayed_messages_are_recorded_waiting_then_handled(make_topology, rabbitmq_url, tmp_path):
    topology = make_topology(["1s"])
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    common = ["--file", str(path), "--url", rabbitmq_url]
    db = tmp_path / "schedule.db"
    index = SQLiteSchedule(db)
    run = uuid.uuid4().hex[:8]
    ids = [f"r{n}-{run}" for n in range(3)]
    handler = Flaky()
    handle, reporter = _consumer(rabbitmq_url, topology, handler, tmp_path, index)
    try:
        labels = ScheduleIndex(index, labels={"tenant": "acme"})
        with Publisher(rabbitmq_url, topology, schedule=labels) as publisher:
            for message_id in ids:
                publisher.publish({"id": message_id}, "job.x", "1s", message_id=message_id)
        wait_for(lambda: handle.stats.dead_lettered == 3, 60, "all three in the DLQ")
        wait_for(
            lambda: {index.get(i).state for i in ids} == {State.DEAD_LETTERED},  # type: ignore[union-attr]
            30,
            "their entries dead-lettered",
        )
    finally:
        handle.stop(10)
        reporter.close()
    assert _parked(rabbitmq_url, queue) == sorted(ids)

    replay = _delayq(
        "dlq", "replay", queue, "--id", ids[0], "--id", ids[1],
        "--schedule-index", str(db), *common,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    assert "replayed 2 of" in replay.stdout
    for message_id in ids[:2]:
        entry = index.get(message_id)
        assert entry is not None and entry.state is State.SCHEDULED, entry
        assert (entry.tier, entry.routing_key, entry.destinations) == ("", "job.x", (queue,))
        assert dict(entry.labels) == {"tenant": "acme"}
        assert entry.due_at_ms == entry.published_at_ms
    assert index.get(ids[2]).state is State.DEAD_LETTERED  # type: ignore[union-attr]
    shown = _delayq("scheduled", "list", "--index", str(db), "--json", "--file", str(path))
    assert shown.returncode == 0, shown.stderr
    assert sorted(e["id"] for e in json.loads(shown.stdout)["entries"]) == sorted(ids[:2])
    assert _parked(rabbitmq_url, queue) == [ids[2]]

    handler = Flaky()
    handler.failing = False
    handle, reporter = _consumer(rabbitmq_url, topology, handler, tmp_path, index)
    try:
        wait_for(lambda: handle.stats.handled == 2, 60, "the two copies handled")
        wait_for(
            lambda: [index.get(i).state for i in ids[:2]] == [State.HANDLED] * 2,  # type: ignore[union-attr]
            30,
            "their entries handled",
        )
    finally:
        handle.stop(10)
        reporter.close()
    assert sorted(b["id"] for b in handler.handled) == sorted(ids[:2])
    assert handle.stats.duplicates == 0


def test_an_intakes_dlq_refuses_the_option_before_anything_is_replayed(tmp_path):
    ns = f"t{uuid.uuid4().hex[:8]}"
    topology = Topology(
        namespace=ns,
        ladder=["1s"],
        destinations=[{"queue": f"{ns}.work", "bindings": ["job.x"]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": "direct"}],
    )
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    intake = topology.intakes[0]
    refused = _delayq(
        "dlq", "replay", intake.exchange, "--all", "--schedule-index", str(tmp_path / "i.db"),
        "--file", str(path), "--url", "amqp://guest:guest@127.0.0.1:1/",
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "its bridge records them" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "i.db").exists()


class Breaks:
    """An index whose ``add`` (the pending write) or ``move`` fails as a server gone."""

    def __init__(self, inner: Any, what: str) -> None:
        self.inner, self.what = inner, what

    def __getattr__(self, name: str) -> Any:
        if name == self.what:

            def broken(*args: Any, **kwargs: Any) -> Any:
                raise StoreError("index server gone")

            return broken
        return getattr(self.inner, name)


@pytest.mark.parametrize("what", ["add", "move"])
def test_an_index_failing_mid_replay_loses_and_doubles_nothing(
    what, make_topology, rabbitmq_url, tmp_path, collect
):
    topology = make_topology(["1s"])
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    message_id = f"f-{uuid.uuid4().hex[:8]}"
    handler = Flaky()
    index = SQLiteSchedule(tmp_path / "schedule.db")
    handle, reporter = _consumer(rabbitmq_url, topology, handler, tmp_path, index)
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            publisher.publish({"id": message_id}, "job.x", "0s", message_id=message_id)
        wait_for(lambda: handle.stats.dead_lettered == 1, 60, "the message in the DLQ")
    finally:
        handle.stop(10)
        reporter.close()
    record = ReplayRecord(ScheduleIndex(Breaks(index, what)), topology)  # type: ignore[arg-type]

    def replay() -> Any:
        return parking.replay(
            rabbitmq_url, f"{queue}.dlq", topology, target=lambda p: ("", queue), record=record
        )

    if what == "add":
        with pytest.raises(ScheduleNotRecorded, match="0 were replayed and recorded"):
            replay()
        assert _parked(rabbitmq_url, queue) == [message_id]
        assert depth(rabbitmq_url, queue) == 0
        assert index.get(message_id) is None
        return
    seen = collect(queue)
    report = replay()
    assert (report.replayed, report.unrecorded) == ([message_id], [message_id])
    assert [a.message_id for a in seen.wait(1, 30)] == [message_id]
    assert _parked(rabbitmq_url, queue) == []
    entry = index.get(message_id)
    assert entry is not None and entry.state is State.PENDING


def test_an_unrouted_copy_that_comes_back_is_shown_parked_not_waiting(
    make_topology, rabbitmq_url, tmp_path
):
    """A replay of an unrouted message whose key still matches no binding: the copy is
    parked again, and its entry says so (dead-lettered), never waiting for a consumer."""
    topology = make_topology(["1s"], external_bindings=["nobody.*"])  # bound elsewhere
    apply_topology(topology, rabbitmq_url)
    with Publisher(rabbitmq_url, topology) as publisher:
        publisher.publish({"late": True}, "nobody.yet", "0s", message_id="u-1")
    unrouted = f"{topology.namespace}.unrouted"
    wait_for(lambda: depth(rabbitmq_url, unrouted) == 1, 30, "the message unrouted")
    index = SQLiteSchedule(tmp_path / "schedule.db")
    record = ReplayRecord(ScheduleIndex(index), topology)
    report = parking.replay(
        rabbitmq_url, unrouted, topology, target=lambda p: (topology.ready_exchange,
        p.delivery.origin_routing_key), record=record,
    )  # fmt: skip
    assert (report.replayed, report.returned, report.unrecorded) == ([], ["u-1"], [])
    entry = index.get("u-1")
    assert entry is not None and entry.state is State.DEAD_LETTERED and entry.destinations == ()
    assert depth(rabbitmq_url, unrouted) == 1


def test_a_missing_index_or_an_id_of_another_namespace_leaves_messages_parked(
    make_topology, rabbitmq_url, tmp_path
):
    topology = make_topology(["1s"])
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    handler = Flaky()
    index = SQLiteSchedule(tmp_path / "schedule.db")
    handle, reporter = _consumer(rabbitmq_url, topology, handler, tmp_path, index)
    ids = [f"c{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            for message_id in ids:
                publisher.publish({"id": message_id}, "job.x", "0s", message_id=message_id)
        wait_for(lambda: handle.stats.dead_lettered == 3, 60, "all three in the DLQ")
    finally:
        handle.stop(10)
        reporter.close()

    typo = tmp_path / "nodir" / "schedule.db"
    missing = _delayq(
        "dlq", "replay", queue, "--all", "--schedule-index", str(typo),
        "--file", str(path), "--url", rabbitmq_url,
    )  # fmt: skip
    assert missing.returncode == 1 and "no schedule index" in missing.stderr, missing.stderr
    assert not typo.parent.exists() and _parked(rabbitmq_url, queue) == sorted(ids)
    empty = tmp_path / "empty.db"
    empty.touch()  # a file the open would make an index of
    made = _delayq(
        "dlq", "replay", queue, "--all", "--schedule-index", str(empty),
        "--file", str(path), "--url", rabbitmq_url,
    )  # fmt: skip
    assert made.returncode == 1 and "an empty file; nothing was replayed" in made.stderr
    assert empty.stat().st_size == 0 and _parked(rabbitmq_url, queue) == sorted(ids)

    other = Topology(
        namespace=f"{topology.namespace}x", ladder=["1s"],
        destinations=[{"queue": f"{topology.namespace}x.work", "bindings": ["job.#"]}],
    )  # fmt: skip
    held = ReplayRecord(ScheduleIndex(index), other)
    copy = parking.browse(rabbitmq_url, f"{queue}.dlq")[0]
    from delayq.ops.parked import replay_message

    clash = copy.message_id
    held.replayed(
        replay_message(copy.delivery, exchange="", routing_key="x", now_ms=1),
        "job.x", ("x",), lambda: None,
    )  # fmt: skip
    run = _delayq(
        "dlq", "replay", queue, "--all", "--schedule-index", str(tmp_path / "schedule.db"),
        "--file", str(path), "--url", rabbitmq_url,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert "replayed 2 of 3" in run.stdout
    assert "1 left in" in run.stderr and "their ids wait in another namespace" in run.stderr
    assert _parked(rabbitmq_url, queue) == [clash]
    assert {index.get(i).state for i in ids if i != clash} == {State.SCHEDULED}  # type: ignore[union-attr]
