"""`delayq dlq replay --store URL [--uncancel]` against a real broker (issue 15's override).

Two messages fail to the DLQ of a sync consumer with a SQLite store, and both are
cancelled (`delayq cancel`). Replayed with `--store` alone, the first one's copy is
skipped as cancelled and the replay says so; replayed with `--uncancel`, the second
one's cancel is cleared first and its copy is handled, once. Misuse first: `--uncancel`
without `--store` is a usage error (exit 2), an unreachable or missing store a clear
error; neither replays anything. Last, through the library: a store failing half-way
stops the replay, and what was not replayed stays parked.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import pika
import pytest
import yaml

from delayq import FixedBackoff, SQLiteStore
from delayq.errors import StoreError
from delayq.ops.replay_marks import ReplayMarks
from delayq.sync import Consumer, Publisher, apply_topology, parking
from tests.integration.conftest import SyncConsumerHandle
from tests.integration.test_apply_marker import depth
from tests.waiting import wait_for


def _delayq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", *args], capture_output=True, text=True, timeout=timeout
    )


class Flaky:
    def __init__(self) -> None:
        self.failing = True
        self.handled: list[Any] = []

    def __call__(self, body: Any) -> None:
        if self.failing:
            raise RuntimeError("down for the test")
        self.handled.append(body)


def test_dlq_replay_skips_a_cancelled_message_unless_uncancelled(
    make_topology, rabbitmq_url, tmp_path
):
    topology = make_topology(["1s"])
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    db = tmp_path / "keys.db"
    store = SQLiteStore(db)
    common = ["--file", str(path), "--url", rabbitmq_url]
    sqlite_url = f"sqlite:///{db}"
    run = uuid.uuid4().hex[:8]
    skipped, overridden = f"skipped-{run}", f"overridden-{run}"
    handler = Flaky()
    policy = FixedBackoff(delay="1s", max_attempts=2)
    handle = SyncConsumerHandle(
        Consumer(rabbitmq_url, topology, queue, handler, store=store, policy=policy)
    )

    def parked() -> list[str]:
        return sorted(p.message_id for p in parking.browse(rabbitmq_url, f"{queue}.dlq"))

    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            for message_id in (skipped, overridden):
                publisher.publish({"id": message_id}, "job.x", "0s", message_id=message_id)
        wait_for(lambda: handle.stats.dead_lettered == 2, 60, "both messages in the DLQ")
        assert parked() == sorted([skipped, overridden])
        handler.failing = False
        cancel = _delayq(
            "cancel", "--message-id", skipped, "--message-id", overridden,
            "--store", sqlite_url, "--file", str(path),  # no --url: a cancel marks the store
        )  # fmt: skip
        assert cancel.returncode == 0, cancel.stderr

        # Misuse: nothing is replayed.
        usage = _delayq("dlq", "replay", queue, "--id", overridden, "--uncancel", *common)
        assert usage.returncode == 2
        assert "--uncancel needs --store" in usage.stderr
        down = _delayq(
            "dlq", "replay", queue, "--id", overridden, "--uncancel",
            "--store", "redis://:sekrit@127.0.0.1:1/0", *common,
        )  # fmt: skip
        assert down.returncode == 1
        assert "cannot open the store at redis://" in down.stderr
        assert "sekrit" not in down.stderr and "Traceback" not in down.stderr
        missing = _delayq(
            "dlq", "replay", queue, "--all", "--store", f"sqlite:///{tmp_path}/nope.db", *common
        )
        assert missing.returncode == 2 and "no SQLite file" in missing.stderr
        assert parked() == sorted([skipped, overridden])

        # Without the override: replayed, named, and skipped as cancelled.
        look = _delayq("dlq", "replay", queue, "--id", skipped, "--store", sqlite_url, *common)
        assert look.returncode == 0, look.stderr
        assert "replayed 1 of" in look.stdout
        assert "1 message cancelled: their copies will be skipped as cancelled" in look.stdout
        assert skipped in look.stdout and "--uncancel" in look.stdout
        wait_for(lambda: handle.stats.cancelled == 1, 30, "the replayed copy skipped")
        assert handler.handled == []

        # With it: the cancel is cleared first, the copy is handled once.
        override = _delayq(
            "dlq", "replay", queue, "--id", overridden, "--uncancel",
            "--store", sqlite_url, *common,
        )  # fmt: skip
        assert override.returncode == 0, override.stderr
        assert f"1 message uncancelled: their copies will be handled: {overridden}" in (
            override.stdout
        )
        wait_for(lambda: handle.stats.handled == 1, 30, "the uncancelled copy handled")
        assert handler.handled == [{"id": overridden}]
        assert parked() == []
    finally:
        handle.stop(10)
        store.close()
    assert (handle.stats.handled, handle.stats.cancelled, handle.stats.duplicates) == (1, 1, 0)


class FailingSecond:
    """A store whose second uncancel fails as a server going away would."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def uncancel_batch(self, keys: Any, *, now_ms: int, look_only: bool = False) -> Any:
        self.calls += 1
        if self.calls == 2:
            raise ConnectionError("store server gone")
        return self.inner.uncancel_batch(keys, now_ms=now_ms, look_only=look_only)


def test_a_store_failing_half_way_stops_the_replay_and_leaves_the_rest_parked(
    make_topology, rabbitmq_url, tmp_path
):
    topology = make_topology(["1s"])
    queue = f"{topology.namespace}.work"
    apply_topology(topology, rabbitmq_url)
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()  # each publish returns once the broker has it
        for message_id in ("first", "second", "third"):
            props = pika.BasicProperties(message_id=message_id, content_type="application/json")
            channel.basic_publish("", f"{queue}.dlq", b"{}", properties=props)
    finally:
        connection.close()
    # The replay takes the queue's count when it starts, which can trail a quorum
    # queue's confirms on 4.x: wait until it says all three.
    wait_for(lambda: depth(rabbitmq_url, f"{queue}.dlq") == 3, 30, "3 parked")
    store = SQLiteStore(tmp_path / "keys.db")
    marks = ReplayMarks(FailingSecond(store), queue, uncancel=True)
    try:
        with pytest.raises(StoreError, match="before second: 1 were replayed") as caught:
            parking.replay(
                rabbitmq_url, f"{queue}.dlq", topology, target=lambda p: ("", queue), marks=marks
            )
    finally:
        store.close()
    assert "store server gone" in str(caught.value)
    left = sorted(p.message_id for p in parking.browse(rabbitmq_url, f"{queue}.dlq"))
    assert left == ["second", "third"]
