"""The frame link: :class:`~delayq.aio.AsyncPublisher`'s I/O as AMQP frames written directly.

The default asyncio link for ``amqp://`` and ``amqps://`` (:data:`delayq.links.ASYNC_LINKS`).
It publishes on :mod:`delayq.aio._wire`, a small AMQP client of its own, with the
frames encoded by :mod:`delayq.message.frames`: no aio-pika message, no future, no task
per message. A batch (:mod:`delayq.aio._framebatch`) keeps up to ``window`` messages
unconfirmed and writes what one loop turn frees in one write.

What it keeps from the aio-pika link (:mod:`delayq.aio._link`): one connection shared
by concurrent sends, opened at the first use (every host of a multi-host URL in
turn, TLS for ``amqps://``) and again after a loss; the namespace's apply marker checked
once per connection; each exchange checked (passively) once per connection before
its first publish; a single send re-sent on a fresh connection up to
``publish_attempts`` times when its fate is unknown; ``PublishBlocked`` when the
broker blocks publishers past the confirm timeout. Topology is applied through
aio-pika (:func:`delayq.aio.apply_topology_async`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import parse_qs, unquote, urlsplit

from delayq.aio._framebatch import channel_error, send_batch
from delayq.aio._wire import PUBLISH_CHANNEL, ChannelClosed, Endpoint, Wire, WireClosed
from delayq.aio.provision import apply_topology_async
from delayq.errors import (
    AccessRefused,
    ConnectionFailed,
    ConnectionRejected,
    InvalidURL,
    PublisherInUse,
    TopologyMissing,
)
from delayq.links import LinkOptions
from delayq.message import outcomes
from delayq.message.envelope import OutgoingMessage
from delayq.message.frames import publish_frames
from delayq.retrying import CONNECT_BACKOFF_S, Reconnecting, Tries
from delayq.topology.marker import Gate
from delayq.topology.model import Topology
from delayq.topology.report import ApplyReport
from delayq.urls import BrokerURL, parse_url, redact, tried_hosts

__all__ = ["FrameLink", "endpoint_of", "open_wire"]

log = logging.getLogger("delayq.publisher")

CONNECT_TIMEOUT_S = 10.0


def endpoint_of(broker: BrokerURL, name: str) -> Endpoint:
    """Where one host of a checked URL points (credentials default to guest, vhost to /)."""
    parts = urlsplit(broker.client_url)
    tls = broker.tls
    host = parts.hostname or "localhost"
    heartbeat = parse_qs(parts.query).get("heartbeat")
    return Endpoint(
        host,
        parts.port or (5671 if tls is not None else 5672),
        unquote(parts.username) if parts.username is not None else "guest",
        unquote(parts.password) if parts.password is not None else "guest",
        unquote(parts.path[1:]) if len(parts.path) > 1 else "/",
        ssl_context=tls.context() if tls is not None else None,
        server_hostname=tls.server_hostname if tls is not None else None,
        heartbeat_s=int(heartbeat[0]) if heartbeat else None,
        name=name,
    )


async def open_wire(
    url: str,
    *,
    attempts: int,
    name: str,
    backoff_s: float = CONNECT_BACKOFF_S,
    within_s: float | None = None,
    publish: bool = True,
) -> Wire:
    """A connection to the first host of ``url`` that takes one, ``attempts`` rounds over
    them (given ``within_s``, rounds for that many seconds: :class:`delayq.retrying.Tries`);
    refused credentials, vhost or TLS fail at once (:class:`ConnectionRejected`).
    Without ``publish``, it has no publish channel (a consumer's). ``wire.url`` is the
    single-host URL it connected to."""
    broker = parse_url(url)
    last: BaseException | None = None
    tries = Tries(url, attempts=attempts, backoff_s=backoff_s, within_s=within_s)
    for pause_s, one in tries:
        if pause_s:
            await asyncio.sleep(pause_s)
        broker = parse_url(one)
        try:
            wire = await Wire.open(endpoint_of(broker, name), CONNECT_TIMEOUT_S, publish=publish)
            wire.url = one
            return wire
        except WireClosed as exc:
            if exc.reply_code == 403:
                raise ConnectionRejected(
                    f"broker at {redact(url)} refused the credentials (wrong user or password?)"
                ) from exc
            if exc.reply_code == 530:
                raise ConnectionRejected(
                    f"broker at {redact(url)} refused access to the vhost"
                ) from exc
            # Lost during the handshake: what the socket or TLS layer said, if anything.
            inner = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
            failure = broker.tls_failure(inner)
            if failure is not None:
                raise ConnectionRejected(failure) from inner
            last = inner
        except InvalidURL:
            raise
        except (OSError, asyncio.TimeoutError, ssl.SSLError, ChannelClosed) as exc:
            failure = broker.tls_failure(exc)
            if failure is not None:
                raise ConnectionRejected(failure) from exc
            last = exc
        except ValueError as exc:  # a URL the socket layer cannot use: not chained (it may show it)
            raise ConnectionFailed(
                f"cannot use broker URL {redact(url)}: {type(exc).__name__}"
            ) from None
    raise ConnectionFailed(
        f"cannot connect to the broker at {redact(url)} {tries.spent()}"
        f"{tried_hosts(url)} ({type(last).__name__}); {broker.unreachable_hint(last)}"
    ) from last


class _One:
    """The sink of one single send: a future of (acked, returned)."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[tuple[bool, bool]]) -> None:
        self.future = future

    def settled(self, token: int, acked: bool, returned: bool) -> None:
        if not self.future.done():
            self.future.set_result((acked, returned))

    def failed(self, token: int, exc: Exception) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class FrameLink:
    """An :class:`~delayq.links.AsyncLink` to RabbitMQ writing AMQP frames directly."""

    clock_ms: Callable[[], int] | None = None

    def __init__(self, url: str, gate: Gate, options: LinkOptions) -> None:
        self.url = url
        self.shown_url = redact(url)
        self._gate = gate
        self.publish_attempts = max(1, options.publish_attempts)
        self.reconnecting = Reconnecting(
            options.connect_attempts, CONNECT_BACKOFF_S, options.reconnect_within_s
        )
        self.backoff_s = options.retry_backoff_s
        self.confirm_timeout_s = options.confirm_timeout_s
        self.blocked_timeout_s = options.blocked_timeout_s
        self._deadlines = _Deadlines(
            options.confirm_timeout_s, options.blocked_timeout_s, self._blocked_at
        )
        self._wire: Wire | None = None
        self._checked: set[str] = set()
        self._opening: asyncio.Task[Wire] | None = None
        self._warned: Wire | None = None

    def __repr__(self) -> str:
        return f"FrameLink({self.shown_url!r})"

    async def connect(self) -> None:
        await self.wire()

    async def apply(self, topology: Topology, *, raise_on_conflict: bool = True) -> ApplyReport:
        return await apply_topology_async(topology, self.url, raise_on_conflict=raise_on_conflict)

    async def close(self) -> None:
        opening, self._opening = self._opening, None
        if opening is not None and not opening.done():
            opening.cancel()  # a connection it would open after this close: none
            with contextlib.suppress(BaseException):
                await opening
        wire, self._wire = self._wire, None
        if wire is None:
            return
        if wire.blocked or wire.loop is not asyncio.get_running_loop():
            _abandon(wire)  # a blocked broker reads no Connection.Close: do not wait for it
        else:
            await wire.close()

    # The connection ------------------------------------------------------------

    async def wire(self) -> Wire:
        """The open connection, opened (and its apply marker checked) if need be.

        One attempt for every publish that needs it: those that come while it runs wait
        for it and share its outcome, so a broker that is down fails each of them once
        ``reconnect_within`` has passed since the attempt began, not one such wait
        after another. A connection of another event loop that no longer runs (the
        publisher used under a new loop: a second ``asyncio.run``, a test client's) is
        left and a new one opened on this loop; one whose loop runs meanwhile (another
        thread's) is in use there: :class:`~delayq.errors.PublisherInUse`."""
        wire = self._wire
        loop = asyncio.get_running_loop()
        if wire is not None and wire.usable and wire.loop is loop:
            return wire
        opening = self._opening
        other = opening.get_loop() if opening is not None and not opening.done() else None
        if other is None and wire is not None and wire.closed is None:
            other = wire.loop
        if other is not None and other is not loop and other.is_running():
            raise PublisherInUse(
                f"this publisher's connection to {self.shown_url} belongs to another event "
                "loop, running in another thread now: a publisher serves one event loop at a "
                "time (two would resend each other's messages). Nothing was sent; create a "
                "publisher per thread or event loop"
            )
        if opening is None or opening.get_loop() is not loop:
            opening = self._opening = loop.create_task(self._open())
            opening.add_done_callback(self._opened)
        return await asyncio.shield(opening)

    def _opened(self, task: asyncio.Task[Wire]) -> None:
        if self._opening is task:
            self._opening = None
        if not task.cancelled():
            task.exception()  # retrieved here: its waiters may all have gone

    async def _open(self) -> Wire:
        wire, self._wire = self._wire, None
        if wire is not None:
            _abandon(wire)
        reconnecting = self.reconnecting
        wire = await open_wire(
            self.url,
            attempts=reconnecting.attempts,
            within_s=reconnecting.within_s if reconnecting.up else None,
            name="delayq-publisher",
        )
        reconnecting.up = True
        try:
            await wire.exchange_exists(self._gate.marker)
        except ChannelClosed as exc:
            wire.abort()
            if exc.reply_code == 404:
                raise self._gate.refusal() from exc
            raise channel_error(exc) from exc
        except BaseException:
            wire.abort()
            raise
        self._wire, self._checked = wire, set()
        return wire

    async def check_exchanges(self, wire: Wire, names: set[str]) -> None:
        """Check each of ``names`` exists, once per connection: a publish to a missing one
        would close the publish channel and leave every message in flight on it unknown.
        Raises ``TopologyMissing`` (or the channel's other error) or ``WireClosed``."""
        for name in sorted(names - self._checked):
            try:
                await wire.exchange_exists(name)
            except ChannelClosed as exc:
                raise channel_error(exc) from exc
            if wire is self._wire:
                self._checked.add(name)

    def drop(self, wire: Wire) -> None:
        """Abandon ``wire`` (what it has in flight fails to its sinks): no close handshake,
        which a blocked broker would not read."""
        if wire is self._wire:
            self._wire = None
        wire.abort()

    def warn_lost(self, wire: Wire, exc: BaseException, what: str) -> None:
        """Once per lost connection, not once per message in flight."""
        if wire is self._warned:
            return
        self._warned = wire
        log.warning("a publish connection was lost (%s); %s", _name(exc), what)

    # Sending -------------------------------------------------------------------

    async def send(self, msg: OutgoingMessage) -> None:
        last: BaseException | None = None
        handed_over = False  # once written to a socket, its fate is unknown until confirmed
        attempts = self.publish_attempts
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            wire = self._wire  # open, on this loop: no coroutine (a publish per request)
            if wire is None or not wire.usable or wire.loop is not asyncio.get_running_loop():
                try:
                    wire = await self.wire()
                except ConnectionFailed as exc:
                    if not handed_over:
                        raise  # never sent: the connect retries are spent, say so plainly
                    last = exc
                    break
            try:
                if msg.exchange not in self._checked:
                    await self.check_exchanges(wire, {msg.exchange})
                if not wire.writable:
                    await wire.drained()  # the socket takes writes (its buffer is bounded)
                loop = wire.loop
                future: asyncio.Future[tuple[bool, bool]] = loop.create_future()
                frames = publish_frames(msg, PUBLISH_CHANNEL, wire.frame_max)
                route = (msg.exchange, msg.routing_key, msg.message_id)
                wire.publish(frames, _One(future), 0, route)
                handed_over = True
                self._deadlines.watch(loop, future)
                acked, returned = await future
            except ChannelClosed as exc:  # the publish itself closed the channel
                error = channel_error(exc)
                if isinstance(error, (TopologyMissing, AccessRefused)):
                    raise error from exc
                raise outcomes.rejected(msg, str(error)) from exc
            except asyncio.TimeoutError as exc:
                self.drop(wire)
                if wire.blocked:  # re-sending cannot help while the broker blocks publishers
                    raise outcomes.blocked(msg, self.blocked_s(wire), self.shown_url) from exc
                last = exc
                self.warn_lost(wire, exc, f"attempt {attempt + 1} of {attempts}")
                continue
            except WireClosed as exc:
                last = exc
                self.warn_lost(wire, exc, f"attempt {attempt + 1} of {attempts}")
                continue
            if returned:
                raise outcomes.unroutable(msg)
            if not acked:
                raise outcomes.rejected(msg)
            return
        raise outcomes.unconfirmed(msg, attempt + 1, self.shown_url, last) from last

    async def send_batch(self, built: list[OutgoingMessage], window: int) -> None:
        await send_batch(self, built, window)

    def _blocked_at(self) -> float | None:
        wire = self._wire
        return None if wire is None else wire.blocked_at

    def blocked_s(self, wire: Wire) -> float:
        """How long ``wire`` has been blocked (the bound it was failed at)."""
        since = wire.blocked_at
        return self.blocked_timeout_s if since is None else time.monotonic() - since


class _Deadlines:
    """The confirm deadlines of a link's single sends, in the order they were sent (one
    timeout for all, so the oldest is due first): one timer for the link, looking at
    most every second, instead of ``asyncio.wait_for`` (a wrapper, a timer and callbacks
    per message). A send past its deadline sees ``asyncio.TimeoutError``."""

    SWEEP_S = 1.0

    def __init__(
        self,
        timeout_s: float,
        blocked_timeout_s: float = float("inf"),
        blocked_at: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.timeout_s = timeout_s
        self.blocked_timeout_s = blocked_timeout_s
        """A broker blocking publishers (a resource alarm) that long fails every send
        waiting on it, whatever its own deadline (``blocked_at``: since when, by
        ``time.monotonic()``, or ``None``)."""
        self._blocked_at = blocked_at
        self._queue: deque[tuple[float, asyncio.Future[tuple[bool, bool]]]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(
        self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[tuple[bool, bool]]
    ) -> None:
        if loop is not self._loop:  # a publisher used again under another event loop
            self._queue.clear()
            self._loop, self._timer = loop, None
        self._queue.append((loop.time() + self.timeout_s, future))
        if self._timer is None:
            self._timer = loop.call_later(min(self.timeout_s, self.SWEEP_S), self._sweep)

    def _sweep(self) -> None:
        loop, queue = self._loop, self._queue
        assert loop is not None
        self._timer = None
        now = loop.time()
        since = self._blocked_at()
        if since is not None and time.monotonic() - since >= self.blocked_timeout_s:
            while queue:  # blocked for good: every waiting send hears it
                _deadline, future = queue.popleft()
                if not future.done():
                    future.set_exception(asyncio.TimeoutError())
            return
        while queue:
            deadline, future = queue[0]
            if not future.done() and deadline > now:
                break
            queue.popleft()
            if not future.done():
                future.set_exception(asyncio.TimeoutError())
        if queue:
            wait_s = min(queue[0][0] - now, self.SWEEP_S)
            self._timer = loop.call_later(max(0.0, wait_s), self._sweep)


def _abandon(wire: Wire) -> None:
    """Drop ``wire`` with no close handshake. One of an event loop that no longer runs
    here is left to close with its socket (a publisher consumes nothing: the broker
    requeues nothing)."""
    if wire.loop is asyncio.get_running_loop():
        wire.abort()
        return
    with contextlib.suppress(Exception):
        if wire.transport is not None:
            wire.transport.abort()


def _name(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
