"""Delivery records: the v1 line of a settled delivery, rotation, flushing off the hot path."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import IO

import pytest

from delayq.consume.delivery import Action, Decision, Delivery
from delayq.errors import InvalidInput, RecordsLost
from delayq.message.envelope import H_DELAY_MS, H_DUE_AT, H_PUBLISHED_AT, H_TIER, H_TIER_MS
from delayq.observe.deliveries import Observers, Settled
from delayq.observe.records import RECORD_FIELDS, RECORD_VERSION, DeliveryRecorder, record_of


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
    recorder.settled(event(999))  # after close: not recorded, but counted (and logged)
    assert len(read(tmp_path)) == 200 and recorder.late == 1


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


def test_a_full_disk_loses_records_loudly_deliveries_go_on_and_close_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = DeliveryRecorder(tmp_path)
    opened: list[Path] = []

    def open_next(path: Path) -> IO[str]:  # the first file is on a full disk
        opened.append(path)
        return open("/dev/full", "a") if len(opened) == 1 else path.open("a")

    recorder._open = open_next  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="delayq.observe.records"):
        for n in range(10):
            recorder.settled(event(n))
        assert recorder.flush() is False  # not "everything is on disk"
        assert (recorder.failed, recorder.written) == (10, 0)
        assert "No space left on device" in str(recorder.error)
        assert any("records are being lost" in r.message for r in caplog.records)
        for n in range(10, 15):  # the next records go to a new file
            recorder.settled(event(n))
        assert recorder.flush() is False
    assert recorder.written == 5
    assert [r["message_id"] for r in read(tmp_path)] == [f"m{n}" for n in range(10, 15)]
    with pytest.raises(RecordsLost, match=r"10 delivery records were not written .*No space"):
        recorder.close()


def test_records_in_a_file_removed_while_open_count_as_lost(tmp_path: Path) -> None:
    directory = tmp_path / "records"
    recorder = DeliveryRecorder(directory)
    for n in range(7):
        recorder.settled(event(n))
    assert recorder.flush()
    shutil.rmtree(directory)  # a cleanup job took the directory (and the open file)
    for n in range(7, 10):
        recorder.settled(event(n))
    assert recorder.flush() is False
    assert (recorder.written, recorder.failed) == (0, 10)
    with pytest.raises(RecordsLost) as caught:
        recorder.close()
    assert (caught.value.failed, caught.value.dropped) == (10, 0)


def test_a_directory_that_cannot_hold_records_is_refused_at_once(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(InvalidInput, match="cannot write delivery records to"):
        DeliveryRecorder(blocker / "records")
    # A Queue of size 0 is unbounded: max_pending=0 would have meant "no bound at all"
    with pytest.raises(InvalidInput, match="max_pending must be at least 1"):
        DeliveryRecorder(tmp_path, max_pending=0)


def test_a_clean_close_raises_nothing_and_dropped_records_make_it_raise(tmp_path: Path) -> None:
    with DeliveryRecorder(tmp_path) as recorder:
        recorder.settled(event(1))
    assert recorder.written == 1
    recorder = DeliveryRecorder(tmp_path, max_pending=1)
    recorder.dropped = 3  # as the full queue counts them
    with pytest.raises(RecordsLost, match="3 dropped"):
        recorder.close()
