"""Publishing a partition's stream through broker outages, within a time budget.

:meth:`delayq.sync.Publisher.send_many` re-sends what a lost connection left
unconfirmed as long as each new connection confirms something; once one does
not, it settles every message still in flight as unconfirmed. Here that is not
the end: the stream stops being pulled, the partition waits (``backoff``,
doubling up to :data:`MAX_PAUSE_MS`) and sends the unconfirmed messages again on
a new connection, then carries on with the stream, for as long as the broker
has gone without confirming anything for less than ``retry_for``. A confirm
resets that clock, so a job survives several short outages, each shorter than
``retry_for``.

A message sent again may reach the broker twice (its first copy may have
arrived, unconfirmed): the ids derived from the keys make that a duplicate an
idempotent consumer skips. Such a message is counted once: published, and
``retried``. (A lost connection whose immediate reconnect succeeds, the broker
still up, is re-sent inside ``send_many`` unseen here: ``retried`` is then a lower
bound.) When the budget is spent, what is still unconfirmed is handed
back with the cause (:class:`Stalled`) and the rest of the stream is left
unread for the caller to account for.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from delayq.durations import format_ms, to_ms
from delayq.errors import (
    ConnectionFailed,
    DelayqError,
    InvalidInput,
    PublishError,
    PublishUnconfirmed,
)
from delayq.message.envelope import OutgoingMessage

__all__ = ["MAX_PAUSE_MS", "RetryPolicy", "Sender", "Stalled", "send_resilient"]

T = TypeVar("T")

MAX_PAUSE_MS = 5_000
"""The longest pause between two attempts (the back-off doubles up to it)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long a partition keeps trying while the broker confirms nothing, and the
    first pause between attempts.

    >>> RetryPolicy.parse("20s", "500ms")
    RetryPolicy(retry_for_ms=20000, backoff_ms=500)
    """

    retry_for_ms: int = 60_000
    backoff_ms: int = 200

    @classmethod
    def parse(cls, retry_for: object = "60s", backoff: object = "200ms") -> RetryPolicy:
        """Durations (``"60s"``, a ``timedelta``); ``"0s"`` retry means one attempt only."""
        retry_for_ms = to_ms(retry_for, what="retry_for")
        backoff_ms = to_ms(backoff, what="backoff")
        if backoff_ms < 1:
            raise InvalidInput(f"backoff must be at least 1ms, got {backoff!r}")
        return cls(retry_for_ms, backoff_ms)

    def describe(self) -> str:
        return f"retry_for={format_ms(self.retry_for_ms)}, backoff={format_ms(self.backoff_ms)}"


class Sender(Protocol):
    """What sends a stream (:class:`delayq.sync.Publisher`)."""

    def send_many(
        self,
        messages: Iterable[OutgoingMessage],
        *,
        settle: Callable[[int, OutgoingMessage, PublishError | None], None],
        window: int = 1000,
    ) -> None: ...


@dataclass
class Stalled(Generic[T]):
    """Why a partition stopped before its stream's end, and what it left unconfirmed
    (in stream order; the stream's unread rest is the caller's)."""

    cause: DelayqError
    left: list[tuple[T, OutgoingMessage]]
    fatal: bool
    """A refusal no retry mends (a missing exchange, access refused), not an outage."""


@dataclass
class _Pass(Generic[T]):
    """One :meth:`send_many` call: first what earlier ones left unconfirmed, then the stream."""

    pending: deque[tuple[T, OutgoingMessage]]
    stream: Iterator[tuple[T, OutgoingMessage]]
    settle: Callable[[T, OutgoingMessage, PublishError | None], None]
    unsure: set[int]
    sent: dict[int, tuple[T, OutgoingMessage]] = field(default_factory=dict)
    cause: DelayqError | None = None
    confirmed: int = 0
    retried: int = 0

    def messages(self) -> Iterator[OutgoingMessage]:
        index = 0
        while self.cause is None:  # once a message is given up, the stream waits
            if self.pending:
                item = self.pending.popleft()
            else:
                found = next(self.stream, None)
                if found is None:
                    return
                item = found
            self.sent[index] = item
            index += 1
            yield item[1]

    def on_settled(self, index: int, msg: OutgoingMessage, error: PublishError | None) -> None:
        if isinstance(error, PublishUnconfirmed):
            self.cause = self.cause or error
            self.unsure.add(id(msg))  # handed over, fate unknown: a re-send may duplicate it
            return  # stays in `sent`: sent again by the next pass
        tag, _ = self.sent.pop(index)
        if error is None:
            self.confirmed += 1
            if id(msg) in self.unsure:
                self.unsure.discard(id(msg))
                self.retried += 1
        self.settle(tag, msg, error)

    def left(self) -> list[tuple[T, OutgoingMessage]]:
        """What this pass did not settle, in stream order: what it sent, unconfirmed,
        then what it had to send again and never pulled (a pass that could not connect)."""
        return [*(self.sent[i] for i in sorted(self.sent)), *self.pending]


@dataclass
class Outcome(Generic[T]):
    retried: int = 0
    """Messages confirmed only after being sent again (each counted once, as published)."""
    stalled: Stalled[T] | None = None


def send_resilient(
    sender: Sender,
    stream: Iterator[tuple[T, OutgoingMessage]],
    settle: Callable[[T, OutgoingMessage, PublishError | None], None],
    *,
    window: int,
    policy: RetryPolicy,
    give_up_at_once: bool = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome[T]:
    """Send ``stream`` (``(tag, message)`` pairs) through ``sender``; ``settle(tag, msg,
    error)`` hears each message's final fate once: confirmed (``None``), rejected or
    unroutable. Returns how many were retried and, when the broker stayed silent for
    ``policy.retry_for_ms`` (at once with ``give_up_at_once``) or refused for good,
    what was left unconfirmed. The sender's own retry count should be 1: the waiting
    is done here."""
    pending: deque[tuple[T, OutgoingMessage]] = deque()
    unsure: set[int] = set()
    outcome: Outcome[T] = Outcome()
    silent_since: float | None = None
    pause_ms = policy.backoff_ms
    while True:
        one = _Pass(pending, stream, settle, unsure)
        fatal = False
        try:
            sender.send_many(one.messages(), settle=one.on_settled, window=window)
        except ConnectionFailed as exc:  # nothing of this pass reached a socket
            one.cause = exc
        except DelayqError as exc:  # refused: a missing exchange, access, the apply marker
            one.cause, fatal = exc, True
        outcome.retried += one.retried
        if one.cause is None:
            return outcome
        left = one.left()
        now = clock()
        if one.confirmed:
            silent_since, pause_ms = None, policy.backoff_ms
            give_up_at_once = False
        silent_since = now if silent_since is None else silent_since
        spent_ms = (now - silent_since) * 1000
        if fatal or give_up_at_once or spent_ms >= policy.retry_for_ms:
            outcome.stalled = Stalled(one.cause, left, fatal)
            return outcome
        sleep(min(pause_ms, max(1.0, policy.retry_for_ms - spent_ms)) / 1000)
        pause_ms = min(pause_ms * 2, MAX_PAUSE_MS)
        pending = deque(left)
