"""The one exception tree of delayq.

Every error delayq raises derives from :class:`DelayqError`. Errors from pika
and aiormq are translated at one place per adapter, its error map
(:mod:`delayq.sync._errors`, :mod:`delayq.aio._errors`), and chained with
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
    ├── BrokerError: the broker said no, or could not be reached
    │   ├── AccessRefused
    │   ├── ConnectionFailed
    │   │   └── ManagementUnavailable
    │   ├── TopologyMissing
    │   │   └── TopologyNotApplied: no completed apply of this topology is recorded
    │   ├── TopologyConflict
    │   ├── RowsUnconfirmed: a bulk job ended with rows the broker did not confirm
    │   └── PublishError: the fate of a message is not "confirmed"
    │       ├── Unroutable
    │       │   └── UnboundRoutingKey (also an InvalidInput): no binding matches; not sent
    │       ├── HeaderFrameTooLarge (also HeadersTooLarge): over the frame_max; not sent
    │       ├── PublishRejected
    │       ├── PublishUnconfirmed
    │       │   ├── PublishNotSent: never written; the broker could not be reached
    │       │   └── PublishBlocked: the broker blocks publishers (resource alarm)
    │       ├── UnsendableMessage: delayq failed encoding or writing it (a bug); not sent
    │       ├── PublishBackpressure: the publisher's in-flight bound is full; not sent
    │       └── PublishBatchError: some messages of a batch failed
    ├── StoreError: an idempotency store failed (the delivery goes back to its queue)
    │   ├── ClaimLost
    │   └── ScheduleNotRecorded: the schedule index could not record a publish
    ├── HandlerTimeout
    │   └── HandlersStuck: every handler thread of a Consumer is stuck past its timeout
    ├── RowsRejected: a bulk job rejected more rows than allowed (the rest were sent)
    ├── SparkJobFailed: Spark failed a bulk job (the finished partitions' figures kept)
    ├── RecordsLost: delivery records that could not be written
    ├── PublisherInUse (also a RuntimeError): an AsyncPublisher used by a second
    │   running event loop
    ├── ExecutorEnvironment: the Spark executors' Python cannot run delayq's tasks
    └── MissingExtra (also an ImportError): an optional dependency is not installed
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AccessRefused",
    "BodyTooLarge",
    "BrokerError",
    "ClaimLost",
    "ConnectionFailed",
    "ConnectionRejected",
    "DelayTooLong",
    "DelayqError",
    "ExecutorEnvironment",
    "HandlerTimeout",
    "HandlersStuck",
    "HeaderFrameTooLarge",
    "HeadersTooLarge",
    "InvalidBody",
    "InvalidDelay",
    "InvalidHeaders",
    "InvalidInput",
    "InvalidMessageId",
    "InvalidRoutingKey",
    "InvalidTopology",
    "InvalidURL",
    "ManagementUnavailable",
    "MissingExtra",
    "ParkedAtRisk",
    "PublishBackpressure",
    "PublishBatchError",
    "PublishBlocked",
    "PublishError",
    "PublishNotSent",
    "PublishRejected",
    "PublishUnconfirmed",
    "PublisherInUse",
    "RecordsLost",
    "RowsRejected",
    "RowsUnconfirmed",
    "ScheduleNotRecorded",
    "SparkJobFailed",
    "StoreError",
    "TopologyConflict",
    "TopologyMissing",
    "TopologyNotApplied",
    "UnboundRoutingKey",
    "Unroutable",
    "UnsendableMessage",
]


class DelayqError(Exception):
    """Base class of every error raised by delayq."""


class HandlerTimeout(DelayqError):
    """A handler ran longer than its consumer's ``handler_timeout``; it is retried."""


class HandlersStuck(HandlerTimeout):
    """Every handler thread a :class:`~delayq.sync.Consumer` may have is stuck in a
    handler that overran ``handler_timeout`` (a thread cannot be killed), so no handler
    can start. While that lasts, a delivery whose previous attempt timed out is
    dead-lettered with this error (reason ``handlers-stuck``) instead of waiting for a
    thread; once it has lasted ``stuck_grace``, :meth:`Consumer.run
    <delayq.sync.Consumer.run>` stops (its deliveries go back to the queue) and raises
    it, so ``delayq worker`` exits non-zero and a supervisor can start a fresh process.
    """


class MissingExtra(DelayqError, ImportError):
    """A feature needs an optional dependency: ``pip install 'delayq[EXTRA]'``."""

    def __init__(self, feature: str, extra: str, package: str) -> None:
        super().__init__(
            f"{feature} needs the {package} package: pip install 'delayq[{extra}]'",
            name=package,
        )
        self.feature, self.extra, self.package = feature, extra, package

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.feature, self.extra, self.package))


class PublisherInUse(DelayqError, RuntimeError):
    """An :class:`~delayq.aio.AsyncPublisher` was used from an event loop while another
    one runs that its connection belongs to (another thread's loop): its connection,
    confirms and bounds serve one event loop at a time, and two at once would resend
    each other's messages. Nothing was sent. Create a publisher per thread or event loop;
    one used by loops one after another (a second ``asyncio.run``) is fine."""


class StoreError(DelayqError):
    """An idempotency store could not be read or written (server down, disk full).

    The consumer returns the delivery to its queue and goes on: nothing is acked
    whose key was not recorded. ``__cause__`` holds the store client's error.
    """


class ClaimLost(StoreError):
    """A handler's transaction found its claim gone (released after a timeout, or
    expired and taken by another consumer): the transaction was rolled back, so the
    handler's effects did not happen and whoever holds the key now runs them."""


class ScheduleNotRecorded(StoreError):
    """The schedule index (:mod:`delayq.schedule`) could not record a publish.

    ``receipts`` empty: its pending entries could not be written and nothing was
    published. Otherwise the messages were published and confirmed (``receipts``) but
    their entries still show them pending: do not publish them again. ``elsewhere``:
    the ids refused for good, each waiting in another namespace of the same index (the
    others may be recorded once those are left out)."""

    def __init__(
        self, message: str, receipts: list[Any] | None = None, elsewhere: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.receipts = list(receipts or [])
        self.elsewhere = tuple(elsewhere)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.receipts, self.elsewhere))


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


class AccessRefused(BrokerError):
    """The user's permissions do not cover an exchange or queue (ACCESS_REFUSED, 403)."""


class ConnectionFailed(BrokerError):
    """No connection to the broker could be made (after the allowed retries)."""


class ConnectionRejected(ConnectionFailed):
    """The broker, or the TLS handshake, turned the connection down for good: credentials
    it refuses, a vhost the user may not use, a certificate or TLS setting that does not
    match. Nothing was sent, and trying again does not help until the configuration is
    fixed (a broker that cannot be reached raises :class:`ConnectionFailed` itself)."""


class ManagementUnavailable(ConnectionFailed):
    """The management HTTP API cannot be reached, or refused the login."""


class TopologyMissing(BrokerError):
    """An exchange or queue delayq needs does not exist: run ``delayq topology apply``."""


class TopologyNotApplied(TopologyMissing):
    """No completed ``delayq topology apply`` of the publisher's topology is recorded on
    the broker (its apply marker exchange is missing): the last apply failed or never
    ran, or the broker holds another ladder or queue type. A publisher refuses to send
    rather than have a message confirmed into a half-applied topology, where it could
    be lost. Run ``delayq topology apply`` and fix what it reports."""


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


class ParkedAtRisk(TopologyConflict):
    """A parked queue (a DLQ, ``<ns>.unrouted``) counts returns against a delivery limit:
    on RabbitMQ 4.x, browsing it would delete its messages once the limit is reached,
    so delayq refuses to browse it by returning messages."""

    def __init__(self, name: str, current: str | None, wanted: str | None, version: str) -> None:
        super().__init__("queue", name, "x-delivery-limit", current, wanted)
        self.version = version
        limit = "RabbitMQ's default of 20" if current is None else f"a limit of {current}"
        self.args = (
            f"queue {name!r} was declared without delayq's delivery limit for parked queues "
            f"(it has x-delivery-limit={_show(current)}): on RabbitMQ {version} every browse "
            f"counts against {limit}, after which the broker deletes each message parked "
            "there. delayq does not browse it. Replay its messages (a replay of all of them "
            "returns none), delete the queue, and run `delayq topology apply` to declare it "
            "again with the limit.",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.current, self.wanted, self.version))


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


class UnboundRoutingKey(Unroutable, InvalidInput):
    """No binding of the topology matches the routing key: the message would only be
    parked in ``<ns>.unrouted`` when due. Raised before anything is sent (so it is an
    :class:`InvalidInput` too); a key bound outside the topology file is declared in
    the topology's ``external_bindings``."""


class HeaderFrameTooLarge(HeadersTooLarge, PublishError):
    """A message's properties and headers do not fit in one frame of the ``frame_max``
    the broker negotiated (lower than the topology's ``limits.frame_max``, which publish
    checks first). It was not sent: the broker would have closed the connection, and
    everything in flight on it with it. Raised by a single publish, named among a
    batch's failures; the rest of the batch goes on."""


class PublishRejected(PublishError):
    """The broker nacked the message (for example a full tier with reject-publish)."""


class PublishUnconfirmed(PublishError):
    """The connection was lost before a confirm, and the retries ran out."""


class PublishNotSent(PublishUnconfirmed):
    """A message of a batch was never written to a connection: the broker could not be
    reached (again) before the publisher gave up (``reconnect_within``). It is not at
    the broker; publishing it again sends it once."""


class PublishBlocked(PublishUnconfirmed):
    """The broker blocked publishing (a memory or disk alarm) for longer than the
    publisher's bound; delayq stopped waiting instead of hanging."""


class UnsendableMessage(PublishError):
    """delayq failed on the message itself while sending it in a pipelined stream (an
    error of its own encoding the frames, or writing them that raised again on a fresh
    connection): it was settled alone, with the error as its cause, and the rest of the
    stream went on. Not the broker's doing; please report it."""


class PublishBackpressure(PublishError):
    """The publisher already holds as much unconfirmed as its ``in_flight`` limit allows,
    and the publish could not wait (``when_full="raise"``) or waited in vain: nothing
    of it was sent (see :mod:`delayq.message.inflight`)."""


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


class RowsRejected(DelayqError):
    """A bulk job (``delayq.spark.schedule``) rejected more rows than ``max_rejected``.

    The rows that were not rejected were published (running the job again sends
    them as duplicates only); ``summary`` is the job's
    :class:`~delayq.spark.ScheduleSummary`, with the rejections or where they went.
    """

    def __init__(self, message: str, summary: Any = None) -> None:
        self.summary = summary
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.summary))


class RowsUnconfirmed(BrokerError):
    """A bulk job (``delayq.spark.schedule``) ended with rows the broker did not confirm:
    it stayed silent longer than the job's ``retry_for``, or refused for good mid-job.

    Nothing unconfirmed is counted as published; ``summary`` is the job's
    :class:`~delayq.spark.ScheduleSummary` (its ``unconfirmed`` counts), and the errors
    output names each such row (reason ``unconfirmed: ...``): run again with
    ``resume_from=`` (``--resume``) to send just them.
    """

    def __init__(self, message: str, summary: Any = None) -> None:
        self.summary = summary
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.summary))


class SparkJobFailed(DelayqError):
    """Spark failed a bulk job (``delayq.spark.schedule``) for a reason of its own: an
    unreadable input file, a Python worker or executor lost more often than the task
    retries allow. The message says the cause in one line; ``summary`` is the job's
    :class:`~delayq.spark.ScheduleSummary` over the partitions that finished (its
    ``unfinished`` counts the others, which may have published part of their rows), and
    the errors output names the finished partitions' rejected and unconfirmed rows.
    Running the same input again sends what was published as duplicates only.
    """

    def __init__(self, message: str, summary: Any = None) -> None:
        self.summary = summary
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.summary))


class ExecutorEnvironment(DelayqError):
    """The Spark executors' Python cannot run delayq's tasks: delayq or a dependency is
    missing there, or it is another Python version than the driver's (ship an environment:
    ``delayq spark pack-env``)."""


class RecordsLost(DelayqError):
    """Delivery records were not written (the disk failed, or could not keep up).

    ``failed`` records were lost to write errors, ``dropped`` ones because the
    writer fell behind; the deliveries themselves were not affected.
    """

    def __init__(self, message: str, failed: int = 0, dropped: int = 0) -> None:
        self.failed = failed
        self.dropped = dropped
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.failed, self.dropped))


# httpx's habit (see delayq/__init__.py): an error shows as ``delayq.TopologyMissing`` in
# tracebacks and reprs. Set here, not by the package: its names load lazily, and an
# error raised before anyone read ``delayq.TopologyMissing`` must be named alike.
for _error in __all__:
    globals()[_error].__module__ = "delayq"
