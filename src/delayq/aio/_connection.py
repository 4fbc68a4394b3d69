"""aio-pika connections for the async adapter (their errors: :mod:`delayq.aio._errors`)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aio_pika
from aio_pika.abc import AbstractConnection

from delayq.aio._errors import connect_error
from delayq.errors import ConnectionFailed
from delayq.urls import connection_plan, parse_url, redact, tried_hosts

__all__ = ["close_quietly", "close_shielded", "connect", "is_blocked"]


async def connect(
    url: str,
    *,
    name: str = "delayq",
    attempts: int = 3,
    backoff_s: float = 0.25,
    timeout_s: float = 10.0,
    rng: random.Random | None = None,
) -> AbstractConnection:
    """Open a (non-robust) connection; delayq itself decides what to re-send on loss.

    A TLS failure (an untrusted certificate, a client certificate the broker
    wants) is not retried: it raises :class:`ConnectionFailed` saying what failed.
    Each of ``attempts`` rounds tries every host of ``url`` once, from a random
    start (:func:`delayq.urls.connection_plan`).
    """
    broker = parse_url(url)
    last: BaseException | None = None
    for pause_s, one in connection_plan(url, attempts=attempts, backoff_s=backoff_s, rng=rng):
        if pause_s:
            await asyncio.sleep(pause_s)
        broker = parse_url(one)
        context = broker.tls.context() if broker.tls is not None else None
        try:
            return await aio_pika.connect(
                broker.client_url,
                ssl_context=context,
                timeout=timeout_s,
                client_properties={"connection_name": name, "product": "delayq"},
            )
        except Exception as exc:
            failure = connect_error(exc, url, broker)
            if failure is not None:  # a bad URL's error may show the URL: not chained
                raise failure from (None if isinstance(exc, ValueError) else exc)
            last = exc  # e.g. a bare Exception: aiormq's for a handshake cut short
    raise ConnectionFailed(
        f"cannot connect to the broker at {redact(url)} after {attempts} attempts"
        f"{tried_hosts(url)} ({type(last).__name__}); {broker.unreachable_hint(last)}"
    ) from last


async def close_quietly(thing: Any) -> None:
    """Close a channel or connection, ignoring that it may be closed already."""
    try:
        if thing is not None and not thing.is_closed:
            await thing.close()
    except Exception:
        pass


CLOSE_TIMEOUT_S = 10.0
"""The longest a cancelled :func:`close_shielded` waits for the close it shields."""


async def close_shielded(thing: Any) -> None:
    """:func:`close_quietly`, which a cancel does not cut: the cancel waits for the close
    (up to :data:`CLOSE_TIMEOUT_S`), then is raised. aio-pika's close cut in the middle
    (in aiormq's, before the connection is marked closed) can wait in its ``finally``
    for a close callback that never comes: its task never ends, and ``asyncio.run``
    waits for it for good."""
    closing = asyncio.ensure_future(close_quietly(thing))
    try:
        await asyncio.shield(closing)
    except asyncio.CancelledError:
        await asyncio.wait((closing,), timeout=CLOSE_TIMEOUT_S)
        raise


def is_blocked(connection: AbstractConnection | None) -> bool:
    """Whether the broker has blocked this connection (``connection.blocked``: a memory or
    disk alarm). aiormq keeps that in a private event; if it cannot be read, False."""
    transport = getattr(connection, "transport", None)  # aio-pika's UnderlayConnection
    amqp = getattr(transport, "connection", None)  # aiormq's Connection
    unblocked = getattr(amqp, "_Connection__connection_unblocked", None)
    return isinstance(unblocked, asyncio.Event) and not unblocked.is_set()
