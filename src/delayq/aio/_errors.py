"""The async adapter's error map: the one place aio-pika's and aiormq's exceptions
become delayq errors.

Every other module of :mod:`delayq.aio` catches the exception groups named here
and asks this module what they mean; none imports ``aiormq.exceptions``. What an
error becomes:

* a channel the broker closed (``AMQPChannelError``) → :func:`channel_error`:
  ``TopologyMissing`` (404), ``TopologyConflict`` (406), ``AccessRefused`` (403),
  else ``BrokerError``;
* a connection that failed or was lost (:data:`CONNECTION_ERRORS`, and the bare
  ``Exception`` aiormq fails a handshake or a publish with when its connection
  closes) → ``ConnectionFailed`` (:func:`connect_error` says why a connect failed);
* a publish the broker did not take → :func:`publish_refusal` (``Unroutable``,
  ``PublishRejected``) or, when a fresh connection may succeed, nothing: the link
  re-sends.
"""

from __future__ import annotations

import asyncio

import aiormq.exceptions as aex

from delayq.errors import (
    AccessRefused,
    BrokerError,
    ConnectionFailed,
    ConnectionRejected,
    DelayqError,
    TopologyMissing,
)
from delayq.message import outcomes
from delayq.message.envelope import OutgoingMessage
from delayq.topology.conflicts import conflict_from_reply, missing_from_reply, refused_from_reply
from delayq.urls import BrokerURL, redact

__all__ = [
    "CHANNEL_CLOSED",
    "CONNECTION_ERRORS",
    "NOT_TAKEN",
    "channel_error",
    "connect_error",
    "is_missing",
    "publish_refusal",
]

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    aex.AMQPConnectionError,
    aex.ChannelInvalidStateError,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)
"""Errors after which the connection is gone and a fresh one may succeed."""

CHANNEL_CLOSED: type[Exception] = aex.AMQPChannelError
"""The broker closed the channel (a missing entity, a conflict, a refusal): see
:func:`channel_error`. The connection is still open."""

NOT_TAKEN: tuple[type[Exception], ...] = (aex.PublishError, aex.DeliveryError)
"""A confirmed publish the broker returned (no queue bound, with ``on_return_raises``)
or nacked: see :func:`publish_refusal`."""


def _reply_text(exc: BaseException) -> str:
    for arg in exc.args:
        text = getattr(arg, "reply_text", None)
        if isinstance(text, str):
            return text
    return " ".join(str(a) for a in exc.args)


def is_missing(exc: BaseException) -> bool:
    """Whether the broker closed the channel because an entity does not exist (404)."""
    return isinstance(exc, aex.ChannelNotFoundEntity)


def channel_error(exc: BaseException) -> DelayqError:
    """A delayq error for a channel the broker closed (404 missing, 406 conflict, ...)."""
    text = _reply_text(exc)
    found: DelayqError | None = (
        missing_from_reply(text) or conflict_from_reply(text) or refused_from_reply(text)
    )
    if found is not None:
        return found
    return BrokerError(f"the broker closed the channel: {text}")


def connect_error(exc: BaseException, url: str, broker: BrokerURL) -> DelayqError | None:
    """Why connecting to ``url`` failed for good (credentials, vhost, TLS, a URL the
    client cannot use), or ``None`` when another attempt may succeed."""
    if isinstance(exc, (aex.ProbableAuthenticationError, aex.AuthenticationError)):
        return ConnectionRejected(
            f"broker at {redact(url)} refused the credentials (wrong user or password?)"
        )
    if isinstance(exc, aex.ChannelAccessRefused):
        return ConnectionRejected(f"broker at {redact(url)} refused access to the vhost")
    if isinstance(exc, CONNECTION_ERRORS):
        failure = broker.tls_failure(exc)
        return ConnectionRejected(failure) if failure is not None else None
    if isinstance(exc, ValueError):
        return ConnectionFailed(f"cannot use broker URL {redact(url)}: {type(exc).__name__}")
    return None  # aiormq fails a handshake cut short with a bare Exception


def publish_refusal(exc: BaseException, msg: OutgoingMessage) -> DelayqError | None:
    """What a failed publish of ``msg`` means when re-sending cannot help (returned,
    nacked, refused by the broker), or ``None`` when a fresh connection may succeed."""
    if isinstance(exc, aex.PublishError):  # a Basic.Return, with on_return_raises
        return outcomes.unroutable(msg)
    if isinstance(exc, aex.DeliveryError):  # a Basic.Nack
        return outcomes.rejected(msg)
    if isinstance(exc, aex.AMQPChannelError):
        error = channel_error(exc)
        if isinstance(error, (TopologyMissing, AccessRefused)):
            return error
        return outcomes.rejected(msg, str(error))
    return None
