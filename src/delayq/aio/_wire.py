"""A small AMQP 0-9-1 client on asyncio and pamqp: the wire of the frame link and feed.

It does what a confirming publisher and a consumer need and nothing else: the
handshake (PLAIN), heartbeats, one confirming channel for publishes and one for
passive declares (a refused declare closes only that channel), ``Basic.Ack``/``Nack``
(``multiple`` too), ``Basic.Return``, ``Connection.Blocked``/``Unblocked``, and the
broker closing a channel or the connection. A publish is frames already encoded
(:mod:`delayq.message.frames`) and a *sink* that hears its fate; the frames of one
loop turn go to the socket in one write. A channel with a :class:`ChannelReader`
(the frame feed's consumer, :mod:`delayq.aio._framefeed`) gets its deliveries'
frames as bytes, undecoded, and hears when the broker cancels its consumer or
closes it. The framing (reading and writing frames, heartbeats, the transport's
flow control) is :mod:`delayq.aio._framing`'s.

No per-message future or task: confirms are looked up by delivery tag in a dict
and handed to the sink's callbacks. Its errors are its own (:class:`WireClosed`,
:class:`ChannelClosed`); the frame link turns them into delayq errors.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pamqp import body, commands, constants, header, heartbeat

from delayq.aio._confirms import Confirms, Route, Sink
from delayq.aio._framing import ChannelReader, Framing, WireClosed

__all__ = [
    "CONSUME_CHANNEL",
    "PUBLISH_CHANNEL",
    "ChannelClosed",
    "ChannelReader",
    "Endpoint",
    "Wire",
    "WireClosed",
    "negotiated_heartbeat",
]

PUBLISH_CHANNEL = 1
PROBE_CHANNEL = 2
CONSUME_CHANNEL = 3


class ChannelClosed(Exception):
    """The broker closed a channel (404 not found, 406 conflict, 403 refused, ...)."""

    def __init__(self, reply_code: int, reply_text: str) -> None:
        super().__init__(f"{reply_code} {reply_text}")
        self.reply_code = reply_code
        self.reply_text = reply_text


def negotiated_heartbeat(offered: int, wanted: int | None) -> int:
    """The heartbeat interval (s) to send in Tune-Ok, as pika negotiates it: ``wanted`` 0
    (``?heartbeat=0``) turns heartbeats off whatever the broker offers; ``None`` asks
    for 60 s; otherwise the smaller of the two, or the one that is not 0."""
    if wanted == 0:
        return 0
    asked = 60 if wanted is None else wanted
    return min(offered, asked) if offered else asked


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect: one host of a URL, its credentials and TLS."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    vhost: str
    ssl_context: ssl.SSLContext | None = None
    server_hostname: str | None = None
    heartbeat_s: int | None = None
    name: str = "delayq"


class Wire(Framing):
    """One AMQP connection with a confirming publish channel. Open with :meth:`open`."""

    def __init__(self) -> None:
        super().__init__()
        self.frame_max = constants.FRAME_MAX_SIZE
        self.url = ""
        """The single-host URL this connection went to (set by whoever opened it)."""
        self.blocked = False
        self.blocked_at: float | None = None
        """When the broker blocked this connection (``time.monotonic()``), while it does."""
        self.on_close: list[Callable[[Exception], None]] = []
        self.publishing: ChannelClosed | None = None
        """Why the publish channel closed (``None`` while open)."""
        self._waiters: dict[int, deque[tuple[tuple[type, ...], asyncio.Future[Any]]]] = {}
        self._open_channels: set[int] = set()
        self.confirms = Confirms()
        self._return: list[Any] | None = None  # a Basic.Return being read: [method, bytes left]

    # Opening -----------------------------------------------------------------

    @classmethod
    async def open(cls, endpoint: Endpoint, timeout_s: float, *, publish: bool = True) -> Wire:
        """Connect, shake hands, open the publish channel in confirm mode (if ``publish``)."""
        loop = asyncio.get_running_loop()
        wire = cls()

        async def handshake() -> None:
            await loop.create_connection(
                lambda: wire,
                endpoint.host,
                endpoint.port,
                ssl=endpoint.ssl_context,
                server_hostname=(endpoint.server_hostname or endpoint.host)
                if endpoint.ssl_context is not None
                else None,
            )
            await wire._handshake(endpoint, publish)

        try:
            await asyncio.wait_for(handshake(), timeout_s)
        except BaseException:
            wire.abort()
            raise
        return wire

    async def _handshake(self, endpoint: Endpoint, publish: bool) -> None:
        start = self._expect(0, commands.Connection.Start)
        self._write(header.ProtocolHeader().marshal())
        await start
        tune_wait = self._expect(0, commands.Connection.Tune)
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties={
                    "product": "delayq",
                    "connection_name": endpoint.name,
                    "capabilities": {
                        "publisher_confirms": True,
                        "basic.nack": True,
                        "connection.blocked": True,
                        "authentication_failure_close": True,
                        "consumer_cancel_notify": True,
                    },
                },
                mechanism="PLAIN",
                response=f"\0{endpoint.user}\0{endpoint.password}",
                locale="en_US",
            ),
        )
        tune: commands.Connection.Tune = await tune_wait
        self.frame_max = tune.frame_max or constants.FRAME_MAX_SIZE
        self._heartbeat_s = negotiated_heartbeat(tune.heartbeat, endpoint.heartbeat_s)
        self.send(
            0,
            commands.Connection.TuneOk(
                channel_max=tune.channel_max or 2047,
                frame_max=self.frame_max,
                heartbeat=self._heartbeat_s,
            ),
        )
        await self.call(
            0, commands.Connection.Open(virtual_host=endpoint.vhost), commands.Connection.OpenOk
        )
        if self._heartbeat_s:
            self._timer = self.loop.call_later(self._heartbeat_s / 2, self._beat)
        if not publish:
            self.publishing = ChannelClosed(0, "this connection does not publish")
            return
        await self.open_channel(PUBLISH_CHANNEL)
        await self.call(PUBLISH_CHANNEL, commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.publishing = None

    async def open_channel(self, channel: int) -> None:
        await self.call(channel, commands.Channel.Open(), commands.Channel.OpenOk)
        self._open_channels.add(channel)

    # Calls -------------------------------------------------------------------

    def _expect(self, channel: int, *kinds: type) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = self.loop.create_future()
        if self.closed is not None:
            future.set_exception(self.closed)
        else:
            self._waiters.setdefault(channel, deque()).append((kinds, future))
        return future

    async def call(self, channel: int, method: Any, *replies: type) -> Any:
        """Send ``method`` on ``channel`` and wait for one of ``replies``: raises
        :class:`ChannelClosed` if the broker closes the channel instead,
        :class:`WireClosed` if the connection goes."""
        reply = self._expect(channel, *replies)
        try:
            self.send(channel, method)
        except BaseException:
            reply.cancel()
            raise
        return await reply

    async def exchange_exists(self, name: str) -> None:
        """A passive declare on the probe channel: raises :class:`ChannelClosed` (404) if
        ``name`` does not exist (that channel is opened again at the next call)."""
        if PROBE_CHANNEL not in self._open_channels:
            await self.open_channel(PROBE_CHANNEL)
        await self.call(
            PROBE_CHANNEL,
            commands.Exchange.Declare(exchange=name, passive=True),
            commands.Exchange.DeclareOk,
        )

    async def queue_depth(self, name: str) -> int:
        """Messages ready in queue ``name`` (a passive declare on the probe channel:
        :class:`ChannelClosed` 404 if it does not exist)."""
        if PROBE_CHANNEL not in self._open_channels:
            await self.open_channel(PROBE_CHANNEL)
        ok = await self.call(
            PROBE_CHANNEL,
            commands.Queue.Declare(queue=name, passive=True),
            commands.Queue.DeclareOk,
        )
        return int(ok.message_count or 0)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Close politely (``Connection.Close``, waiting up to ``timeout_s`` for its answer)."""
        if self.closed is not None or self.transport is None:
            return
        try:
            await asyncio.wait_for(
                self.call(
                    0,
                    commands.Connection.Close(
                        reply_code=200, reply_text="bye", class_id=0, method_id=0
                    ),
                    commands.Connection.CloseOk,
                ),
                timeout_s,
            )
        except asyncio.CancelledError:
            self.abort()  # dropped all the same, then the cancel goes on: not swallowed
            raise
        except Exception:
            pass
        self.abort()

    def abort(self) -> None:
        """Drop the connection at once (a blocked broker reads no ``Connection.Close``)."""
        if self.transport is not None:
            self.transport.abort()
        self._lost(WireClosed(0, "closed by the client"))

    # Publishing --------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Open, with its publish channel open."""
        return self.closed is None and self.publishing is None

    def publish(self, frames: bytes, sink: Sink, token: int, route: Route) -> None:
        """Queue one message's frames (``route``: its exchange, routing key and message id);
        they are written at the end of this loop turn.
        Raises :class:`WireClosed` / :class:`ChannelClosed` if it cannot be sent."""
        if self.closed is not None:
            raise self.closed
        if self.publishing is not None:
            raise self.publishing
        self.confirms.add(sink, token, route)
        self.send_frames(frames)

    @property
    def unconfirmed(self) -> int:
        return len(self.confirms.pending)

    # Incoming frames ---------------------------------------------------------

    def _confirmed(self, tag: int, multiple: bool, acked: bool) -> None:
        self.confirms.confirm(tag, multiple, acked)

    def _dispatch(self, channel: int, value: Any) -> None:
        kind = type(value)
        if kind is commands.Basic.Ack:
            self.confirms.confirm(value.delivery_tag, value.multiple, True)
        elif kind is commands.Basic.Nack:
            self.confirms.confirm(value.delivery_tag, value.multiple, False)
        elif self._return is not None and kind is header.ContentHeader:
            self._return_header(value)
        elif self._return is not None and kind is body.ContentBody:
            self._return[1] -= len(value.value)
            if self._return[1] <= 0:
                self._return = None
        elif kind is commands.Basic.Return:
            self._return = [value, 0]
        elif kind is commands.Basic.Cancel and channel in self.readers:  # the broker's
            self.readers[channel].cancelled(value.consumer_tag)
        elif kind is heartbeat.Heartbeat:
            pass
        elif kind is commands.Connection.Blocked:
            if not self.blocked:
                self.blocked, self.blocked_at = True, time.monotonic()
        elif kind is commands.Connection.Unblocked:
            self.blocked, self.blocked_at = False, None
        elif kind is commands.Connection.Close:
            self.send(0, commands.Connection.CloseOk())
            self._lost(WireClosed(value.reply_code, value.reply_text))
            if self.transport is not None:
                self.transport.close()
        elif kind is commands.Channel.Close:
            self.send(channel, commands.Channel.CloseOk())
            self._channel_closed(channel, ChannelClosed(value.reply_code, value.reply_text))
        else:
            waiting = self._waiters.get(channel)
            while waiting:
                kinds, future = waiting.popleft()
                if future.done():
                    continue
                if isinstance(value, kinds):
                    future.set_result(value)
                else:
                    future.set_exception(WireClosed(0, f"unexpected {value.name} on {channel}"))
                break

    def _return_header(self, value: header.ContentHeader) -> None:
        assert self._return is not None
        method = self._return[0]
        self._return[1] = value.body_size
        if not value.body_size:
            self._return = None
        message_id = value.properties.message_id or ""
        self.confirms.returned((method.exchange, method.routing_key, message_id))

    def _channel_closed(self, channel: int, exc: ChannelClosed) -> None:
        self._open_channels.discard(channel)
        for _, future in self._waiters.pop(channel, ()):
            if not future.done():
                future.set_exception(exc)
        reader = self.readers.pop(channel, None)
        if reader is not None:
            reader.closed(exc)
        if channel == PUBLISH_CHANNEL:
            self.publishing = exc
            self.confirms.fail_all(exc)

    def _on_lost(self, exc: WireClosed) -> None:
        waiters, self._waiters = self._waiters, {}
        for queue in waiters.values():
            for _, future in queue:
                if not future.done():
                    future.set_exception(exc)
        self.confirms.fail_all(exc)
        for hook in self.on_close:
            hook(exc)
