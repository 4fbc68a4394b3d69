"""The sync adapter's error map: the one place pika's exceptions become delayq errors.

Every other module of :mod:`delayq.sync` (and :mod:`delayq.spark`) catches the
exception groups named here and asks this module what they mean; none imports
``pika.exceptions``. What an error becomes:

* a channel the broker closed (``ChannelClosedByBroker``) → :func:`channel_error`:
  ``TopologyMissing`` (404), ``TopologyConflict`` (406), ``AccessRefused`` (403),
  else ``BrokerError``;
* a connection that failed or was lost (:data:`CONNECTION_ERRORS`) →
  ``ConnectionFailed`` (:func:`connect_error` says why a connect failed; a
  lost connection is worded by what was being done);
* a publish the broker did not take → :func:`publish_refusal` (``Unroutable``,
  ``PublishRejected``, ``PublishBlocked``) or, when a fresh channel may succeed,
  nothing: the link re-sends;
* anything an open feed raises → :func:`feed_lost` (``FeedLost``: open it again).
"""

from __future__ import annotations

import pika.exceptions as pex

from delayq.errors import (
    AccessRefused,
    BrokerError,
    ConnectionRejected,
    DelayqError,
    TopologyMissing,
)
from delayq.links import FeedLost
from delayq.message import outcomes
from delayq.message.envelope import OutgoingMessage
from delayq.topology.conflicts import conflict_from_reply, missing_from_reply, refused_from_reply
from delayq.urls import BrokerURL, redact

__all__ = [
    "CHANNEL_CLOSED",
    "CHANNEL_GONE",
    "CLIENT_ERRORS",
    "CONNECTION_ERRORS",
    "LOST",
    "NOT_TAKEN",
    "ConnectionAbandoned",
    "channel_error",
    "closed_by_broker",
    "connect_error",
    "connection_lost",
    "feed_lost",
    "is_missing",
    "publish_refusal",
]

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    pex.AMQPConnectionError,
    pex.ConnectionClosed,
    pex.StreamLostError,
    pex.ConnectionWrongStateError,
    ConnectionError,
    OSError,
)
"""Errors after which the connection is gone and a fresh one may succeed."""

class ConnectionAbandoned(pex.AMQPConnectionError):  # type: ignore[misc]
    """delayq tore a connection down on purpose (a stream whose owner stopped waiting)."""


CHANNEL_CLOSED: type[Exception] = pex.ChannelClosedByBroker
"""The broker closed the channel (a missing entity, a conflict, a refusal): see
:func:`channel_error`. The connection is still open."""

CHANNEL_GONE: tuple[type[BaseException], ...] = (pex.ChannelClosed, pex.ChannelWrongStateError)
"""The channel went away (closed by the broker or by pika): a new one may succeed."""

LOST: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, *CHANNEL_GONE)
"""Errors after which a consumer reopens its connection and channel."""

NOT_TAKEN: tuple[type[BaseException], ...] = (pex.UnroutableError, pex.NackError)
"""A confirmed publish the broker returned (no queue bound) or nacked."""

CLIENT_ERRORS: tuple[type[BaseException], ...] = (pex.AMQPError, OSError)
"""Anything pika raises about the broker or the socket."""


def reply_code(exc: BaseException) -> int:
    """The AMQP reply code of a channel the broker closed (0 for anything else)."""
    return int(exc.reply_code) if isinstance(exc, pex.ChannelClosedByBroker) else 0


def is_missing(exc: BaseException) -> bool:
    """Whether the broker closed the channel because an entity does not exist (404)."""
    return reply_code(exc) == 404


def channel_error(exc: BaseException) -> DelayqError:
    """A delayq error for a channel the broker closed (404 missing, 406 conflict, ...)."""
    text: str = getattr(exc, "reply_text", "") or ""
    found: DelayqError | None = (
        missing_from_reply(text) or conflict_from_reply(text) or refused_from_reply(text)
    )
    if found is not None:
        return found
    return BrokerError(f"the broker closed the channel: ({reply_code(exc)}) {text}")


def closed_by_broker(reason: BaseException) -> DelayqError | None:
    """What a channel-closed callback's ``reason`` means: a delayq error when the
    broker closed it, ``None`` when the client did (or the connection went)."""
    return channel_error(reason) if isinstance(reason, pex.ChannelClosedByBroker) else None


def connection_lost(error: BaseException | str) -> BaseException:
    """The exception for a connection that failed to open, given pika's error or text."""
    return error if isinstance(error, BaseException) else pex.AMQPConnectionError(error)


def connect_error(exc: BaseException, url: str, broker: BrokerURL) -> DelayqError | None:
    """Why connecting to ``url`` failed for good (credentials, vhost, TLS), or ``None``
    when another attempt may succeed."""
    if isinstance(exc, pex.ProbableAuthenticationError):
        return ConnectionRejected(
            f"broker at {redact(url)} refused the credentials (wrong user or password?)"
        )
    if isinstance(exc, pex.ProbableAccessDeniedError):
        return ConnectionRejected(
            f"broker at {redact(url)} refused access to the vhost (does it exist, and may "
            "this user use it?)"
        )
    failure = broker.tls_failure(exc)
    return ConnectionRejected(failure) if failure is not None else None


def publish_refusal(
    exc: BaseException, msg: OutgoingMessage, blocked_timeout_s: float, url: str
) -> DelayqError | None:
    """What a failed publish of ``msg`` means when re-sending cannot help (unroutable,
    nacked, refused by the broker, publishers blocked past ``blocked_timeout_s``), or
    ``None`` when a fresh channel or connection may succeed."""
    if isinstance(exc, pex.UnroutableError):
        return outcomes.unroutable(msg)
    if isinstance(exc, pex.NackError):
        return outcomes.rejected(msg)
    if isinstance(exc, pex.ConnectionBlockedTimeout):
        return outcomes.blocked(msg, blocked_timeout_s, url)
    if isinstance(exc, pex.ChannelClosedByBroker):
        error = channel_error(exc)
        if isinstance(error, (TopologyMissing, AccessRefused)):
            return error
        return outcomes.rejected(msg, str(error))
    return None


def feed_lost(exc: BaseException) -> DelayqError | FeedLost:
    """What a pika error raised by an open feed becomes: ``AccessRefused`` when the
    broker refuses consuming (reconnecting cannot help), else ``FeedLost``."""
    if reply_code(exc) == 403:
        return channel_error(exc)
    return FeedLost(repr(exc))
