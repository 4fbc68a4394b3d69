"""What the schedule index holds, as Prometheus gauges (``pip install 'delayq[metrics]'``).

:class:`ScheduleGauges` is a collector: each scrape reads the index (at most once every
``max_age``; several Prometheus servers share a read) and exposes, for one namespace:

* ``delayq_scheduled_messages{namespace, tier}``: messages waiting (scheduled or
  rescheduled), by the tier they wait in;
* ``delayq_scheduled_due_messages{namespace, window}``: of those, the ones due within
  each window from now (``1m``, ``5m``, ``1h``, ``24h`` by default: cumulative), the
  Grafana dashboard's "due in the next hour";
* ``delayq_scheduled_overdue_messages{namespace}``: waiting ones due longer ago than
  ``overdue_after`` (5 minutes): nobody consumes their queue, or a consumer died before
  its reporter wrote (docs/guides/scheduled.md);
* ``delayq_schedule_index_up{namespace}``: 1 when the last read worked, else 0 (and no
  other series: a figure from an index that did not answer would be a guess).

>>> gauges = ScheduleGauges(SQLiteSchedule("schedule.db"), "shop")   # doctest: +SKIP
>>> server = serve_metrics(gauges.registry, port=9465)                # doctest: +SKIP

``delayq scheduled metrics --port 9465`` runs the same as a process of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from delayq.durations import Duration, to_ms
from delayq.errors import DelayqError, InvalidInput
from delayq.message.envelope import epoch_ms
from delayq.observe.metrics import _prometheus
from delayq.schedule.base import ScheduleStore
from delayq.schedule.entry import WAITING
from delayq.schedule.query import Query

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["SCHEDULE_METRICS", "ScheduleGauges"]

log = logging.getLogger("delayq.schedule")

SCHEDULE_METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "delayq_scheduled_messages": (
        "gauge",
        ("namespace", "tier"),
        "Messages waiting in the schedule index (scheduled or rescheduled), by tier.",
    ),
    "delayq_scheduled_due_messages": (
        "gauge",
        ("namespace", "window"),
        "Waiting messages due within the window from now (cumulative windows).",
    ),
    "delayq_scheduled_overdue_messages": (
        "gauge",
        ("namespace",),
        "Waiting messages whose due time passed longer ago than overdue_after.",
    ),
    "delayq_schedule_index_up": (
        "gauge",
        ("namespace",),
        "1 when the last read of the schedule index worked, else 0.",
    ),
}
"""The gauges' names, kinds, labels and help (also docs/guides/scheduled.md)."""

_Snapshot = tuple[dict[str, int], list[tuple[str, int]], int] | None


class ScheduleGauges:
    """A Prometheus collector of what ``store`` holds for ``namespace`` (registered in
    ``registry``, a fresh one by default)."""

    def __init__(
        self,
        store: ScheduleStore,
        namespace: str,
        *,
        registry: CollectorRegistry | None = None,
        windows: Sequence[Duration] = ("1m", "5m", "1h", "24h"),
        overdue_after: Duration = "5m",
        max_age: Duration = "5s",
        clock_ms: Callable[[], int] = epoch_ms,
    ) -> None:
        prom = _prometheus()
        if not isinstance(namespace, str) or not namespace:
            raise InvalidInput(f"namespace is a non-empty str, not {namespace!r}")
        if isinstance(windows, str) or not windows:
            raise InvalidInput(f"windows is a list of durations, not {windows!r}")
        self.store = store
        self.namespace = namespace
        self._windows = [(str(w), to_ms(w, what="a window")) for w in windows]
        self._overdue_ms = to_ms(overdue_after, what="overdue_after")
        self._max_age_s = to_ms(max_age, what="max_age") / 1000
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._snapshot: _Snapshot = None
        self.registry: CollectorRegistry = (
            registry if registry is not None else prom.CollectorRegistry()
        )
        self.registry.register(self)

    def __repr__(self) -> str:
        return f"ScheduleGauges({self.store!r}, {self.namespace!r})"

    def _read(self) -> _Snapshot:
        with self._lock:
            fresh = self._read_at is not None
            if fresh and time.monotonic() - self._read_at < self._max_age_s:  # type: ignore[operator]
                return self._snapshot
            now = self._clock_ms()
            ns = self.namespace
            try:
                tiers = self.store.tiers(Query(namespace=ns, states=WAITING))
                due = [
                    (name, self.store.count(Query(namespace=ns, due_before_ms=now + ms)))
                    for name, ms in self._windows
                ]
                overdue = self.store.count(
                    Query(namespace=ns, due_before_ms=max(0, now - self._overdue_ms))
                )
                self._snapshot = (tiers, due, overdue)
            except DelayqError as exc:
                log.warning("the schedule index could not be read for its gauges: %s", exc)
                self._snapshot = None
            self._read_at = time.monotonic()
            return self._snapshot

    def describe(self) -> Iterator[Any]:
        return iter(self._families())

    def collect(self) -> Iterator[Any]:
        return iter(self._families(self._read(), up=True))

    def _families(self, snapshot: _Snapshot = None, *, up: bool = False) -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        def family(name: str) -> Any:
            _, labels, text = SCHEDULE_METRICS[name]
            return GaugeMetricFamily(name, text, labels=list(labels))

        ns = self.namespace
        alive = family("delayq_schedule_index_up")
        if not up:  # describe: the names, no read
            return [family(name) for name in SCHEDULE_METRICS]
        alive.add_metric([ns], 0 if snapshot is None else 1)
        if snapshot is None:
            return [alive]
        tiers, due, overdue = snapshot
        waiting = family("delayq_scheduled_messages")
        for tier, n in sorted(tiers.items()):
            waiting.add_metric([ns, tier], n)
        soon = family("delayq_scheduled_due_messages")
        for window, n in due:
            soon.add_metric([ns, window], n)
        late = family("delayq_scheduled_overdue_messages")
        late.add_metric([ns], overdue)
        return [waiting, soon, late, alive]
