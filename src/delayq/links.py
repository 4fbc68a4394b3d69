"""The seam between a publisher and its broker: a *link*, chosen by URL scheme.

A :class:`~delayq.sync.Publisher` builds and checks messages, reports their
outcomes to observers, and hands them to its link, which does the I/O: a
confirmed send, a pipelined batch, a lazy stream. Which link serves a URL is
named in :data:`LINKS` / :data:`ASYNC_LINKS` by its import path, a string (as
kombu's transport aliases are), so this module and the adapters import no
broker client and no test double: the memory links in :mod:`delayq.testing`
are loaded only when a ``memory://`` URL asks for them.

Pass ``link=`` to a publisher to bring your own (httpx's ``transport=``): a link
that fails on purpose tests what your code does when the broker refuses.

>>> from delayq.links import LINKS
>>> LINKS["memory"]
'delayq.testing.links:MemoryLink'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from delayq.declarations import apply_marker
from delayq.errors import InvalidInput
from delayq.marker import Gate
from delayq.topology import Topology
from delayq.urls import redact

if TYPE_CHECKING:
    from delayq.envelope import OutgoingMessage
    from delayq.errors import PublishError
    from delayq.provisioning import ApplyReport

__all__ = [
    "ASYNC_LINKS",
    "LINKS",
    "AsyncLink",
    "Link",
    "LinkOptions",
    "Settle",
    "gate_for",
    "open_async_link",
    "open_link",
    "serves_amqp",
]

Settle = Callable[[int, "OutgoingMessage", "PublishError | None"], None]
"""``settle(index, message, error)``: a streamed message's outcome (``None``: confirmed)."""

LINKS: dict[str, str] = {
    "amqp": "delayq.sync._link:PikaLink",
    "amqps": "delayq.sync._link:PikaLink",
    "memory": "delayq.testing.links:MemoryLink",
}
"""The blocking link class for each URL scheme, by import path."""

ASYNC_LINKS: dict[str, str] = {
    "amqp": "delayq.aio._link:AioPikaLink",
    "amqps": "delayq.aio._link:AioPikaLink",
    "memory": "delayq.testing.links:AsyncMemoryLink",
}
"""The asyncio link class for each URL scheme, by import path."""


@dataclass(frozen=True, slots=True)
class LinkOptions:
    """A publisher's I/O knobs, handed to the link it opens."""

    publish_attempts: int = 3
    connect_attempts: int = 3
    retry_backoff_s: float = 0.2
    blocked_timeout_s: float = 30.0
    """How long the broker may block publishers (a resource alarm) before a publish fails."""
    confirm_timeout_s: float = 60.0
    """How long an asyncio publish waits for its confirm."""


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

    async def apply(self, topology: Topology, *, raise_on_conflict: bool = True) -> ApplyReport:
        ...

    async def close(self) -> None: ...


def gate_for(topology: Topology, url: str) -> Gate:
    """What a link to ``url`` checks before sending for ``topology`` (its apply marker)."""
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


def open_async_link(url: str, gate: Gate, options: LinkOptions) -> AsyncLink:
    """The asyncio link :data:`ASYNC_LINKS` names for ``url``'s scheme (no I/O yet)."""
    link: AsyncLink = _link_class(url, ASYNC_LINKS)(url, gate, options)
    return link
