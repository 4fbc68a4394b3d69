"""aio-pika connections for the async adapter, and the one place aiormq errors are translated."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aio_pika
import aiormq.exceptions as aex
from aio_pika.abc import AbstractConnection

from delayq.conflicts import conflict_from_reply, missing_from_reply, refused_from_reply
from delayq.errors import BrokerError, ConnectionFailed, DelayqError
from delayq.urls import connection_plan, parse_url, redact, tried_hosts

__all__ = [
    "CONNECTION_ERRORS",
    "close_quietly",
    "connect",
    "is_blocked",
    "translate_channel_error",
]

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    aex.AMQPConnectionError,
    aex.ChannelInvalidStateError,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)
"""Errors after which the connection is gone and a fresh one may succeed."""


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
        except (aex.ProbableAuthenticationError, aex.AuthenticationError) as exc:
            raise ConnectionFailed(
                f"broker at {redact(url)} refused the credentials (wrong user or password?)"
            ) from exc
        except aex.ChannelAccessRefused as exc:
            raise ConnectionFailed(f"broker at {redact(url)} refused access to the vhost") from exc
        except CONNECTION_ERRORS as exc:
            failure = broker.tls_failure(exc)
            if failure is not None:
                raise ConnectionFailed(failure) from exc
            last = exc
        except ValueError as exc:
            raise ConnectionFailed(
                f"cannot use broker URL {redact(url)}: {type(exc).__name__}"
            ) from None
        except Exception as exc:  # aiormq fails a handshake cut short with a bare Exception
            last = exc
    raise ConnectionFailed(
        f"cannot connect to the broker at {redact(url)} after {attempts} attempts"
        f"{tried_hosts(url)} ({type(last).__name__}); {broker.unreachable_hint(last)}"
    ) from last


def _reply_text(exc: aex.AMQPChannelError) -> str:
    for arg in exc.args:
        text = getattr(arg, "reply_text", None)
        if isinstance(text, str):
            return text
    return " ".join(str(a) for a in exc.args)


def translate_channel_error(exc: aex.AMQPChannelError) -> DelayqError:
    """A delayq error for a channel the broker closed (404 missing, 406 conflict, ...)."""
    text = _reply_text(exc)
    found: DelayqError | None = (
        missing_from_reply(text) or conflict_from_reply(text) or refused_from_reply(text)
    )
    if found is not None:
        return found
    return BrokerError(f"the broker closed the channel: {text}")


async def close_quietly(thing: Any) -> None:
    """Close a channel or connection, ignoring that it may be closed already."""
    try:
        if thing is not None and not thing.is_closed:
            await thing.close()
    except Exception:
        pass


def is_blocked(connection: AbstractConnection | None) -> bool:
    """Whether the broker has blocked this connection (``connection.blocked``: a memory or
    disk alarm). aiormq keeps that in a private event; if it cannot be read, False."""
    transport = getattr(connection, "transport", None)  # aio-pika's UnderlayConnection
    amqp = getattr(transport, "connection", None)  # aiormq's Connection
    unblocked = getattr(amqp, "_Connection__connection_unblocked", None)
    return isinstance(unblocked, asyncio.Event) and not unblocked.is_set()
