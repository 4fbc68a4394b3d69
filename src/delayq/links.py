"""The seams between delayq and its broker: *links* and *feeds*, chosen by URL scheme.

A :class:`~delayq.sync.Publisher` builds and checks messages, reports their
outcomes to observers, and hands them to its link, which does the I/O: a
confirmed send, a pipelined batch, a lazy stream. Which link serves a URL is
named in :data:`LINKS` / :data:`ASYNC_LINKS` by its import path, a string (as
kombu's transport aliases are), so this module and the adapters import no
broker client and no test double: the memory links in :mod:`delayq.testing`
are loaded only when a ``memory://`` URL asks for them.

Pass ``link=`` to a publisher to bring your own (httpx's ``transport=``): a link
that fails on purpose tests what your code does when the broker refuses.

A consumer's deliveries come from a *feed* (:data:`FEEDS` / :data:`ASYNC_FEEDS`):
it subscribes, hands each delivery over with a :class:`Settler` (or, for the
asyncio consumer, an ``aio._acks.Settleable``) that acks or requeues it where it
came from, and reports a lost connection as :class:`FeedLost`. An *inline* feed
(the memory broker's) delivers in the caller's thread when the broker runs, and
the consumer runs the handler right there.

>>> from delayq.links import LINKS
>>> LINKS["memory"]
'delayq.testing.links:MemoryLink'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from delayq.errors import InvalidInput
from delayq.message.limits import FRAME_MAX
from delayq.retrying import DEFAULT_RECONNECT_WITHIN_S
from delayq.topology.declarations import apply_marker
from delayq.topology.marker import Gate
from delayq.topology.model import Topology
from delayq.urls import check_vhost, redact

if TYPE_CHECKING:
    from delayq.consume.delivery import Delivery
    from delayq.errors import PublishError
    from delayq.message.envelope import OutgoingMessage
    from delayq.topology.report import ApplyReport

__all__ = [
    "ASYNC_FEEDS",
    "ASYNC_LINKS",
    "FEEDS",
    "LINKS",
    "AsyncFeed",
    "AsyncLink",
    "AsyncOnDelivery",
    "Feed",
    "FeedLost",
    "Link",
    "LinkOptions",
    "OnDelivery",
    "Settle",
    "SettleGuard",
    "Settleable",
    "Settler",
    "gate_for",
    "open_async_feed",
    "open_async_link",
    "open_feed",
    "open_link",
    "serves_amqp",
]

Settle = Callable[[int, "OutgoingMessage", "PublishError | None"], None]
"""``settle(index, message, error)``: a streamed message's outcome (``None``: confirmed)."""


class SettleGuard:
    """A stream's ``settle`` whose first exception ends the stream cleanly: nothing more
    is pulled, what is in flight still settles (told to ``settle``; a later exception is
    dropped), and :meth:`raise_first` raises it once the send returned. Raised inside the
    I/O path, it had ended the connection, and the stream was sent again: duplicates."""

    def __init__(self, settle: Settle) -> None:
        self._settle = settle
        self.error: Exception | None = None

    def __call__(self, index: int, msg: OutgoingMessage, error: PublishError | None) -> None:
        try:
            self._settle(index, msg, error)
        except Exception as exc:
            if self.error is None:
                self.error = exc

    def pulling(self, messages: Iterable[OutgoingMessage]) -> Iterator[OutgoingMessage]:
        for msg in messages:
            if self.error is not None:
                return
            yield msg

    def raise_first(self) -> None:
        if self.error is not None:
            raise self.error


LINKS: dict[str, str] = {
    "amqp": "delayq.sync._link:PikaLink",
    "amqps": "delayq.sync._link:PikaLink",
    "memory": "delayq.testing.links:MemoryLink",
}
"""The blocking link class for each URL scheme, by import path."""

ASYNC_LINKS: dict[str, str] = {
    "amqp": "delayq.aio._framelink:FrameLink",
    "amqps": "delayq.aio._framelink:FrameLink",
    "memory": "delayq.testing.links:AsyncMemoryLink",
}
"""The asyncio link class for each URL scheme, by import path."""


FEEDS: dict[str, str] = {
    "amqp": "delayq.sync._feed:PikaFeed",
    "amqps": "delayq.sync._feed:PikaFeed",
    "memory": "delayq.testing.links:MemoryFeed",
}
"""The blocking consumer's feed class for each URL scheme, by import path."""

ASYNC_FEEDS: dict[str, str] = {
    "amqp": "delayq.aio._framefeed:FrameFeed",
    "amqps": "delayq.aio._framefeed:FrameFeed",
    "memory": "delayq.testing.links:AsyncMemoryFeed",
}
"""The asyncio consumer's feed class for each URL scheme, by import path."""


class FeedLost(Exception):
    """The feed lost its broker (connection or channel closed, consumer cancelled,
    deliveries stalled): the consumer opens it again. Never leaves a consumer."""


class Settler(Protocol):
    """Where a delivery came from, and how it is settled there."""

    @property
    def current(self) -> bool:
        """Whether it can still be settled there (its channel is the feed's channel)."""
        ...

    def ack(self) -> None: ...

    def requeue(self) -> None: ...


OnDelivery = Callable[["Settler", "Delivery"], None]
"""What a feed calls with each delivery."""


class Settleable(Protocol):
    """A delivery as the asyncio consumer settles it (its acks are coalesced by tag):
    aio-pika's incoming message, or the memory broker's handle on one."""

    @property
    def delivery_tag(self) -> int | None: ...

    async def ack(self, multiple: bool = False) -> None: ...

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        """Return (``requeue``) or drop the delivery; one delivery alone goes back with a
        ``basic.reject``, which RabbitMQ 4.3 counts toward a quorum queue's delivery limit
        (a ``basic.nack`` it does not, so a message that always comes back would cycle for
        ever; earlier releases count both)."""
        ...


AsyncOnDelivery = Callable[[Settleable, "Delivery"], Coroutine[Any, Any, None]]
"""What an asyncio feed awaits (or runs as a task) with each delivery."""


@runtime_checkable
class Feed(Protocol):
    """Where a blocking consumer's deliveries come from. Errors: delayq errors at
    :meth:`open` (``ConnectionFailed``, ``AccessRefused``, ``TopologyMissing``);
    :class:`FeedLost` from any call once open, ``AccessRefused`` if consuming is refused."""

    inline: bool
    """Deliveries arrive in the caller's thread while the broker runs (no :meth:`pump`)."""
    clock_ms: Callable[[], int] | None

    @property
    def consuming(self) -> bool:
        """Whether the broker may still deliver to it: ``False`` from the moment the
        broker confirmed :meth:`unsubscribe` (or before :meth:`open`)."""
        ...

    def open(self, topology: Topology, queue: str, prefetch: int, on_delivery: OnDelivery) -> None:
        """Connect, make sure ``topology`` exists, and subscribe to ``queue``."""
        ...

    def resubscribe(self, prefetch: int) -> None:
        """Subscribe again with another prefetch (deliveries in hand stay settleable)."""
        ...

    def pump(self, time_limit_s: float) -> None:
        """Hand over what arrives within ``time_limit_s`` (and keep heartbeats flowing)."""
        ...

    def unsubscribe(self) -> None: ...

    def ready(self) -> int:
        """How many messages wait in the queue, ready (a stall probe)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait, keeping the connection alive."""
        ...

    def wake(self) -> None:
        """From another thread: make :meth:`pump` return soon."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncFeed(Protocol):
    """Where an asyncio consumer's deliveries come from: each is awaited in a task of
    its own; a lost connection or cancelled consumer is reported through ``on_lost``
    (once open, other calls raise :class:`FeedLost`)."""

    inline: bool
    """The broker delivers while it runs (``await broker.advance_async``)."""
    clock_ms: Callable[[], int] | None

    @property
    def consuming(self) -> bool:
        """Whether the broker may still deliver to it (see :attr:`Feed.consuming`)."""
        ...

    async def open(
        self,
        topology: Topology,
        queue: str,
        prefetch: int,
        on_delivery: AsyncOnDelivery,
        on_lost: Callable[[BaseException], None],
    ) -> None: ...

    async def resubscribe(self, prefetch: int) -> None: ...

    async def unsubscribe(self) -> None: ...

    async def ready(self) -> int: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LinkOptions:
    """A publisher's I/O knobs, handed to the link it opens."""

    publish_attempts: int = 3
    connect_attempts: int = 3
    """Rounds over the URL's hosts for a first connection (see :mod:`delayq.retrying`)."""
    reconnect_within_s: float | None = DEFAULT_RECONNECT_WITHIN_S
    """How long a link that has been up keeps trying to reach its broker again
    (``None``: ``connect_attempts`` rounds, as a first connection)."""
    retry_backoff_s: float = 0.2
    blocked_timeout_s: float = 30.0
    """How long the broker may block publishers (a resource alarm) before a publish fails."""
    confirm_timeout_s: float = 60.0
    """How long an asyncio publish waits for its confirm."""
    max_in_flight_bytes: int = 64 * 1024 * 1024
    frame_max: int = FRAME_MAX
    """The topology's ``limits.frame_max``, which messages were checked against when built:
    a connection that negotiates less checks each content header before sending it."""
    """The most a stream keeps sent and unconfirmed, in bytes (:mod:`delayq.message.inflight`)."""


@runtime_checkable
class Link(Protocol):
    """A blocking publisher's broker. Every method raises delayq errors only.

    ``clock_ms`` is the broker's own clock when it keeps one (a memory broker's
    virtual time), which a publisher given no clock builds messages with; else ``None``.
    """

    clock_ms: Callable[[], int] | None

    def connect(self) -> None:
        """Open the connection now (and refuse a namespace whose apply did not complete)."""
        ...

    def send(self, msg: OutgoingMessage) -> None:
        """Send ``msg`` and wait for its confirm (the ``PublishError`` family if refused)."""
        ...

    def send_batch(self, msgs: list[OutgoingMessage], window: int) -> None:
        """Send with up to ``window`` unconfirmed; raise ``PublishBatchError`` naming
        each message not confirmed."""
        ...

    def send_stream(self, msgs: Iterable[OutgoingMessage], settle: Settle, window: int) -> None:
        """Send lazily, up to ``window`` unconfirmed, calling ``settle`` once per message."""
        ...

    def apply(self, topology: Topology, *, raise_on_conflict: bool = True) -> ApplyReport:
        """Declare ``topology`` (see :func:`delayq.sync.apply_topology`)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncLink(Protocol):
    """An asyncio publisher's broker: :class:`Link`'s calls as coroutines (no stream)."""

    clock_ms: Callable[[], int] | None

    async def connect(self) -> None: ...

    async def send(self, msg: OutgoingMessage) -> None: ...

    async def send_batch(self, msgs: list[OutgoingMessage], window: int) -> None: ...

    async def apply(self, topology: Topology, *, raise_on_conflict: bool = True) -> ApplyReport: ...

    async def close(self) -> None: ...


def gate_for(topology: Topology, url: str) -> Gate:
    """What a link to ``url`` checks before sending for ``topology`` (its apply marker).

    :raises InvalidInput: the topology names another vhost than the URL's.
    """
    check_vhost(topology.declared_vhost, url)
    return Gate(topology.namespace, apply_marker(topology).name, redact(url))


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower() if "://" in url else ""


def serves_amqp(url: str) -> bool:
    """Whether ``url`` is served by the AMQP links (its scheme names no other link)."""
    return LINKS.get(_scheme(url), LINKS["amqp"]) == LINKS["amqp"]


def _link_class(url: str, registry: dict[str, str]) -> type:
    scheme = _scheme(url)
    # An unknown scheme goes to the AMQP link, whose URL check names what is wrong.
    path = registry.get(scheme, registry["amqp"])
    module_name, _, name = path.partition(":")
    try:
        cls: type = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise InvalidInput(
            f"the link {path!r} for {scheme}:// URLs cannot be loaded: {exc}"
        ) from exc
    return cls


def open_link(url: str, gate: Gate, options: LinkOptions) -> Link:
    """The blocking link :data:`LINKS` names for ``url``'s scheme (no I/O yet)."""
    link: Link = _link_class(url, LINKS)(url, gate, options)
    return link


def open_feed(url: str) -> Feed:
    """The blocking feed :data:`FEEDS` names for ``url``'s scheme (no I/O yet)."""
    feed: Feed = _link_class(url, FEEDS)(url)
    return feed


def open_async_feed(url: str) -> AsyncFeed:
    """The asyncio feed :data:`ASYNC_FEEDS` names for ``url``'s scheme (no I/O yet)."""
    feed: AsyncFeed = _link_class(url, ASYNC_FEEDS)(url)
    return feed


def open_async_link(url: str, gate: Gate, options: LinkOptions) -> AsyncLink:
    """The asyncio link :data:`ASYNC_LINKS` names for ``url``'s scheme (no I/O yet)."""
    link: AsyncLink = _link_class(url, ASYNC_LINKS)(url, gate, options)
    return link
