"""The bridge's engine: an intake queue relayed into delayq's tiers on delayq's frame wire.

Two connections (:class:`~delayq.aio._wire.Wire`), one event loop, one thread. The intake
queue is consumed on one, whose deliveries come as frames
(:class:`~delayq.aio._deliveries.DeliveryFrames`); each is read (every property:
:func:`~delayq.message.decoding.basic_properties`), planned by
:class:`~delayq.intake.relay.Relay` (pure), encoded
(:func:`~delayq.message.carried.bridged_frames`) and published on the other's confirming
channel as it arrives, up to ``prefetch`` unconfirmed. Confirms settle the
deliveries through a :class:`~delayq.intake.window.Window`: the confirmed ones at the
front, in delivery order, acked with one ``multiple`` ack per loop turn; one the broker
did not take (a nack, a return) put back on the intake queue, and the bridge pauses
(:data:`REFUSED_PAUSE_S`) before it takes more. Nothing is acked before its confirm.

Each exchange is checked (passively) once per connection before its first publish, and
the topology's apply marker when the connection opens: a publish to a missing exchange
would close the publish channel. A delivery whose headers cannot be read, or whose
forward and park cannot be written, is rejected (the broker dead-letters it, as it came,
to the intake's DLQ); a forward that cannot be sent is parked as ``bridge-error``.

What ends a connection: the broker or the network (reconnected by the caller); a
missing queue or exchange, a refused permission (raised); a stop, which stops taking
deliveries, waits up to its grace for the confirms of those in flight and acks them,
then cancels the consumer (a quorum queue's channel may hold acks back; the cancel sends
them) and closes. What is unacked then goes back to the intake queue with the channel.

Two connections, not one: a broker short of memory or disk blocks every connection that
publishes, and stops reading it. The consuming one never publishes, so its acks go on
being read, and a stop under the alarm closes it at once: what is unacked is back in the
intake queue then, not when the alarm clears.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import Any

from pamqp import commands

from delayq.aio._deliveries import DeliveryFrames, ack_frame, reject_frame
from delayq.aio._framebatch import channel_error
from delayq.aio._framelink import open_wire
from delayq.aio._wire import CONSUME_CHANNEL, PUBLISH_CHANNEL, ChannelClosed, Wire, WireClosed
from delayq.errors import AccessRefused, PublishError, TopologyMissing
from delayq.intake.bridging import IO_JOIN_S, BridgeStats, acknowledge
from delayq.intake.relay import Forward, Incoming, Relay
from delayq.intake.window import Plan, Window
from delayq.links import gate_for
from delayq.message import outcomes
from delayq.message.carried import Unwritable, bridged_frames
from delayq.message.decoding import basic_properties
from delayq.topology.intakes import Intake
from delayq.topology.model import Topology

__all__ = ["REFUSED_PAUSE_S", "Lost", "WireBridge"]

log = logging.getLogger("delayq.bridge")

REFUSED_PAUSE_S = 2.0
"""How long the bridge takes no delivery after the broker refused a publish (a full
tier): the refused one is back in the intake queue, and would come straight back."""

_FATAL = (TopologyMissing, AccessRefused)
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


class _Reader(DeliveryFrames):
    """The consuming channel's end of the wire: each delivery to the bridge."""

    def __init__(self, bridge: WireBridge) -> None:
        super().__init__()
        self.bridge = bridge

    def whole(self, deliver: tuple[int, bool, str], header: bytes, body: bytes) -> None:
        self.bridge.arrived(deliver[0], deliver[2], header, body)

    def cancelled(self, consumer_tag: str) -> None:
        self.bridge.end(Lost(f"the broker cancelled the consumer {consumer_tag}"))

    def closed(self, exc: Exception) -> None:
        self.bridge.end(exc)


class WireBridge:
    """One intake's bridge on one connection at a time (see the module). Its owner calls
    :meth:`serve` once per connection, and :meth:`stop` from the loop's thread."""

    def __init__(
        self,
        url: str,
        topology: Topology,
        intake: Intake,
        *,
        prefetch: int,
        stop_grace_s: float,
        stats: BridgeStats,
        started: threading.Event,
    ) -> None:
        self.url = url
        self.relay = Relay(topology, intake)
        self.queue = self.relay.queue
        self.prefetch = prefetch
        self.stop_grace_s = stop_grace_s
        self.stats = stats
        self.started = started
        self.gate = gate_for(topology, url)
        self.stopping = False
        self.hurry = False
        self.abandoned_after = ""
        """What ended the last stop with deliveries unconfirmed."""
        self._changed: asyncio.Event | None = None
        # One connection's state (reset by serve).
        self._wire: Wire | None = None
        """The publishing connection (the consuming one is :attr:`_acks`' wire)."""
        self._acks: _Acks | None = None
        self._window = Window()
        self._ended: BaseException | None = None
        self._checked: set[str] = set()
        self._unchecked: dict[str, list[tuple[int, Plan, bytes]]] = {}
        self._backlog: deque[tuple[int, str, bytes, bytes]] = deque()
        self._paused = False
        self._drain_scheduled = False
        self._subscribed = False
        self._tag = ""

    # Control (the loop's thread) ----------------------------------------------------

    def stop(self, *, now: bool = False) -> None:
        """Take no more deliveries; settle those in flight for up to the grace (``now``:
        not even that)."""
        self.stopping = True
        self.hurry = self.hurry or now
        self._wake()

    def end(self, exc: BaseException) -> None:
        """This connection is over (the first reason counts)."""
        if self._ended is None:
            self._ended = exc
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def _until(self, done: Any, timeout_s: float | None = None) -> None:
        """Wait until ``done()`` is true, or ``timeout_s`` passed."""
        changed = self._changed
        assert changed is not None
        loop = asyncio.get_running_loop()
        until = None if timeout_s is None else loop.time() + timeout_s
        while not done():
            left = None if until is None else until - loop.time()
            if left is not None and left <= 0:
                return
            changed.clear()
            try:
                await asyncio.wait_for(changed.wait(), left)
            except asyncio.TimeoutError:
                return

    async def pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if a stop comes."""
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._until(lambda: self.stopping, seconds)

    # One connection ---------------------------------------------------------------------

    async def serve(self) -> None:
        """Bridge on one new connection until a stop (then return) or its end: raises
        :class:`Lost`, ``WireClosed`` or ``ConnectionFailed`` for what a new connection
        may mend, a delayq error for what it cannot."""
        self._changed = asyncio.Event()
        name = f"delayq-bridge {self.queue}"
        consuming = await open_wire(self.url, attempts=3, name=name, publish=False)
        try:  # the same node, where a multi-host URL has several
            wire = await open_wire(consuming.url or self.url, attempts=3, name=f"{name} publishing")
        except BaseException:
            consuming.abort()
            raise
        self._reset(consuming, wire)
        consuming.on_close.append(self.end)
        wire.on_close.append(self.end)
        after = "its connection lost while stopping"
        try:
            await self._subscribe(consuming, wire)
            await self._until(lambda: self.stopping or self._ended is not None)
            if self._ended is not None:
                raise self._ended
            log.info(
                "bridge of %s stopping: up to %g s for the confirms of %d in flight (a "
                "second stop request: none)",
                self.queue,
                self.stop_grace_s,
                len(self._window),
            )
            self._backlog.clear()  # never sent: back with the channel
            await self._until(
                lambda: not self._window or self.hurry or self._ended is not None,
                self.stop_grace_s,
            )
            self._drain()
            after = "a second stop request" if self.hurry else "its stop grace"
            if not self.hurry and self._ended is None:
                try:  # sends what a quorum queue's channel held back of the acks
                    cancel = commands.Basic.Cancel(consumer_tag=self._tag)
                    await asyncio.wait_for(
                        consuming.call(CONSUME_CHANNEL, cancel, commands.Basic.CancelOk),
                        IO_JOIN_S,
                    )
                except (asyncio.TimeoutError, WireClosed, ChannelClosed):
                    pass
        except ChannelClosed as exc:  # on subscribing, or the consuming channel closed
            error = channel_error(exc)
            if isinstance(error, _FATAL) or not self._subscribed:
                raise error from exc
            raise Lost(str(error)) from exc
        finally:
            if self.stopping and self._window:
                self._abandon(after)
            consuming.readers.pop(CONSUME_CHANNEL, None)
            self._window = Window()
            self._backlog.clear()
            await self._close(consuming, wire)

    def _reset(self, consuming: Wire, wire: Wire) -> None:
        self._wire, self._acks = wire, _Acks(consuming)
        self._window = Window()
        self._ended = None
        self._checked, self._unchecked = set(), {}
        self._backlog.clear()
        self._paused = self._drain_scheduled = self._subscribed = False

    async def _subscribe(self, consuming: Wire, wire: Wire) -> None:
        try:
            await wire.exchange_exists(self.gate.marker)
        except ChannelClosed as exc:
            if exc.reply_code == 404:
                raise self.gate.refusal() from exc
            raise
        await consuming.open_channel(CONSUME_CHANNEL)
        consuming.readers[CONSUME_CHANNEL] = _Reader(self)
        qos = commands.Basic.Qos(prefetch_count=self.prefetch)
        await consuming.call(CONSUME_CHANNEL, qos, commands.Basic.QosOk)
        ok = await consuming.call(
            CONSUME_CHANNEL, commands.Basic.Consume(queue=self.queue), commands.Basic.ConsumeOk
        )
        self._tag = str(ok.consumer_tag)
        self._subscribed = True
        self.started.set()
        log.info("bridging %s (prefetch %d)", self.queue, self.prefetch)

    async def _close(self, consuming: Wire, wire: Wire) -> None:
        """Close both connections (the consuming one last: what it has unacked goes
        back to the queue then); drop one that cannot answer."""
        for one in (wire, consuming):
            if one.closed is not None:
                continue
            if self.hurry or one.blocked:  # a blocked broker reads no Connection.Close
                one.abort()
            else:
                await one.close(IO_JOIN_S)

    def _abandon(self, after: str) -> None:
        """A stop leaves what is in the window unconfirmed: counted, said (run raises)."""
        self.stats.abandoned += len(self._window)
        self.abandoned_after = after.replace(
            "its stop grace", f"its {self.stop_grace_s:g} s stop grace"
        )
        log.error(
            "bridge of %s stopping with %d deliveries unconfirmed after %s: left unacked, "
            "back in the queue",
            self.queue,
            len(self._window),
            self.abandoned_after,
        )

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
                self._publish(tag, *encoded)
        except (WireClosed, ChannelClosed) as exc:  # the publish channel is gone
            self.end(exc)
        except Exception as exc:  # delayq's own failure on this delivery: not the bridge's end
            log.exception("bridge of %s failed on delivery %d", self.queue, tag)
            self._window.discard(tag)
            self._reject(tag, f"delivery {tag}", _said(exc))

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
        self._window.settled(token, error)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            assert self._wire is not None
            self._wire.loop.call_soon(self._drain)

    def failed(self, token: int, exc: Exception) -> None:
        """Its channel or connection closed first: the connection is over (what is
        unacked goes back to the intake queue with it)."""
        error = channel_error(exc) if isinstance(exc, ChannelClosed) else exc
        self.end(error if isinstance(error, _FATAL) else Lost(str(exc)))

    def _drain(self) -> None:
        """Ack and nack the settled deliveries at the front of the window."""
        self._drain_scheduled = False
        done = self._window.ready()
        if not done or self._acks is None:
            return
        wire = self._acks.wire
        if wire.closed is not None or CONSUME_CHANNEL not in wire.readers:
            return  # their channel is gone: back in the queue already
        refused = acknowledge(self._acks, done, self.stats, self.queue, self.relay.dlq)
        if refused and not self._paused:
            self._paused = True
            wire.loop.call_later(REFUSED_PAUSE_S, self._resume, wire)
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
