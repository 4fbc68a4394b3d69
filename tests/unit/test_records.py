"""Delivery records: the v1 line of a settled delivery, rotation, flushing off the hot path."""

from __future__ import annotations

import json
from pathlib import Path

from delayq.delivery import Action, Decision, Delivery
from delayq.envelope import H_DELAY_MS, H_DUE_AT, H_PUBLISHED_AT, H_TIER, H_TIER_MS
from delayq.observe import Observers, Settled
from delayq.records import RECORD_FIELDS, RECORD_VERSION, DeliveryRecorder, record_of


def event(n: int = 0, **overrides: object) -> Settled:
    headers = {
        H_DELAY_MS: 1500,
        H_TIER: "2s",
        H_TIER_MS: 2000,
        H_PUBLISHED_AT: 10_000,
        H_DUE_AT: 12_000,  # the tier's due time, which the record does not use
        **overrides,
    }
    d = Delivery("q", b"{}", "job.a", f"m{n}", "application/json", headers)
    return Settled(
        d, Decision(Action.ACK), received_at_ms=12_250, settled_at_ms=12_260, handler_ms=1.23456
    )


def test_a_record_has_every_v1_field_and_due_is_the_requested_time() -> None:
    record = record_of(event())
    assert tuple(record) == RECORD_FIELDS
    assert record["v"] == RECORD_VERSION == 1
    assert record["due_at_ms"] == 11_500  # published + requested delay, not the tier's 12_000
    assert record["delivered_at_ms"] - record["due_at_ms"] == 750
    assert (record["tier"], record["tier_ms"], record["outcome"]) == ("2s", 2000, "ack")
    assert record["handler_ms"] == 1.235


def test_missing_headers_give_nulls() -> None:
    record = record_of(event(**{H_DELAY_MS: None, H_PUBLISHED_AT: None}))
    assert record["requested_delay_ms"] is None and record["due_at_ms"] is None


def read(directory: Path) -> list[dict[str, object]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def test_the_recorder_writes_every_record_and_rotates_by_size(tmp_path: Path) -> None:
    recorder = DeliveryRecorder(tmp_path, max_bytes=4096)
    for n in range(200):
        recorder.settled(event(n))
    assert recorder.flush()
    records = read(tmp_path)
    assert [r["message_id"] for r in records] == [f"m{n}" for n in range(200)]
    files = recorder.files
    assert len(files) > 5
    assert all(path.stat().st_size <= 4096 for path in files)
    recorder.close()
    recorder.settled(event(999))  # after close: ignored, no error
    assert len(read(tmp_path)) == 200


def test_observers_flush_the_recorder_so_a_stopping_consumer_loses_nothing(
    tmp_path: Path,
) -> None:
    recorder = DeliveryRecorder(tmp_path)
    observers = Observers([recorder])
    for n in range(50):
        e = event(n)
        observers.emit(e.delivery, e.decision, received_at_ms=1, settled_at_ms=2, handler_ms=None)
    observers.flush()
    assert len(read(tmp_path)) == 50
    recorder.close()


def test_a_full_queue_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    recorder = DeliveryRecorder(tmp_path, max_pending=1)
    recorder.close()  # the writer is gone: nothing drains the queue any more
    recorder._closed = False  # as if records kept arriving
    for n in range(5):
        recorder.settled(event(n))
    assert recorder.dropped >= 4
