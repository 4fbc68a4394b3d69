"""The bridge records what it schedules in a schedule index (issue 51): every message
it forwarded is *scheduled* in the index once its delivery left the intake queue, and a
bridge SIGKILLed mid-stream leaves no message at the broker without an entry: the next
bridge forwards the unacked ones again and their entries are recorded again."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from delayq.schedule.entry import State
from delayq.schedule.query import Query
from delayq.schedule.record import ScheduleIndex
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.sync import apply_topology, delete_topology
from delayq.sync.bridge import Bridge
from tests.amqp import consumers, depth
from tests.integration.intake_support import Running, publish_plugin_style
from tests.waiting import wait_for


def _topology(make_topology: Any) -> Any:
    ns = make_topology().namespace
    return make_topology(
        ladder=["1h"],
        destinations=[{"queue": f"{ns}x.work", "bindings": ["job.a"]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": "direct"}],
    )


def _messages(count: int, prefix: str = "m") -> list[dict[str, Any]]:
    return [
        {"id": f"{prefix}{i}", "routing_key": "job.a", "body": b"{}",
         "headers": {"x-delay": 600_000}}
        for i in range(count)
    ]  # fmt: skip


def _states(index: SQLiteSchedule) -> dict[str, State]:
    return {e.id: e.state for e in index.find(Query(states=set(State)), limit=100_000)}


def test_each_forward_is_scheduled_in_the_index_once_its_delivery_is_acked(
    rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    topology = _topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    intake = topology.intakes[0]
    queue = intake.queue_name(topology.namespace)
    tier = topology.tier_name(topology.ladder.tiers[0])
    index = SQLiteSchedule(tmp_path / "index.db")
    running = Running(Bridge(rabbitmq_url, topology, schedule=ScheduleIndex(index)))
    try:
        publish_plugin_style(rabbitmq_url, intake.exchange, _messages(3000))
        wait_for(lambda: depth(rabbitmq_url, tier) == 3000, 60, lambda: f"3000 in {tier}")
        wait_for(lambda: depth(rabbitmq_url, queue) == 0, 30, f"{queue} empty")
    finally:
        running.stop()
    states = _states(index)
    assert len(states) == 3000 and set(states.values()) == {State.SCHEDULED}
    entry = index.get("m7")
    assert entry is not None
    assert (entry.routing_key, entry.tier, entry.destinations) == (
        "job.a", "1h", (topology.destinations[0].queue,)
    )  # fmt: skip
    index.close()


def test_a_bridge_killed_mid_stream_leaves_no_message_without_its_entry(
    rabbitmq_url: str, make_topology: Any, tmp_path: Path
) -> None:
    """SIGKILL while 8,000 go through: what was acked from the intake queue is
    scheduled; the rest is forwarded again by a second bridge; at the end every id is
    scheduled, none pending, and the tier holds each at least once."""
    topology = _topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    intake = topology.intakes[0]
    queue = intake.queue_name(topology.namespace)
    tier = topology.tier_name(topology.ladder.tiers[0])
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    index_path = tmp_path / "index.db"
    total = 8_000
    publish_plugin_style(rabbitmq_url, intake.exchange, _messages(total))
    argv = [sys.executable, "-m", "delayq", "bridge", "-f", str(path), "--url", rabbitmq_url,
            "--schedule-index", str(index_path)]  # fmt: skip
    err = tmp_path / "err.txt"
    try:
        with err.open("w") as stderr:
            first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
        wait_for(lambda: depth(rabbitmq_url, tier) >= total // 4, 120, lambda: err.read_text())
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        wait_for(lambda: consumers(rabbitmq_url, queue) == 0, 30, "the killed bridge gone")
        index = SQLiteSchedule(index_path)
        left = depth(rabbitmq_url, queue)  # back in the intake queue with the connection
        assert 0 < left < total, left
        scheduled = {i for i, s in _states(index).items() if s is State.SCHEDULED}
        assert len(scheduled) >= total - left  # acked: scheduled (none acked unrecorded)
        with err.open("a") as stderr:
            second = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_for(lambda: depth(rabbitmq_url, queue) == 0, 120, lambda: err.read_text())
            wait_for(
                lambda: (
                    set(_states(index).values()) == {State.SCHEDULED}
                    and len(_states(index)) == total
                ),
                30,
                lambda: f"every entry scheduled: {sorted(set(_states(index).values()))}",
            )
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0, err.read_text()
        assert depth(rabbitmq_url, tier) >= total  # each at least once (a redelivered copy)
        index.close()
    finally:
        delete_topology(topology, rabbitmq_url)
