"""Delivery records: one JSON line per settled delivery, for ``delayq spark report``.

:class:`DeliveryRecorder` is an observer (see :mod:`delayq.observe`) for either
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
    outcome              "ack", "duplicate", "retry" or "dead-letter"
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

import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import IO, Any

from delayq.errors import InvalidInput
from delayq.observe import Settled

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
    :attr:`dropped`, never blocking the consumer. :meth:`flush` waits until
    everything recorded so far is written; the consumers call it when they stop.
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
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.dropped = 0
        self.written = 0
        self._prefix = f"{prefix}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
        self._seq = 0
        self._file: IO[str] | None = None
        self._size = 0
        self._queue: queue.Queue[Any] = queue.Queue(max_pending)
        self._closed = False
        self._thread = threading.Thread(target=self._write_loop, name="delayq-records", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"DeliveryRecorder({str(self.directory)!r})"

    @property
    def files(self) -> list[Path]:
        """The files this recorder wrote, oldest first."""
        return sorted(self.directory.glob(f"{self._prefix}-*.jsonl"))

    def settled(self, event: Settled) -> None:
        """Queue the event's record (the observer hook; returns at once)."""
        if self._closed:
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
        """Wait until every record queued so far is on disk; ``False`` on timeout."""
        if not self._thread.is_alive():
            return self._queue.empty()
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, close the file, stop the writer thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            log.warning("delivery records: the writer did not drain in %.0f s", timeout_s)
        self._thread.join(timeout_s)

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
                stop = False
                for entry in batch:
                    if entry is _STOP:
                        stop = True
                    elif isinstance(entry, threading.Event):
                        self._sync()
                        entry.set()
                    else:
                        self._write(json.dumps(entry, separators=(",", ":")) + "\n")
                self._sync()
                if stop:
                    return
        except Exception:
            log.exception("delivery records: the writer failed; no more records are written")
        finally:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _write(self, line: str) -> None:
        size = len(line.encode("utf-8"))
        if self._file is None or (self._size and self._size + size > self.max_bytes):
            if self._file is not None:
                self._file.close()
            self._seq += 1
            path = self.directory / f"{self._prefix}-{self._seq:05d}.jsonl"
            self._file = path.open("a", encoding="utf-8")
            self._size = 0
        self._file.write(line)
        self._size += size
        self.written += 1

    def _sync(self) -> None:
        if self._file is not None:
            self._file.flush()
