"""`delayq cancel` and `delayq reschedule` against a real broker (issue 15's CLI).

Two queues bind the same routing key and share one SQLite store with their consumers
(sync or async). Of four parked messages, one is cancelled by id, one from a file, one is
rescheduled to an earlier time with a new body through the command line: only the kept
one and the new copy are handled, once in each queue; everything else is acked
``cancelled``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import pytest
import yaml

from delayq import SQLiteStore
from delayq.aio import AsyncConsumer
from delayq.sync import Consumer, Publisher, apply_topology
from tests.integration import test_key_scope as scope
from tests.integration.conftest import AsyncConsumerHandle, SyncConsumerHandle

ROUTING_KEY = scope.ROUTING_KEY


def _delayq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_cli_cancel_and_reschedule_on_a_real_broker(kind, make_topology, rabbitmq_url, tmp_path):
    topology, queues = scope.fan_out_topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology.model_dump(mode="json")))
    db = tmp_path / "keys.db"
    store = SQLiteStore(db)
    marks = ["--file", str(path), "--store", f"sqlite:///{db}"]  # a cancel takes no --url
    common = [*marks, "--url", rabbitmq_url]
    ledger = scope.Ledger()
    bodies: list[tuple[str, Any]] = []
    handles: list[Any] = []
    run = uuid.uuid4().hex[:8]
    ids = {name: f"{name}-{run}" for name in ("by-id", "by-file", "kept", "moved")}
    try:
        with Publisher(rabbitmq_url, topology) as publisher:
            for name, message_id in ids.items():
                publisher.publish({"name": name}, ROUTING_KEY, "2s", message_id=message_id)
        listing = tmp_path / "ids.txt"
        listing.write_text(f"{ids['by-file']}\n")
        cancel = _delayq(
            "cancel", "--message-id", ids["by-id"], "--from-file", str(listing), *marks
        )
        assert cancel.returncode == 2  # --message-id and --from-file exclude each other
        cancel = _delayq("cancel", "--message-id", ids["by-id"], "--json", *marks)
        assert cancel.returncode == 0, cancel.stderr
        [receipt] = json.loads(cancel.stdout)["receipts"]
        assert receipt["queues"] == {q: "unknown" for q in queues}
        cancel = _delayq("cancel", "--from-file", str(listing), *marks)
        assert cancel.returncode == 0, cancel.stderr
        assert ids["by-file"] in cancel.stdout
        moved = _delayq(
            "reschedule",
            "--message-id",
            ids["moved"],
            "--delay",
            "1s",
            "--body",
            '{"name": "moved-new"}',
            "-k",
            ROUTING_KEY,
            "--json",
            *common,
        )
        assert moved.returncode == 0, moved.stderr
        assert json.loads(moved.stdout)["moved"] is True
        # The consumers start only now: however slow the commands were, nothing was
        # delivered before its cancel (the copies due meanwhile wait in the queues).
        for queue in queues:

            def handle(body: Any, queue: str = queue) -> None:
                bodies.append((queue, body))
                ledger.ran(f"{queue}:{body['name']}")

            async def handle_async(body: Any, queue: str = queue) -> None:
                handle(body, queue)

            options: dict[str, Any] = {"store": store, "observers": [ledger]}
            if kind == "sync":
                consumer = Consumer(rabbitmq_url, topology, queue, handle, **options)
                handles.append(SyncConsumerHandle(consumer))
            else:
                aconsumer = AsyncConsumer(rabbitmq_url, topology, queue, handle_async, **options)
                handles.append(AsyncConsumerHandle(aconsumer))
        # per queue: by-id, by-file and the old copy of moved cancelled; kept and the
        # new copy handled
        ledger.wait_settled(queues, 5, timeout_s=60)
    finally:
        for h in handles:
            h.stop(10)
        store.close()
    said = [(e.queue, e.delivery.message_id, e.outcome) for e in ledger.events]
    assert ledger.runs == {f"{q}:{n}": 1 for q in queues for n in ("kept", "moved-new")}, said
    for queue in queues:
        assert sorted(ledger.outcomes[queue]) == [
            "ack",
            "ack",
            "cancelled",
            "cancelled",
            "cancelled",
        ]
