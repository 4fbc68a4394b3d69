"""The blocking publisher (pika): every publish confirmed, retried on a fresh connection."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

import pika
import pika.exceptions as pex
from pika.adapters.blocking_connection import BlockingChannel

from delayq import outcomes
from delayq.declarations import apply_marker
from delayq.envelope import (
    Message,
    MessageFactory,
    OutgoingMessage,
    Receipt,
    epoch_ms,
    new_message_id,
)
from delayq.errors import (
    AccessRefused,
    ConnectionFailed,
    DelayqError,
    PublishError,
    TopologyMissing,
)
from delayq.marker import Gate
from delayq.published import PublishObserver, PublishObservers
from delayq.sync._connection import (
    BLOCKED_CONNECTION_TIMEOUT_S,
    close_quietly,
    connect,
    host_parameters,
    translate_channel_error,
)
from delayq.sync._pipeline import Settle, publish_pipelined, send_pipelined
from delayq.topology import Strategy, Topology
from delayq.urls import parse_url, redact, resolve_url, resolved_memory_name

__all__ = ["Publisher"]

log = logging.getLogger("delayq.publisher")


def pika_properties(msg: OutgoingMessage) -> pika.BasicProperties:
    return pika.BasicProperties(
        content_type=msg.content_type,
        delivery_mode=2,
        message_id=msg.message_id,
        timestamp=msg.timestamp_s,
        headers=msg.headers,
    )


class Publisher:
    """Publishes delayed messages through pika, one confirmed publish at a time.

    >>> with Publisher("amqp://guest:guest@localhost/", topology) as pub:  # doctest: +SKIP
    ...     receipt = pub.publish({"order": 42}, "orders.remind", "15m")

    ``publish_many`` pipelines confirms and is several times faster for batches.
    Not thread-safe: use one publisher per thread.

    Bodies and headers are checked against ``topology.limits`` before anything
    is sent (see :mod:`delayq.limits`); ``max_body_bytes`` overrides the body
    limit. ``url`` may be ``amqps://`` with TLS options (see :mod:`delayq.tls`).
    ``observers`` see each message's outcome (see :mod:`delayq.published`).
    """

    def __new__(cls, url: str | None = None, *args: Any, **kwargs: Any) -> Publisher:
        if cls is Publisher and resolved_memory_name(url) is not None:
            from delayq.testing.sync import MemoryPublisher

            return super().__new__(MemoryPublisher)
        return super().__new__(cls)

    def __init__(
        self,
        url: str | None = None,
        topology: Topology | None = None,
        *,
        max_body_bytes: int | None = None,
        publish_attempts: int = 3,
        connect_attempts: int = 3,
        retry_backoff_s: float = 0.2,
        blocked_timeout_s: float = BLOCKED_CONNECTION_TIMEOUT_S,
        clock_ms: Callable[[], int] = epoch_ms,
        new_id: Callable[[], str] = new_message_id,
        observers: Iterable[PublishObserver] = (),
    ) -> None:
        self._url = resolve_url(url)
        self._observers = PublishObservers(observers)
        self._blocked_timeout_s = blocked_timeout_s
        self.topology = topology if topology is not None else Topology()
        self._factory = MessageFactory(
            self.topology, max_body_bytes=max_body_bytes, clock_ms=clock_ms, new_id=new_id
        )
        self._publish_attempts = max(1, publish_attempts)
        self._connect_attempts = max(1, connect_attempts)
        self._backoff_s = retry_backoff_s
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._gate = Gate(
            self.topology.namespace, apply_marker(self.topology).name, redact(self._url)
        )
        self._gated: pika.BlockingConnection | None = None  # the connection that passed it

    def __repr__(self) -> str:
        return f"Publisher(url={redact(self._url)!r}, namespace={self.topology.namespace!r})"

    # Connection ---------------------------------------------------------------

    def connect(self) -> None:
        """Open the connection now instead of at the first publish."""
        self._ensure_channel()

    def _ensure_channel(self) -> BlockingChannel:
        if self._connection is None or not self._connection.is_open:
            self._connection = connect(
                self._url,
                name="delayq-publisher",
                attempts=self._connect_attempts,
                blocked_timeout_s=self._blocked_timeout_s,
            )
            self._channel = None
        if self._channel is None or not self._channel.is_open:
            channel = self._connection.channel()
            if self._gated is not self._connection:
                self._check_applied(channel)
                self._gated = self._connection
            channel.confirm_delivery()
            self._channel = channel
        return self._channel

    def _check_applied(self, channel: BlockingChannel) -> None:
        """Refuse a namespace whose last apply did not complete (see :mod:`delayq.marker`)."""
        try:
            channel.exchange_declare(self._gate.marker, passive=True)
        except pex.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                raise self._gate.refusal() from exc
            raise translate_channel_error(exc) from exc

    def _drop_connection(self) -> None:
        close_quietly(self._connection)
        self._connection = None
        self._channel = None

    def close(self) -> None:
        """Close the connection; later publishes reconnect."""
        self._drop_connection()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # Publishing ---------------------------------------------------------------

    def publish(
        self,
        body: object,
        routing_key: str,
        delay: object,
        *,
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        strategy: Strategy | str | None = None,
    ) -> Receipt:
        """Publish one message and wait for the broker's confirm.

        ``delay`` is a ``timedelta`` or a string like ``"90s"``; ``"0s"`` is
        immediate. ``strategy`` (``"tiered"`` or ``"exact"``) overrides the
        topology's default for this message. Raises a
        :class:`~delayq.errors.InvalidInput` subclass before sending anything on
        bad input, :class:`~delayq.errors.Unroutable`,
        :class:`~delayq.errors.PublishRejected`,
        :class:`~delayq.errors.TopologyMissing`,
        :class:`~delayq.errors.AccessRefused` (the user may not publish there) or
        :class:`~delayq.errors.PublishUnconfirmed` when the broker did not take it.
        """
        msg = self._factory.build(
            body, routing_key, delay, message_id=message_id, headers=headers, strategy=strategy
        )
        self.send(msg)
        return msg.receipt

    def send(self, msg: OutgoingMessage) -> None:
        """Send an already built message with confirm and bounded retries."""
        with self._observers.reporting([msg]):
            self._send(msg)

    def _send(self, msg: OutgoingMessage) -> None:
        properties = pika_properties(msg)
        last: BaseException | None = None
        handed_over = False  # once written to a socket, its fate is unknown until confirmed
        for attempt in range(self._publish_attempts):
            if attempt:
                time.sleep(self._backoff_s * 2 ** (attempt - 1))
            try:
                channel = self._ensure_channel()
                handed_over = True
                channel.basic_publish(
                    msg.exchange, msg.routing_key, msg.body, properties, mandatory=True
                )
                return
            except pex.UnroutableError as exc:
                raise outcomes.unroutable(msg) from exc
            except pex.NackError as exc:
                raise outcomes.rejected(msg) from exc
            except pex.ConnectionBlockedTimeout as exc:  # retrying cannot help while blocked
                self._drop_connection()
                raise outcomes.blocked(msg, self._blocked_timeout_s, redact(self._url)) from exc
            except pex.ChannelClosedByBroker as exc:
                self._channel = None
                error = translate_channel_error(exc)
                if isinstance(error, (TopologyMissing, AccessRefused)):
                    raise error from exc
                raise outcomes.rejected(msg, str(error)) from exc
            except ConnectionFailed as exc:
                if not handed_over:
                    raise  # never sent: the connect retries are spent, say so plainly
                last = exc
                break
            except (pex.ChannelClosed, pex.ChannelWrongStateError) as exc:
                last = exc  # the channel went away under us: a new one may succeed
                self._channel = None
            except DelayqError:
                raise
            except Exception as exc:
                # CONNECTION_ERRORS, and anything else pika raises mid-publish (a
                # channel or connection in a state it did not expect): the
                # connection's state is unknown, a fresh one may succeed.
                last = exc
                log.warning(
                    "publish of %s failed (%s), attempt %d of %d",
                    msg.message_id,
                    type(exc).__name__,
                    attempt + 1,
                    self._publish_attempts,
                )
                self._drop_connection()
        raise outcomes.unconfirmed(msg, attempt + 1, redact(self._url), last) from last

    def publish_many(self, messages: Iterable[Message], *, window: int = 1000) -> list[Receipt]:
        """Publish a batch with pipelined confirms (up to ``window`` unconfirmed).

        Every message is validated before any is sent. Returns receipts in input
        order, or raises :class:`~delayq.errors.PublishBatchError` naming each
        message that was not confirmed (the others were).
        """
        built = self._factory.build_many(messages)
        if not built:
            return []
        with self._observers.reporting(built):
            self._publish_built(built, window)
        return [m.receipt for m in built]

    def _publish_built(self, built: list[OutgoingMessage], window: int) -> None:
        broker = parse_url(self._url)
        publish_pipelined(
            host_parameters(
                self._url, name="delayq-publisher-batch", blocked_timeout_s=self._blocked_timeout_s
            ),
            built,
            window=max(1, window),
            properties=pika_properties,
            attempts=self._publish_attempts,
            backoff_s=self._backoff_s,
            url_for_errors=redact(self._url),
            explain=broker.tls_failure,
            gate=self._gate,
        )

    def send_many(
        self,
        messages: Iterable[OutgoingMessage],
        *,
        settle: Settle,
        window: int = 1000,
    ) -> None:
        """Stream already built messages through one connection with pipelined confirms.

        ``messages`` is pulled lazily, at most ``window`` unconfirmed at a time,
        so a generator of millions needs little memory; build them with
        ``publisher.factory`` (or :class:`~delayq.bulk.BulkPlanner`), which
        validates each before it reaches the stream. ``settle(index, message,
        error)`` is called once per message: ``error`` is ``None`` when the
        broker confirmed it, else the :class:`~delayq.errors.PublishError`
        (rejected, unroutable, or unconfirmed once the retries are spent).
        Raises :class:`~delayq.errors.ConnectionFailed` when nothing could be
        sent, :class:`~delayq.errors.TopologyMissing` or
        :class:`~delayq.errors.AccessRefused` at once. The publisher's
        ``observers`` hear each message's outcome as it settles.

        >>> failed = []                                           # doctest: +SKIP
        >>> pub.send_many((pub.factory.build(b, "job.x", "1m") for b in bodies),
        ...               settle=lambda i, m, e: e and failed.append((i, e)))  # doctest: +SKIP
        """
        if self._observers:
            observed = settle

            def settle(index: int, msg: OutgoingMessage, error: PublishError | None) -> None:
                self._observers.emit([msg], error)
                observed(index, msg, error)

        self._send_stream(messages, settle, window)

    def _send_stream(
        self, messages: Iterable[OutgoingMessage], settle: Settle, window: int
    ) -> None:
        broker = parse_url(self._url)
        send_pipelined(
            host_parameters(
                self._url, name="delayq-publisher-stream", blocked_timeout_s=self._blocked_timeout_s
            ),
            messages,
            settle=settle,
            window=max(1, window),
            properties=pika_properties,
            attempts=self._publish_attempts,
            backoff_s=self._backoff_s,
            url_for_errors=redact(self._url),
            explain=broker.tls_failure,
            gate=self._gate,
        )

    @property
    def factory(self) -> MessageFactory:
        """The pure builder this publisher validates and builds messages with."""
        return self._factory
