"""What a web app answers when a publish fails: one HTTP status per delayq error.

A request that publishes a message answers only once the broker confirmed it; when it
could not be, :func:`http_answer` says what to tell the client, so every framework's
error handler is three lines (``docs/guides/web-apps.md``). A broker that cannot be
reached, blocks publishing or refuses a message for room is a ``503`` with a
``Retry-After``: the client may send the request again, and a consumer with an
idempotency store takes the message once however often it came. A message delayq
refuses to build is a ``422``; a deployment fault (no applied topology, no permission,
credentials or TLS the broker turns down) is a ``500`` that retrying does not cure.
"""

from __future__ import annotations

from dataclasses import dataclass

from delayq.errors import (
    ConnectionFailed,
    ConnectionRejected,
    DelayqError,
    InvalidInput,
    PublishBackpressure,
    PublishBatchError,
    PublishBlocked,
    PublishRejected,
    PublishUnconfirmed,
)

__all__ = ["HTTPAnswer", "http_answer"]

RETRY_AFTER_S = 1
"""After a lost connection: the publisher reconnects within about a second of the
broker's return."""
FULL_RETRY_AFTER_S = 30
"""After a refusal for room (a full tier, the publisher's in-flight bound, a memory or
disk alarm): the room comes back as messages leave, which takes longer."""


@dataclass(frozen=True)
class HTTPAnswer:
    """The status, ``Retry-After`` and body text for a publish that failed."""

    status: int
    retry_after_s: int | None
    detail: str
    message_id: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        """``{"Retry-After": ...}`` when sending the request again can help, else ``{}``."""
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


def http_answer(exc: DelayqError) -> HTTPAnswer:
    """The answer to a request whose publish raised ``exc``."""
    message_id = getattr(exc, "message_id", None)
    if isinstance(exc, InvalidInput):  # before PublishError: UnboundRoutingKey is both
        return HTTPAnswer(422, None, str(exc), message_id)
    if isinstance(exc, PublishBatchError):  # 503 only if every failure is one
        answers = [http_answer(failure) for failure in exc.failures.values()]
        if all(a.status == 503 for a in answers):
            later = max(a.retry_after_s or 0 for a in answers)
            return HTTPAnswer(503, later, answers[0].detail, message_id)
        return HTTPAnswer(500, None, "some messages could not be published", message_id)
    if isinstance(exc, (PublishRejected, PublishBackpressure, PublishBlocked)):
        detail = "the broker has no room for the message now; send the request again later"
        return HTTPAnswer(503, FULL_RETRY_AFTER_S, detail, message_id)
    if isinstance(exc, (PublishUnconfirmed, ConnectionFailed)) and not isinstance(
        exc,
        ConnectionRejected,  # credentials, vhost, TLS: not cured by waiting
    ):
        detail = "the message broker cannot be reached; send the request again shortly"
        return HTTPAnswer(503, RETRY_AFTER_S, detail, message_id)
    return HTTPAnswer(500, None, "the message could not be published", message_id)
