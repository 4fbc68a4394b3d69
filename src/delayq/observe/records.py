"""Delivery records: one JSON line per settled delivery, for ``delayq spark report``.

:class:`DeliveryRecorder` is an observer (see :mod:`delayq.observe.deliveries`) for either
consumer. It never blocks the consumer: :meth:`~DeliveryRecorder.settled` puts
the record on a queue and a background thread writes it. Files rotate by size
and are named so that sorting them sorts them in time::

    DIR/deliveries-<start, UTC>-<pid>-<seq>.jsonl

Format, version 1 (``"v": 1``; a field is ``null`` when the message did not
carry it, as one not published by delayq). Times are epoch milliseconds, UTC::

    v                    1
    message_id           str
    routing_key          the routing key of the first publish
    queue                the destination queue that received it
    attempt              1 for the first delivery, 2 for the first retry...
    outcome              "ack", "duplicate", "cancelled", "retry" or "dead-letter"
    reason               why, for retry and dead-letter ("" otherwise)
    requested_delay_ms   the delay asked for (by the publisher or the retry)
    tier                 the tier it waited in ("immediate" for no delay)
    tier_ms              that tier's TTL
    published_at_ms      when it was published (the publisher's clock)
    due_at_ms            published_at_ms + requested_delay_ms: when it was asked for
    delivered_at_ms      when the consumer received it (the consumer's clock)
    settled_at_ms        when its fate was safe (ack sent, retry confirmed)
    handler_ms           how long the handler ran (float; null if it did not run)

A new field may be added within version 1; a changed meaning or a removed field
makes version 2. Readers skip versions they do not know.

>>> recorder = DeliveryRecorder("records/")                   # doctest: +SKIP
>>> consumer = AsyncConsumer(url, topology, "emails", send,    # doctest: +SKIP
...                          observers=[recorder])
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import IO, Any

from delayq.errors import InvalidInput, RecordsLost
from delayq.observe.deliveries import Settled

__all__ = ["RECORD_FIELDS", "RECORD_VERSION", "DeliveryRecorder", "record_of"]

log = logging.getLogger("delayq.records")

RECORD_VERSION = 1
RECORD_FIELDS = (
    "v",
    "message_id",
    "routing_key",
    "queue",
    "attempt",
    "outcome",
    "reason",
    "requested_delay_ms",
    "tier",
    "tier_ms",
    "published_at_ms",
    "due_at_ms",
    "delivered_at_ms",
    "settled_at_ms",
    "handler_ms",
)

_STOP = object()


def record_of(event: Settled) -> dict[str, Any]:
    """The version-1 record of one settled delivery (pure)."""
    published, delay = event.published_at_ms, event.requested_delay_ms
    return {
        "v": RECORD_VERSION,
        "message_id": event.message_id,
        "routing_key": event.routing_key,
        "queue": event.queue,
        "attempt": event.attempt,
        "outcome": event.outcome,
        "reason": event.reason,
        "requested_delay_ms": delay,
        "tier": event.tier,
        "tier_ms": event.tier_ms,
        "published_at_ms": published,
        "due_at_ms": None if published is None or delay is None else published + delay,
        "delivered_at_ms": event.received_at_ms,
        "settled_at_ms": event.settled_at_ms,
        "handler_ms": None if event.handler_ms is None else round(event.handler_ms, 3),
    }


class DeliveryRecorder:
    """Appends one record per settled delivery to rotating JSON-lines files in ``directory``.

    ``max_bytes`` is the size at which a file is closed and the next one begun
    (default 64 MiB). At most ``max_pending`` records wait for the writer; past
    that (the disk cannot keep up) records are dropped and counted in
    :attr:`dropped`, never blocking the consumer. A write that fails (disk
    full, directory gone or not writable) loses its records, counted in
    :attr:`failed`, is logged as an error, and the next records try a new file;
    deliveries go on. :meth:`flush` waits until everything recorded so far is
    written (the consumers call it when they stop); :meth:`close` raises
    :class:`~delayq.errors.RecordsLost` if any record was dropped or failed.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = 64 * 1024 * 1024,
        max_pending: int = 100_000,
        prefix: str = "deliveries",
    ) -> None:
        if max_bytes < 1024:
            raise InvalidInput(f"max_bytes must be at least 1024, got {max_bytes}")
        if max_pending < 1:  # a Queue of size 0 is unbounded: the opposite of a small bound
            raise InvalidInput(f"max_pending must be at least 1, got {max_pending}")
        self.directory = Path(directory)
        try:  # refused here, not found out by the writer thread after the consumer started
            self.directory.mkdir(parents=True, exist_ok=True)
            if not os.access(self.directory, os.W_OK | os.X_OK):
                raise PermissionError(f"no write permission on {self.directory}")
        except OSError as exc:
            raise InvalidInput(f"cannot write delivery records to {self.directory}: {exc}") from exc
        self.max_bytes = max_bytes
        self.dropped = 0
        """Records not written because the writer fell behind (``max_pending``)."""
        self.failed = 0
        """Records not written because writing failed (see :attr:`error`)."""
        self.written = 0
        """Records written and flushed to the file."""
        self.late = 0
        """Deliveries settled after :meth:`close`, not recorded."""
        self.error: BaseException | None = None
        """The last write failure, if any."""
        self._prefix = f"{prefix}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
        self._seq = 0
        self._file: IO[str] | None = None
        self._size = 0
        self._in_file = 0  # records written to the current file
        self._queue: queue.Queue[Any] = queue.Queue(max_pending)
        self._closed = False
        self._dead = False  # the writer thread stopped on an unexpected error
        self._failing = False  # the last write failed (logged once per streak)
        self._thread = threading.Thread(target=self._write_loop, name="delayq-records", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"DeliveryRecorder({str(self.directory)!r})"

    @property
    def files(self) -> list[Path]:
        """The files this recorder wrote, oldest first."""
        return sorted(self.directory.glob(f"{self._prefix}-*.jsonl"))

    @property
    def lost(self) -> int:
        """Records not written, for any reason (:attr:`dropped` + :attr:`failed`)."""
        return self.dropped + self.failed

    def settled(self, event: Settled) -> None:
        """Queue the event's record (the observer hook; returns at once)."""
        if self._closed:
            self.late += 1
            if self.late == 1:  # the consumer outlived its recorder: say so, once
                log.warning(
                    "delivery records: a delivery settled after the recorder for %s was "
                    "closed is not recorded (counted in DeliveryRecorder.late); stop the "
                    "consumer first",
                    self.directory,
                )
            return
        if self._dead:
            self.failed += 1
            return
        try:
            self._queue.put_nowait(record_of(event))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning(
                    "delivery records are arriving faster than %s can write them; "
                    "dropping (counted in DeliveryRecorder.dropped)",
                    self.directory,
                )

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every record queued so far is written; ``False`` on timeout, or when
        records were lost (:attr:`lost`), which the recorder has logged."""
        if self._dead or not self._thread.is_alive():
            return self._queue.empty() and not self.lost
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s) and not self.lost

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, close the file, stop the writer thread.

        Raises :class:`~delayq.errors.RecordsLost` when records were not written
        (as a file's ``close`` raises when its last write fails).
        """
        if self._closed:
            return
        self._closed = True
        if not self._dead:
            try:
                self._queue.put(_STOP, timeout=timeout_s)
            except queue.Full:
                log.warning("delivery records: the writer did not drain in %.0f s", timeout_s)
            self._thread.join(timeout_s)
        if self._thread.is_alive():  # still writing: what is queued is not known written
            self.failed += self._queue.qsize()
        if self.lost:
            raise RecordsLost(
                f"{self.lost:,} delivery records were not written to {self.directory} "
                f"({self.failed:,} failed"
                + (f": {self.error}" if self.error is not None else "")
                + f"; {self.dropped:,} dropped: the writer fell behind); "
                f"{self.written:,} were written. The deliveries themselves were not affected; "
                "a report from these records undercounts them.",
                failed=self.failed,
                dropped=self.dropped,
            )

    def __enter__(self) -> DeliveryRecorder:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # writer thread ------------------------------------------------------------

    def _write_loop(self) -> None:
        try:
            while True:
                item = self._queue.get()
                batch = [item]
                while len(batch) < 1000:  # write what is waiting in one go
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                lines = [
                    json.dumps(entry, separators=(",", ":")) + "\n"
                    for entry in batch
                    if isinstance(entry, dict)
                ]
                self._write_batch(lines)
                for entry in batch:
                    if isinstance(entry, threading.Event):
                        entry.set()
                if _STOP in batch:
                    return
        except Exception as exc:
            self._dead = True
            self.error = exc
            self.failed += self._queue.qsize()
            log.exception("delivery records: the writer failed; no more records are written")
        finally:
            self._close_file()

    def _write_batch(self, lines: list[str]) -> None:
        """Write and flush ``lines``; on an OS error count them lost and start a new file."""
        if not lines:
            return
        try:
            self._check_file()
            for line in lines:
                self._write(line)
            if self._file is not None:
                self._file.flush()
        except OSError as exc:
            # Some of the batch may have reached the file: none is counted written.
            self.failed += len(lines)
            self.error = exc
            self._close_file()
            if not self._failing:
                self._failing = True
                log.error(
                    "delivery records: cannot write to %s (%s); records are being lost "
                    "(counted in DeliveryRecorder.failed), deliveries go on; the next "
                    "records try a new file",
                    self.directory,
                    exc,
                )
            return
        self.written += len(lines)
        if self._failing:
            self._failing = False
            log.warning(
                "delivery records: writing to %s again (%d records lost so far)",
                self.directory,
                self.failed,
            )

    def _check_file(self) -> None:
        """A file removed while open takes every line written to it: count them lost."""
        if self._file is not None and os.fstat(self._file.fileno()).st_nlink == 0:
            self._close_file()
            self.written -= self._in_file
            self.failed += self._in_file
            raise FileNotFoundError(
                f"the records file was removed while open ({self._in_file} records in it lost)"
            )

    def _write(self, line: str) -> None:
        size = len(line.encode("utf-8"))
        if self._file is None or (self._size and self._size + size > self.max_bytes):
            if self._file is not None:  # its last lines are not flushed yet: errors count
                file, self._file = self._file, None
                file.close()
            self._seq += 1
            self._file = self._open(self.directory / f"{self._prefix}-{self._seq:05d}.jsonl")
            self._size = self._in_file = 0
        self._file.write(line)
        self._size += size
        self._in_file += 1

    def _open(self, path: Path) -> IO[str]:
        return path.open("a", encoding="utf-8")

    def _close_file(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):  # its loss is counted by the failed write
                file.close()
