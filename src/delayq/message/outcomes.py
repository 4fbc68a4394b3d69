"""The errors that tell a caller the fate of a message, worded once for every publisher."""

from __future__ import annotations

from delayq.errors import PublishBlocked, PublishRejected, PublishUnconfirmed, Unroutable
from delayq.message.envelope import OutgoingMessage

__all__ = ["blocked", "rejected", "unconfirmed", "unroutable"]


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


def unconfirmed(msg: OutgoingMessage, attempts: int, url: str, cause: object) -> PublishUnconfirmed:
    """``url`` must be redacted already."""
    return PublishUnconfirmed(
        f"message {msg.message_id!r} was not confirmed after {attempts} attempt(s) on "
        f"connections to {url} ({type(cause).__name__ if cause else 'connection closed'}); "
        "it may or may not have reached the broker: publishing it again with the same "
        "message id is safe with idempotent consumers",
        msg.message_id,
    )


def blocked(msg: OutgoingMessage, waited_s: float, url: str) -> PublishBlocked:
    """``url`` must be redacted already."""
    return PublishBlocked(
        f"the broker at {url} is blocking publishers (a memory or disk alarm) and did not "
        f"confirm message {msg.message_id!r} within {waited_s:g} s; delayq stopped waiting. "
        "If the broker read it before blocking, it is delivered once the alarm clears; "
        "publishing it again with the same message id is safe with idempotent consumers",
        msg.message_id,
    )
