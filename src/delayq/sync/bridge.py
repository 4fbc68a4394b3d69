"""The bridge: plugin-style messages from an intake queue into delayq's tiers.

>>> bridge = Bridge(url, topology, "orders.delayed")        # doctest: +SKIP
>>> bridge.run()             # until SIGTERM/SIGINT (``delayq bridge`` runs this)  # doctest: +SKIP

One connection consumes the intake queue (``<ns>.intake.<exchange>``, prefetch
``prefetch``) and publishes: each delivery is planned by
:class:`~delayq.intake.relay.Relay` (pure) as it arrives and published at once, up to
``prefetch`` unconfirmed, on delayq's own AMQP frame wire, in an event loop of the
bridge's own (:mod:`delayq.aio._bridgewire`: :meth:`Bridge.run` blocks, like any sync
call). A delivery is acked only
once the broker confirmed where it went, its tier or the intake's DLQ (the confirmed
ones in delivery order, with one ``multiple`` ack), so nothing is lost: a bridge that
dies leaves the unacked messages in the intake queue, and the next one sends them again
under the same message ids (duplicates an idempotent consumer skips). A message the
broker did not take (a full tier, say) goes back to the intake queue after a pause; one
that comes back more than the intake's ``delivery_limit`` times is dead-lettered to its
DLQ by the broker. A stop settles what is in flight first, for up to ``stop_grace``, and
only then cancels its consumer (what comes meanwhile is not sent: back in the queue); what
is still unconfirmed then is left unacked (back in the intake queue, sent again by the next
bridge under the same ids) and :meth:`Bridge.run` raises
:class:`~delayq.errors.PublishUnconfirmed` saying how many: a stuck broker (a memory
alarm, confirms that never come) cannot hold a stop. A second stop request gives up the
grace at once.

No message stops the bridge: what the relay cannot schedule it parks with the reason; a
message whose headers cannot be read, or cannot be written again (a NaN, a timestamp past
the year 9999), is rejected, and the broker dead-letters it, as it came, to the same DLQ
(reason ``rejected``). A message delayq itself fails on (a bug: planning it, encoding or
writing its forward) is parked as ``bridge-error``, with the error; if its park fails
too, it is rejected the same way. Every other message goes on. A publish the broker
refuses (a full tier) puts its delivery back on the intake queue, and the bridge takes
nothing for 2 s.

With ``schedule`` (a :class:`~delayq.schedule.record.ScheduleIndex`), each forward is
recorded as a publisher records its messages: pending before it is published, scheduled
once confirmed, and only then is its delivery acked (:mod:`delayq.aio._bridgerecord`).

A delay counts from when the bridge takes the message: while the bridge is down,
messages wait in the intake queue and arrive late by that much, never early.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from delayq.aio._bridgerecord import BridgeRecord
from delayq.aio._bridgewire import Lost, WireBridge
from delayq.aio._wire import WireClosed
from delayq.consume.settings import RECONNECT_MAX_S, RECONNECT_MIN_S, check_prefetch
from delayq.durations import Duration
from delayq.errors import ConnectionFailed
from delayq.intake.bridging import (
    STOP_GRACE,
    BridgeStats,
    check_stop_grace,
    pick_intake,
    unconfirmed_at_stop,
)
from delayq.schedule.record import ScheduleIndex
from delayq.sync._signals import stopping_on_signals
from delayq.topology.model import Topology
from delayq.urls import redact, resolve_url

__all__ = ["Bridge", "BridgeStats", "pick_intake"]

log = logging.getLogger("delayq.bridge")

_RECONNECTABLE = (Lost, WireClosed, ConnectionFailed)


class Bridge:
    """Schedules what plugin-style publishers send to one intake (see the module)."""

    def __init__(
        self,
        url: str | None,
        topology: Topology,
        intake: str | None = None,
        *,
        prefetch: int = 1000,
        stop_grace: Duration = STOP_GRACE,
        schedule: ScheduleIndex | None = None,
    ) -> None:
        prefetch = check_prefetch(prefetch)  # AMQP's is 16 bits: refused before connecting
        self.stop_grace_s = check_stop_grace(stop_grace)
        """How long a stop waits for the confirms of what is in flight (see the module)."""
        self._url = resolve_url(url)
        self.topology = topology
        self.intake = pick_intake(topology, intake)
        self.started = threading.Event()
        self.stats = BridgeStats()
        self._engine = WireBridge(
            self._url,
            topology,
            self.intake,
            prefetch=prefetch,
            stop_grace_s=self.stop_grace_s,
            stats=self.stats,
            started=self.started,
            record=None if schedule is None else BridgeRecord(schedule, topology),
        )
        self.relay = self._engine.relay
        self.queue = self.relay.queue
        self._lock = threading.RLock()  # a signal handler may take it in the same thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._hurry = threading.Event()

    def request_stop(self, *, now: bool = False) -> None:
        """Stop taking deliveries, settle those in flight (for up to ``stop_grace``),
        return; ``now``: without waiting for them (safe from any thread or a signal
        handler). Deliveries not settled are left unacked: back in the intake queue."""
        with self._lock:
            if now:
                self._hurry.set()
            self._stop.set()
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._pass_stop)

    def _pass_stop(self) -> None:
        if self._stop.is_set():
            self._engine.stop(now=self._hurry.is_set())

    def _signalled(self) -> None:
        """SIGTERM or SIGINT: a stop; a second one gives up the grace."""
        self.request_stop(now=self._stop.is_set())

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Bridge until SIGTERM or SIGINT (or :meth:`request_stop`). A lost connection
        is reopened (back-off from ``RECONNECT_MIN_S`` up to ``RECONNECT_MAX_S``, from the
        start again after a connection that got to consume); a missing intake queue, a
        topology not applied or a refused permission raise at once.

        :raises PublishUnconfirmed: the stop left deliveries unconfirmed after its
            grace (they are back in the intake queue; nothing confirmed is lost).
        """
        abandoned = self.stats.abandoned
        with stopping_on_signals(self._signalled, install=install_signal_handlers):
            loop = asyncio.new_event_loop()
            try:
                with self._lock:
                    self._loop = loop
                loop.run_until_complete(self._run())
            finally:
                with self._lock:
                    self._loop = None
                loop.close()
                log.info(
                    "bridge of %s stopped: %d forwarded, %d parked in %s, %d returned, "
                    "%d reconnects",
                    self.queue,
                    self.stats.forwarded,
                    self.stats.parked,
                    self.relay.dlq,
                    self.stats.returned,
                    self.stats.reconnects,
                )
        left = self.stats.abandoned - abandoned
        if left:
            raise unconfirmed_at_stop(self.queue, left, self._engine.abandoned_after)

    async def _run(self) -> None:
        engine = self._engine
        self._pass_stop()  # one asked before the loop ran
        delay = RECONNECT_MIN_S
        while not engine.stopping:
            try:
                await engine.serve()
                return
            except _RECONNECTABLE as exc:
                if not self.started.is_set():
                    if isinstance(exc, ConnectionFailed):
                        raise
                    raise ConnectionFailed(
                        f"lost the broker at {redact(self._url)} while subscribing to "
                        f"{self.queue!r}: {exc}"
                    ) from exc
                if engine.subscribed:  # it was bridging: a new outage, not the last one's
                    delay = RECONNECT_MIN_S
                log.warning(
                    "bridge of %s lost the broker (%s); reconnecting in %g s",
                    self.queue,
                    exc,
                    delay,
                )
            await engine.pause(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)
            self.stats.reconnects += 1
