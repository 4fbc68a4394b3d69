"""How consumers keep the schedule index: a delivery observer that moves each settled
message's entry (handled, dead-lettered, taken for a retry), in batches, off the
consumer's own path.

``Consumer(..., observers=[ScheduleReporter(store)])`` (sync or async, a ``Worker``'s
consumers alike). A settled delivery is queued; a thread writes the queue every
``interval`` (and at :meth:`ScheduleReporter.close`), so a handled message leaves the
index's waiting view within ``interval`` plus one store write while its consumer runs.
A store that fails keeps the reports for the next round (up to ``max_pending``, then the
oldest are dropped and counted in :attr:`ScheduleReporter.dropped`, with a warning): the
index is a view, and a consumer never waits for it or fails a delivery because of it.

``retention`` (a duration, for example ``"7d"``): the reporter also deletes the entries
of finished messages that last changed longer ago, at its first round and every
:data:`EXPIRE_EVERY_S` after (``delayq scheduled expire`` does it once, from cron).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from delayq.consume.delivery import Action
from delayq.durations import Duration, to_ms
from delayq.errors import DelayqError, InvalidInput
from delayq.message.envelope import epoch_ms
from delayq.observe.deliveries import Settled
from delayq.schedule.base import ScheduleStore
from delayq.schedule.entry import State

__all__ = ["EXPIRE_EVERY_S", "ScheduleReporter"]

EXPIRE_EVERY_S = 600.0
"""How often a reporter with a ``retention`` deletes finished entries (and at its first
round)."""

log = logging.getLogger("delayq.schedule")

_STATE_OF: dict[Action, State] = {
    Action.ACK: State.HANDLED,
    Action.DUPLICATE: State.HANDLED,  # a copy of a message handled before
    Action.RETRY: State.DELIVERED,
    Action.DEAD_LETTER: State.DEAD_LETTERED,
}
"""A copy acked as cancelled moves nothing: it may be the older copy of a message
rescheduled under the same id, whose newer copy still waits; the cancel itself moved the
entry (a publisher with this index)."""


class ScheduleReporter:
    """A :class:`~delayq.observe.deliveries.DeliveryObserver` that tells the schedule
    index what became of each message its consumer settled."""

    def __init__(
        self,
        store: ScheduleStore,
        *,
        interval: Duration = "1s",
        max_pending: int = 100_000,
        retention: Duration | None = None,
        clock_ms: Callable[[], int] = epoch_ms,
    ) -> None:
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise InvalidInput(f"max_pending is a whole number of 1 or more, not {max_pending!r}")
        self.store = store
        self.interval_s = to_ms(interval, what="interval") / 1000
        if self.interval_s <= 0:
            raise InvalidInput(f"interval is a duration above 0, not {interval!r}")
        self.max_pending = max_pending
        self.retention_ms = None if retention is None else to_ms(retention, what="retention")
        self.expired = 0
        """Finished entries this reporter deleted (``retention``)."""
        self._expired_at: float | None = None
        self.dropped = 0
        self._clock_ms = clock_ms
        self._pending: OrderedDict[str, State] = OrderedDict()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="delayq-schedule", daemon=True)
        self._thread.start()
        # A process that ends without close() (a consumer stopped by SIGTERM, which does
        # not close its observers) still writes what is queued.
        atexit.register(self.close)

    def __repr__(self) -> str:
        return f"ScheduleReporter({self.store!r})"

    def settled(self, event: Settled) -> None:
        if event.message_id is None:
            return
        state = _STATE_OF.get(event.action)
        if state is None:
            return
        with self._lock:
            self._pending[event.message_id] = state
            self._pending.move_to_end(event.message_id)
            while len(self._pending) > self.max_pending:
                self._pending.popitem(last=False)
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 10_000 == 0:
                    log.warning(
                        "the schedule index is not taking reports: %d dropped so far "
                        "(those entries stay as they were)",
                        self.dropped,
                    )

    def flush(self) -> bool:
        """Write what is queued now; whether all of it was written."""
        with self._lock:
            batch, self._pending = self._pending, OrderedDict()
        if not batch:
            return True
        by_state: dict[State, list[str]] = {}
        for message_id, state in batch.items():
            by_state.setdefault(state, []).append(message_id)
        now = self._clock_ms()
        written: set[str] = set()
        try:
            for state, ids in by_state.items():
                self.store.move(ids, state, now_ms=now)
                written.update(ids)
        except DelayqError as exc:
            log.warning("the schedule index could not be written (kept for later): %s", exc)
            with self._lock:  # put back what was not written, older than what came since
                kept = OrderedDict((i, s) for i, s in batch.items() if i not in written)
                kept.update(self._pending)
                self._pending = kept
            return False
        return True

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self.flush()
            self._expire()

    def _expire(self) -> None:
        """With ``retention``: delete finished entries older than it, at most once every
        :data:`EXPIRE_EVERY_S` (so an entry is gone within retention and that)."""
        if self.retention_ms is None:
            return
        if self._expired_at is not None and time.monotonic() - self._expired_at < EXPIRE_EVERY_S:
            return
        self._expired_at = time.monotonic()
        try:
            self.expired += self.store.expire(
                finished_before_ms=self._clock_ms() - self.retention_ms
            )
        except DelayqError as exc:
            log.warning("the schedule index could not expire finished entries: %s", exc)

    def close(self) -> None:
        """Stop the thread after a last write (also at the process's normal exit)."""
        atexit.unregister(self.close)
        self._closed = True
        self._wake.set()
        self._thread.join()
        self.flush()
