"""Watching what a publisher does: one event per message whose publish has ended.

Both publishers (``Publisher`` and ``AsyncPublisher``) take ``observers=[...]``
and hand each of them a :class:`Published` event once a message is confirmed
or has failed: metrics count them per tier and outcome. The events are built
here, once for both adapters, from the message and the error (if any) the
publish ended with. Like consumer observers, a publish observer runs on the
publisher's thread or event loop, must be quick, and one that raises is logged
once and otherwise ignored (it never changes what the publish returns).

>>> class Unroutable:
...     def __init__(self) -> None:
...         self.count = 0
...     def published(self, event: Published) -> None:
...         self.count += event.outcome is PublishOutcome.UNROUTABLE
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from delayq.errors import (
    AccessRefused,
    ConnectionFailed,
    DelayqError,
    InvalidInput,
    PublishBatchError,
    PublishBlocked,
    PublishRejected,
    PublishUnconfirmed,
    ScheduleNotRecorded,
    TopologyMissing,
    Unroutable,
)
from delayq.message.envelope import IMMEDIATE, OutgoingMessage, Receipt

__all__ = [
    "PublishObserver",
    "PublishObservers",
    "PublishOutcome",
    "Published",
    "publish_outcome",
    "published_events",
]

log = logging.getLogger("delayq.publisher")


class PublishOutcome(str, enum.Enum):
    """How a publish ended: a small fixed set, fit for a metric label."""

    CONFIRMED = "confirmed"
    """The broker confirmed the message: it waits in its tier (or its queue)."""
    UNROUTABLE = "unroutable"
    """Returned by the broker: no queue bound to take it (a tier queue deleted)."""
    REJECTED = "rejected"
    """Nacked: a full tier with ``reject-publish``, or a broker error."""
    UNCONFIRMED = "unconfirmed"
    """No confirm after the retries: it may or may not have reached the broker."""
    BLOCKED = "blocked"
    """The broker blocked publishers (a resource alarm) past the wait bound."""
    MISSING = "missing"
    """The exchange does not exist: the topology is not applied."""
    REFUSED = "refused"
    """The user may not publish there."""
    UNREACHABLE = "unreachable"
    """No connection could be opened: nothing was sent."""
    FAILED = "failed"
    """Any other error."""


_BY_ERROR: tuple[tuple[type[BaseException], PublishOutcome], ...] = (
    (Unroutable, PublishOutcome.UNROUTABLE),
    (PublishRejected, PublishOutcome.REJECTED),
    (PublishBlocked, PublishOutcome.BLOCKED),  # before its base class PublishUnconfirmed
    (PublishUnconfirmed, PublishOutcome.UNCONFIRMED),
    (TopologyMissing, PublishOutcome.MISSING),
    (AccessRefused, PublishOutcome.REFUSED),
    (ConnectionFailed, PublishOutcome.UNREACHABLE),
)


def publish_outcome(error: BaseException | None) -> PublishOutcome:
    """The outcome a publish that ended with ``error`` (``None``: confirmed) counts as."""
    if error is None or (isinstance(error, ScheduleNotRecorded) and error.receipts):
        return PublishOutcome.CONFIRMED  # confirmed; only the schedule index was not told
    for kind, outcome in _BY_ERROR:
        if isinstance(error, kind):
            return outcome
    return PublishOutcome.FAILED


@dataclass(frozen=True, slots=True)
class Published:
    """One message whose publish has ended: confirmed, or failed with ``error``."""

    receipt: Receipt
    """Where the message was to wait (also built for a failed publish)."""
    outcome: PublishOutcome
    error: BaseException | None = None

    @property
    def message_id(self) -> str:
        return self.receipt.message_id

    @property
    def routing_key(self) -> str:
        return self.receipt.routing_key

    @property
    def tier(self) -> str:
        """The tier's label, ``"immediate"`` for no delay (a bounded metric label)."""
        return self.receipt.tier or IMMEDIATE

    @property
    def confirmed(self) -> bool:
        return self.outcome is PublishOutcome.CONFIRMED


def published_events(
    messages: Sequence[OutgoingMessage], error: BaseException | None = None
) -> list[Published]:
    """The events of a publish of ``messages`` (one, or a batch) that ended with ``error``.

    A :class:`~delayq.errors.PublishBatchError` fails only the messages it names;
    any other error fails them all; ``None`` confirms them all.
    """
    if isinstance(error, PublishBatchError):
        return [
            Published(m.receipt, publish_outcome(error.failures.get(i)), error.failures.get(i))
            for i, m in enumerate(messages)
        ]
    outcome = publish_outcome(error)
    return [Published(m.receipt, outcome, error) for m in messages]


class PublishObserver(Protocol):
    """Anything with a ``published`` method: called once per message whose publish ended."""

    def published(self, event: Published) -> None: ...


class PublishObservers:
    """The observers of one publisher; a failing observer is logged once, never fatal."""

    __slots__ = ("_failed", "_observers")

    def __init__(self, observers: Iterable[PublishObserver] = ()) -> None:
        self._observers = tuple(observers)
        for observer in self._observers:
            if not callable(getattr(observer, "published", None)):
                raise InvalidInput(f"observer {observer!r} has no published(event) method")
        self._failed: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self._observers)

    def reporting(self, messages: Sequence[OutgoingMessage]) -> AbstractContextManager[None]:
        """A context that emits how the publish inside it ended: confirmed when it
        returns, failed with the error when it raises a ``DelayqError`` (re-raised).
        With no observer, one that does nothing (nothing made per publish).

        >>> with observers.reporting(built):  # doctest: +SKIP
        ...     send(built)
        """
        return _Reporting(self, messages) if self._observers else _NOTHING

    def emit(self, messages: Sequence[OutgoingMessage], error: BaseException | None = None) -> None:
        """Tell every observer how the publish of ``messages`` ended."""
        if not self._observers:
            return
        for event in published_events(messages, error):
            for observer in self._observers:
                try:
                    observer.published(event)
                except Exception as exc:
                    if id(observer) not in self._failed:
                        self._failed.add(id(observer))
                        log.exception(
                            "publish observer %r failed on %s (logged once): %r",
                            observer,
                            event.message_id,
                            exc,
                        )


_NOTHING = nullcontext()


class _Reporting:
    __slots__ = ("_messages", "_observers")

    def __init__(self, observers: PublishObservers, messages: Sequence[OutgoingMessage]) -> None:
        self._observers = observers
        self._messages = messages

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self._observers.emit(self._messages)
        elif isinstance(exc, DelayqError):
            self._observers.emit(self._messages, exc)
