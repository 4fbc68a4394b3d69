"""The bridge's deliveries: each one read, planned, encoded and published as it arrives,
its confirm settling the window (the per-delivery half of :mod:`delayq.aio._bridgewire`,
which owns the connections and the stop).

A delivery is read (every property: :func:`~delayq.message.decoding.basic_properties`),
planned by :class:`~delayq.intake.relay.Relay` (pure), encoded
(:func:`~delayq.message.carried.bridged_frames`) and published on the confirming channel
at once; each exchange is checked (passively) once per connection before its first
publish (a publish to a missing one would close the channel). Confirms settle the
deliveries through a :class:`~delayq.intake.window.Window`: the confirmed ones at the
front, in delivery order, acked with one ``multiple`` ack per loop turn; one the broker
did not take (a nack, a return) put back on the intake queue, and no delivery is taken
for :data:`REFUSED_PAUSE_S`. A delivery whose headers cannot be read, or whose forward
and park cannot be written, is rejected (the broker dead-letters it, as it came, to the
intake's DLQ); a forward that cannot be sent is parked as ``bridge-error``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from delayq.aio._deliveries import ack_frame, reject_frame
from delayq.aio._framebatch import channel_error
from delayq.aio._wire import CONSUME_CHANNEL, PUBLISH_CHANNEL, ChannelClosed, Wire, WireClosed
from delayq.errors import AccessRefused, DelayqError, PublishError, TopologyMissing
from delayq.intake.bridging import BridgeStats, acknowledge
from delayq.intake.relay import Forward, Incoming, Relay
from delayq.intake.window import Plan, Window
from delayq.message import outcomes
from delayq.message.carried import Unwritable, bridged_frames
from delayq.message.decoding import basic_properties

if TYPE_CHECKING:
    from delayq.aio._bridgerecord import BridgeRecord

__all__ = ["FATAL", "REFUSED_PAUSE_MAX_S", "REFUSED_PAUSE_S", "Lost", "Relaying"]

log = logging.getLogger("delayq.bridge")

REFUSED_PAUSE_S = 2.0
"""How long the bridge takes no delivery after the broker refused a publish (a full
tier): the refused one is back in the intake queue, and would come straight back. Twice
as long after each pause whose next deliveries were refused again, up to
:data:`REFUSED_PAUSE_MAX_S`; back to this once the broker takes one again: a tier full
for minutes does not spend a message's ``delivery_limit`` in 40 s."""

REFUSED_PAUSE_MAX_S = 30.0

FATAL = (TopologyMissing, AccessRefused)
"""What no reconnect mends: raised to the caller."""


class Lost(Exception):
    """The connection ended for a reason a new one may mend (the caller reconnects)."""


class _Acks:
    """The consuming channel's acks as frames (:class:`~delayq.intake.bridging.Acking`)."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    def basic_ack(self, delivery_tag: int, multiple: bool) -> None:
        self.wire.send_frames(ack_frame(CONSUME_CHANNEL, delivery_tag, multiple))

    def basic_reject(self, delivery_tag: int, requeue: bool) -> None:
        self.wire.send_frames(reject_frame(CONSUME_CHANNEL, delivery_tag, requeue))


class Relaying:
    """The per-delivery half of the bridge (see the module); its subclass owns the
    connections (:class:`~delayq.aio._bridgewire.WireBridge`)."""

    def __init__(
        self, relay: Relay, stats: BridgeStats, record: BridgeRecord | None = None
    ) -> None:
        self.relay = relay
        self.record = record
        """The schedule index's writes (:mod:`delayq.aio._bridgerecord`), or ``None``."""
        self.queue = relay.queue
        self.stats = stats
        self.stopping = False
        self._changed: asyncio.Event | None = None
        # One connection's state (see reset).
        self._wire: Wire | None = None
        """The publishing connection (the consuming one is :attr:`_acks`' wire)."""
        self._acks: _Acks | None = None
        self._window = Window()
        self._ended: BaseException | None = None
        self._checked: set[str] = set()
        self._unchecked: dict[str, list[tuple[int, Plan, bytes]]] = {}
        self._backlog: deque[tuple[int, str, bytes, bytes]] = deque()
        self._paused = False
        self._pause_s = REFUSED_PAUSE_S
        """The next pause after a refusal (doubling while refusals go on)."""
        self._drain_scheduled = False
        # With an index: forwards waiting for their pending write, confirms for their move.
        self._to_record: list[tuple[int, Plan, bytes]] = []
        self._to_move: list[tuple[int, str, PublishError | None]] = []
        self._recorded: dict[int, str] = {}
        """Delivery tag -> the entry its forward's pending write made."""
        self._writing = {"record": False, "move": False}
        self._writers: set[asyncio.Task[None]] = set()

    def reset(self, consuming: Wire, wire: Wire) -> None:
        """A new connection pair: nothing in flight, no exchange checked."""
        self._wire, self._acks = wire, _Acks(consuming)
        self._window = Window()
        self._ended = None
        self._checked, self._unchecked = set(), {}
        self._backlog.clear()
        self._paused = self._drain_scheduled = False
        self._to_record, self._to_move, self._recorded = [], [], {}
        self._writing = {"record": False, "move": False}  # an old connection's: its own

    def end(self, exc: BaseException) -> None:
        """This connection is over (the first reason counts)."""
        if self._ended is None:
            self._ended = exc
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    # Deliveries ---------------------------------------------------------------------------

    def arrived(self, tag: int, routing_key: str, header: bytes, body: bytes) -> None:
        if self.stopping or self._ended is not None:
            return  # not sent: back with the channel (past every tag a stop acks)
        if self._paused or self._backlog:
            self._backlog.append((tag, routing_key, header, body))
            return
        self._take(tag, routing_key, header, body)

    def _take(self, tag: int, routing_key: str, header: bytes, body: bytes) -> None:
        try:
            properties = basic_properties(header, 12, len(header))
        except Exception as exc:
            self._reject(tag, f"delivery {tag}", f"its headers cannot be read ({_said(exc)})")
            return
        try:
            incoming = Incoming(routing_key, body, properties)
            encoded = self._encode(tag, self.relay.plan(incoming), incoming)
            if encoded is not None:
                self._window.add(tag, encoded[0])
                plan = encoded[0]
                if (
                    self.record is not None
                    and isinstance(plan, Forward)
                    and plan.message.receipt.tier
                ):
                    self._to_record.append((tag, *encoded))  # published once recorded
                    self._start("record", self._record_forwards)
                else:
                    self._publish(tag, *encoded)
        except (WireClosed, ChannelClosed) as exc:  # the publish channel is gone
            self.end(exc)
        except Exception as exc:  # delayq's own failure on this delivery: not the bridge's end
            log.exception("bridge of %s failed on delivery %d", self.queue, tag)
            self._window.discard(tag)
            self._reject(tag, f"delivery {tag}", _said(exc))
            if not self._window:
                self._wake()  # a stop may wait for the window to empty

    def _encode(self, tag: int, plan: Plan, incoming: Incoming) -> tuple[Plan, bytes] | None:
        """``plan`` and its frames; a forward that cannot be written, parked; a park that
        cannot, rejected (``None``)."""
        wire = self._wire
        assert wire is not None
        while True:
            try:
                return plan, bridged_frames(plan.message, PUBLISH_CHANNEL, wire.frame_max)
            except Unwritable as exc:
                why: str | None = str(exc)
                error: BaseException = exc
            except Exception as exc:  # past the frame, or delayq's own failure
                why, error = None, exc
                log.error("bridge of %s: %s", self.queue, exc)
            if not isinstance(plan, Forward):
                said = f"its headers cannot be sent ({why})" if why else _said(error)
                self._reject(tag, plan.message.message_id, said)
                return None
            if why is not None:
                plan = self.relay.park(incoming, why)
            else:
                plan = self.relay.failed(incoming, error)

    def _publish(self, tag: int, plan: Plan, frames: bytes) -> None:
        msg = plan.message
        wire = self._wire
        assert wire is not None
        if msg.exchange not in self._checked:
            waiting = self._unchecked.get(msg.exchange)
            if waiting is None:
                waiting = self._unchecked[msg.exchange] = []
                wire.loop.create_task(self._check(wire, msg.exchange))
            waiting.append((tag, plan, frames))
            return
        wire.publish(frames, self, tag, (msg.exchange, msg.routing_key, msg.message_id))

    async def _check(self, wire: Wire, exchange: str) -> None:
        """Check ``exchange`` exists, then publish what waited for it."""
        try:
            await wire.exchange_exists(exchange)
        except ChannelClosed as exc:
            self.end(channel_error(exc))
            return
        except WireClosed as exc:
            self.end(exc)
            return
        if wire is not self._wire:
            return
        self._checked.add(exchange)
        for tag, plan, frames in self._unchecked.pop(exchange, []):
            try:
                self._publish(tag, plan, frames)
            except (WireClosed, ChannelClosed) as exc:
                self.end(exc)
                return

    # The schedule index (:mod:`delayq.aio._bridgerecord`) -------------------------------

    def _start(self, step: str, run: Callable[[Wire], Awaitable[None]]) -> None:
        """Run ``step``'s writer for this connection unless it runs already."""
        if not self._writing[step]:
            wire = self._wire
            assert wire is not None
            self._writing[step] = True
            task = wire.loop.create_task(self._writer(step, run, wire))
            self._writers.add(task)
            task.add_done_callback(self._writers.discard)

    def drop_writes(self) -> None:
        """This connection's index writes given up (its deliveries are back in the intake
        queue): a write a locked store holds does not outlive the loop as a pending task."""
        self._to_record, self._to_move, self._recorded = [], [], {}
        for task in list(self._writers):
            task.cancel()

    async def _writer(self, step: str, run: Callable[[Wire], Awaitable[None]], wire: Wire) -> None:
        try:
            await run(wire)
        except Exception:  # delayq's own failure: the connection ends, nothing is acked
            log.exception("bridge of %s: its schedule index %s failed", self.queue, step)
            if wire is self._wire:
                self.end(Lost(f"the schedule index's {step} failed"))
        finally:
            if wire is self._wire:
                self._writing[step] = False

    async def _record_forwards(self, wire: Wire) -> None:
        """Write what waits pending, a batch at a time, then publish it. A batch the index
        cannot take goes back to the intake queue whole (one pause, one line); an id it
        refuses for good (waiting in another namespace of the index) is rejected to the
        intake's DLQ, as it came, and the rest of its batch goes on."""
        record = self.record
        assert record is not None
        while self._to_record and wire is self._wire and self._ended is None:
            batch, self._to_record = self._to_record, []
            while batch:
                try:
                    ids = set(await record.before([plan.message for _, plan, _ in batch]))
                except DelayqError as exc:
                    if wire is not self._wire:
                        return
                    refused = set(getattr(exc, "elsewhere", ()))
                    if not refused:
                        for tag, _, _ in batch:
                            self._window.settled(tag, exc)
                        self._schedule_drain(wire)
                        break
                    for tag, plan, _ in batch:
                        if plan.message.message_id in refused:
                            self._window.discard(tag)
                            self._reject(tag, plan.message.message_id, str(exc))
                    batch = [one for one in batch if one[1].message.message_id not in refused]
                    if not self._window:
                        self._wake()  # a stop may wait for the window to empty
                    continue
                if wire is not self._wire:
                    return
                try:
                    for tag, plan, frames in batch:
                        if plan.message.message_id in ids:
                            self._recorded[tag] = plan.message.message_id
                        self._publish(tag, plan, frames)
                except (WireClosed, ChannelClosed) as exc:  # the publish channel is gone
                    self.end(exc)
                    return
                break

    async def _move_settled(self, wire: Wire) -> None:
        """Move the settled forwards' entries, then let their deliveries be acked."""
        record = self.record
        assert record is not None
        while self._to_move and wire is self._wire:
            batch, self._to_move = self._to_move, []
            confirmed = {entry for _, entry, error in batch if error is None}
            await record.after([entry for _, entry, _ in batch], confirmed)
            if wire is not self._wire:
                return
            for tag, _, error in batch:
                self._window.settled(tag, error)
            self._schedule_drain(wire)

    def _reject(self, tag: int, name: str, why: str) -> None:
        """Leave the delivery to the broker's dead-lettering: into the intake's DLQ, intact."""
        assert self._acks is not None
        self._acks.basic_reject(tag, False)
        self.stats.rejected += 1
        log.warning(
            "rejected %s of %s to %s, as it came: %s", name, self.queue, self.relay.dlq, why
        )

    # The wire's sink: confirms --------------------------------------------------------------

    def settled(self, token: int, acked: bool, returned: bool) -> None:
        error: PublishError | None = None
        if returned or not acked:
            try:
                msg = self._window.plan(token).message
            except KeyError:
                return  # of a window given up

            error = outcomes.unroutable(msg) if returned else outcomes.rejected(msg)
        entry = self._recorded.pop(token, None)
        if entry is not None:  # acked once its entry moved
            self._to_move.append((token, entry, error))
            self._start("move", self._move_settled)
            return
        self._window.settled(token, error)
        assert self._wire is not None
        self._schedule_drain(self._wire)

    def _schedule_drain(self, wire: Wire) -> None:
        if not self._drain_scheduled:
            self._drain_scheduled = True
            wire.loop.call_soon(self._drain)

    def failed(self, token: int, exc: Exception) -> None:
        """Its channel or connection closed first: the connection is over (what is
        unacked goes back to the intake queue with it)."""
        error = channel_error(exc) if isinstance(exc, ChannelClosed) else exc
        self.end(error if isinstance(error, FATAL) else Lost(str(exc)))

    def _drain(self) -> None:
        """Ack and nack the settled deliveries at the front of the window."""
        self._drain_scheduled = False
        done = self._window.ready()
        if not done or self._acks is None:
            return
        wire = self._acks.wire
        if wire.closed is not None or CONSUME_CHANNEL not in wire.readers:
            return  # their channel is gone: back in the queue already
        taken, refused = acknowledge(self._acks, done, self.stats, self.queue, self.relay.dlq)
        if refused and not self._paused:
            self._paused = True
            log.warning(
                "bridge of %s takes no delivery for %g s: the broker (or its schedule "
                "index) refuses what it sends",
                self.queue,
                self._pause_s,
            )
            wire.loop.call_later(self._pause_s, self._resume, wire)
            self._pause_s = min(self._pause_s * 2, REFUSED_PAUSE_MAX_S)
        elif taken and not refused and not self._paused:
            self._pause_s = REFUSED_PAUSE_S  # the broker takes them again
        if not self._window:
            self._wake()

    def _resume(self, wire: Wire) -> None:
        """The pause after a refusal is over: take what arrived meanwhile."""
        if self._acks is None or wire is not self._acks.wire:
            return
        self._paused = False
        backlog = self._backlog
        while backlog and not self._paused and not self.stopping and self._ended is None:
            self._take(*backlog.popleft())


def _said(exc: BaseException | None) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]
