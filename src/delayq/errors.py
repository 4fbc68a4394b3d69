"""The one exception tree of delayq.

Every error delayq raises derives from :class:`DelayqError`. Errors from pika
and aiormq are translated at one place per adapter and chained with
``raise ... from`` so the original stays in ``__cause__``::

    DelayqError
    ├── InvalidInput (also a ValueError): rejected before anything is sent
    │   ├── InvalidDelay
    │   │   └── DelayTooLong
    │   ├── InvalidBody
    │   │   └── BodyTooLarge
    │   ├── InvalidRoutingKey
    │   ├── InvalidHeaders
    │   │   └── HeadersTooLarge
    │   ├── InvalidMessageId
    │   ├── InvalidTopology
    │   └── InvalidURL
    └── BrokerError: the broker said no, or could not be reached
        ├── ConnectionFailed
        ├── TopologyMissing
        ├── TopologyConflict
        └── PublishError: the fate of a message is not "confirmed"
            ├── Unroutable
            ├── PublishRejected
            ├── PublishUnconfirmed
            └── PublishBatchError: some messages of a batch failed
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BodyTooLarge",
    "BrokerError",
    "ConnectionFailed",
    "DelayTooLong",
    "DelayqError",
    "HandlerTimeout",
    "HeadersTooLarge",
    "InvalidBody",
    "InvalidDelay",
    "InvalidHeaders",
    "InvalidInput",
    "InvalidMessageId",
    "InvalidRoutingKey",
    "InvalidTopology",
    "InvalidURL",
    "PublishBatchError",
    "PublishError",
    "PublishRejected",
    "PublishUnconfirmed",
    "TopologyConflict",
    "TopologyMissing",
    "Unroutable",
]


class DelayqError(Exception):
    """Base class of every error raised by delayq."""


class HandlerTimeout(DelayqError):
    """A handler ran longer than its consumer's ``handler_timeout``; it is retried."""


class InvalidInput(DelayqError, ValueError):
    """The caller's input is wrong; nothing was sent to the broker."""


class InvalidDelay(InvalidInput):
    """A delay is not a valid duration (wrong type, negative, NaN, garbage)."""


class DelayTooLong(InvalidDelay):
    """A delay is longer than the largest tier of the ladder."""


class InvalidBody(InvalidInput):
    """A body cannot be encoded (not bytes, str, JSON or a pydantic model)."""


class BodyTooLarge(InvalidBody):
    """An encoded body is larger than the publisher's limit."""


class InvalidRoutingKey(InvalidInput):
    """A routing key is empty, too long, reserved or not a string."""


class InvalidHeaders(InvalidInput):
    """User headers use a reserved prefix or a value AMQP cannot carry."""


class HeadersTooLarge(InvalidHeaders):
    """User headers are too many, or too large once encoded, for the topology's limits."""


class InvalidMessageId(InvalidInput):
    """A message id is empty, too long or not a string."""


class InvalidTopology(InvalidInput):
    """A topology file or model is malformed."""


class InvalidURL(InvalidInput):
    """A broker URL cannot be used (scheme, syntax, an unknown option, a TLS file that
    is missing or unusable). Never shows the password."""


class BrokerError(DelayqError):
    """The broker refused an operation or could not be reached."""


class ConnectionFailed(BrokerError):
    """No connection to the broker could be made (after the allowed retries)."""


class TopologyMissing(BrokerError):
    """An exchange or queue delayq needs does not exist: run ``delayq topology apply``."""


class TopologyConflict(BrokerError):
    """An existing entity was declared with other arguments than the topology wants."""

    def __init__(
        self,
        kind: str,
        name: str,
        argument: str,
        current: str | None,
        wanted: str | None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.argument = argument
        self.current = current
        self.wanted = wanted
        super().__init__(
            f"{kind} {name!r} exists with {argument}={_show(current)}, "
            f"the topology wants {argument}={_show(wanted)}. RabbitMQ cannot change "
            f"this in place: delete the {kind} (after draining it) and apply again, "
            f"or change the topology to match."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, self.name, self.argument, self.current, self.wanted))


def _show(value: str | None) -> str:
    return "(not set)" if value is None else repr(value)


class PublishError(BrokerError):
    """A message was not confirmed by the broker; ``message_id`` says which."""

    def __init__(self, message: str, message_id: str | None = None) -> None:
        self.message_id = message_id
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.message_id))


class Unroutable(PublishError):
    """The broker returned a mandatory message: no queue was bound to take it."""


class PublishRejected(PublishError):
    """The broker nacked the message (for example a full tier with reject-publish)."""


class PublishUnconfirmed(PublishError):
    """The connection was lost before a confirm, and the retries ran out."""


class PublishBatchError(PublishError):
    """Some messages of a ``publish_many`` batch were not confirmed.

    ``receipts`` holds the confirmed ones (``None`` where a message failed) in
    input order; ``failures`` maps each failed input index to its own error.
    """

    def __init__(self, receipts: list[Any], failures: dict[int, PublishError]) -> None:
        self.receipts = receipts
        self.failures = failures
        first_index = min(failures)
        first = failures[first_index]
        super().__init__(
            f"{len(failures)} of {len(receipts)} messages were not confirmed; "
            f"first failure (message {first_index}): {first}",
            message_id=first.message_id,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.receipts, self.failures))
