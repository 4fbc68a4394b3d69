"""The bridge's engine: an intake queue relayed into delayq's tiers on delayq's frame wire.

Two connections (:class:`~delayq.aio._wire.Wire`), one event loop, one thread: the intake
queue is consumed on one (its deliveries' frames put together by
:class:`~delayq.aio._deliveries.DeliveryFrames`), each delivery published on the other's
confirming channel as it arrives, up to ``prefetch`` unconfirmed, and acked once its
confirm came (:class:`~delayq.aio._relaying.Relaying`, the per-delivery half). This
module owns the connections: opened (the topology's apply marker checked), subscribed,
and closed.

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
from typing import Any

from pamqp import commands

from delayq.aio._bridgerecord import BridgeRecord
from delayq.aio._deliveries import DeliveryFrames
from delayq.aio._framebatch import channel_error
from delayq.aio._framelink import open_wire
from delayq.aio._relaying import FATAL, REFUSED_PAUSE_S, Lost, Relaying
from delayq.aio._wire import CONSUME_CHANNEL, ChannelClosed, Wire, WireClosed
from delayq.intake.bridging import IO_JOIN_S, BridgeStats
from delayq.intake.relay import Relay
from delayq.intake.window import Window
from delayq.links import gate_for
from delayq.topology.intakes import Intake
from delayq.topology.model import Topology

__all__ = ["REFUSED_PAUSE_S", "Lost", "WireBridge"]

log = logging.getLogger("delayq.bridge")


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


class WireBridge(Relaying):
    """One intake's bridge on one connection pair at a time (see the module). Its owner
    calls :meth:`serve` once per connection, and :meth:`stop` from the loop's thread."""

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
        record: BridgeRecord | None = None,
    ) -> None:
        super().__init__(Relay(topology, intake), stats, record)
        self.url = url
        self.prefetch = prefetch
        self.stop_grace_s = stop_grace_s
        self.started = started
        self.gate = gate_for(topology, url)
        self.hurry = False
        self.abandoned_after = ""
        """What ended the last stop with deliveries unconfirmed."""
        self._subscribed = False
        self._tag = ""

    @property
    def subscribed(self) -> bool:
        """Whether the last connection got as far as consuming (a reconnect after it is a
        fresh one: its back-off starts again)."""
        return self._subscribed

    # Control (the loop's thread) ----------------------------------------------------

    def stop(self, *, now: bool = False) -> None:
        """Take no more deliveries; settle those in flight for up to the grace (``now``:
        not even that)."""
        self.stopping = True
        self.hurry = self.hurry or now
        self._wake()

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
        consuming = await self._open(self.url, name, publish=False)
        if consuming is None:
            return  # stopped while connecting
        try:  # the same node, where a multi-host URL has several
            wire = await self._open(consuming.url or self.url, f"{name} publishing")
        except BaseException:
            consuming.abort()
            raise
        if wire is None:
            consuming.abort()
            return
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
            if isinstance(error, FATAL) or not self._subscribed:
                raise error from exc
            raise Lost(str(error)) from exc
        finally:
            if self.stopping and self._window:
                self._abandon(after)
            consuming.readers.pop(CONSUME_CHANNEL, None)
            self._window = Window()
            self._backlog.clear()
            self.drop_writes()  # what they held is back with the channel
            await self._close(consuming, wire)

    async def _open(self, url: str, name: str, *, publish: bool = True) -> Wire | None:
        """A connection to ``url`` (its connect attempts), or ``None``: a stop came first
        (a broker that does not answer must not hold a stop for its connect timeouts)."""
        opening = asyncio.ensure_future(open_wire(url, attempts=3, name=name, publish=publish))
        opening.add_done_callback(lambda _: self._wake())
        await self._until(lambda: opening.done() or self.stopping)
        if opening.done():
            return opening.result()
        opening.cancel()
        try:
            wire = await opening
        except BaseException:  # cancelled, or failed meanwhile: nothing to close
            return None
        wire.abort()  # opened meanwhile
        return None

    def _reset(self, consuming: Wire, wire: Wire) -> None:
        self.reset(consuming, wire)
        self._subscribed = False

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
