"""The errors that tell a caller the fate of a message, worded once for every publisher."""

from __future__ import annotations

from delayq.errors import (
    HeaderFrameTooLarge,
    PublishBlocked,
    PublishNotSent,
    PublishRejected,
    PublishUnconfirmed,
    Unroutable,
    UnsendableMessage,
)
from delayq.message.envelope import OutgoingMessage

__all__ = [
    "blocked",
    "header_frame_too_large",
    "not_sent",
    "rejected",
    "unconfirmed",
    "unroutable",
    "unsendable",
]


def unroutable(msg: OutgoingMessage) -> Unroutable:
    return Unroutable(
        f"exchange {msg.exchange!r} has no queue bound to take message {msg.message_id!r}; "
        "is the tier queue deleted? Run `delayq topology apply`.",
        msg.message_id,
    )


def rejected(msg: OutgoingMessage, reason: str = "") -> PublishRejected:
    return PublishRejected(
        f"the broker rejected message {msg.message_id!r} on exchange {msg.exchange!r}: "
        f"{reason or 'nacked (a full queue with reject-publish, or a broker error)'}",
        msg.message_id,
    )


def unconfirmed(
    msg: OutgoingMessage, attempts: int | str, url: str, cause: object
) -> PublishUnconfirmed:
    """``url`` must be redacted already; ``attempts`` a count, or how the attempts ended
    (``"for 30 s (17 attempts)"``: :meth:`delayq.retrying.Reconnecting.spent`)."""
    spent = f"after {attempts} attempt(s)" if isinstance(attempts, int) else attempts
    return PublishUnconfirmed(
        f"message {msg.message_id!r} was not confirmed {spent} on "
        f"connections to {url} ({_cause(cause)}); "
        "it may or may not have reached the broker: publishing it again with the same "
        "message id is safe with idempotent consumers",
        msg.message_id,
    )


def not_sent(msg: OutgoingMessage, spent: str, url: str, cause: object) -> PublishNotSent:
    """A message of a batch never written to a connection: the broker could not be
    reached (again) before the batch gave up. ``url`` must be redacted already."""
    return PublishNotSent(
        f"message {msg.message_id!r} was never sent: no connection to {url} could be "
        f"opened {spent} ({_cause(cause)}); it is not at the broker, so publishing it "
        "again sends it once",
        msg.message_id,
    )


def unsendable(msg: OutgoingMessage, cause: BaseException, doing: str) -> UnsendableMessage:
    """delayq failed on ``msg`` itself (``doing``: "encoding" or "writing" it) with
    ``cause``, which the error is chained to."""
    error = UnsendableMessage(
        f"message {msg.message_id!r} was not sent: delayq failed {doing} it "
        f"({type(cause).__name__}: {cause}); the rest of the stream went on",
        msg.message_id,
    )
    error.__cause__ = cause
    return error


def _cause(cause: object) -> str:
    return type(cause).__name__ if cause else "connection closed"


def blocked(msg: OutgoingMessage, waited_s: float, url: str) -> PublishBlocked:
    """``url`` must be redacted already."""
    return PublishBlocked(
        f"the broker at {url} is blocking publishers (a memory or disk alarm) and did not "
        f"confirm message {msg.message_id!r} within {waited_s:g} s; delayq stopped waiting. "
        "If the broker read it before blocking, it is delivered once the alarm clears; "
        "publishing it again with the same message id is safe with idempotent consumers",
        msg.message_id,
    )


def header_frame_too_large(msg: OutgoingMessage, size: int, frame_max: int) -> HeaderFrameTooLarge:
    """``msg``'s content header frame is ``size`` bytes; the broker negotiated ``frame_max``."""
    return HeaderFrameTooLarge(
        f"message {msg.message_id!r} was not sent: its properties and headers take "
        f"{size:,} bytes, more than one frame of the broker's frame_max ({frame_max:,} "
        "bytes, negotiated on this connection) holds, and the broker would close the "
        "connection and every message in flight on it. Make its headers smaller, or set "
        f"the topology's `limits: {{frame_max: {frame_max}}}` so publish refuses such "
        "headers before anything is sent",
        msg.message_id,
    )
