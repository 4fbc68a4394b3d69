"""The blocking link (pika): the AMQP I/O of :class:`~delayq.sync.Publisher`.

One connection and one confirming channel for single sends, opened at the first
send and re-opened after a loss; a fresh connection per batch or stream, with
pipelined confirms (:mod:`delayq.sync._pipeline`). Each send is retried on a
fresh connection up to ``publish_attempts`` times once it was handed to a
socket and its fate is unknown; the namespace's apply marker is checked once per
connection (see :mod:`delayq.topology.marker`). Registered in :data:`delayq.links.LINKS`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import pika
from pika.adapters.blocking_connection import BlockingChannel

from delayq.errors import ConnectionFailed, DelayqError, PublishBlocked
from delayq.links import LinkOptions, Settle
from delayq.message import outcomes
from delayq.message.envelope import OutgoingMessage
from delayq.retrying import CONNECT_BACKOFF_S, Reconnecting
from delayq.sync._connection import close_quietly, connect, host_parameters
from delayq.sync._errors import (
    CHANNEL_CLOSED,
    CHANNEL_GONE,
    channel_error,
    is_missing,
    publish_refusal,
)
from delayq.sync._pipeline import publish_pipelined, send_pipelined
from delayq.sync._sending import Source, check_header_frame, pika_properties
from delayq.sync.provision import apply_topology
from delayq.topology.marker import Gate
from delayq.topology.model import Topology
from delayq.topology.report import ApplyReport
from delayq.urls import parse_url, redact

__all__ = ["PikaLink", "pika_properties"]

log = logging.getLogger("delayq.publisher")


class PikaLink:
    """A :class:`~delayq.links.Link` to RabbitMQ through pika's blocking connection."""

    clock_ms: Callable[[], int] | None = None

    def __init__(self, url: str, gate: Gate, options: LinkOptions) -> None:
        self._url = url
        self._gate = gate
        self._publish_attempts = max(1, options.publish_attempts)
        self._reconnecting = Reconnecting(
            options.connect_attempts, CONNECT_BACKOFF_S, options.reconnect_within_s
        )
        self._backoff_s = options.retry_backoff_s
        self._blocked_timeout_s = options.blocked_timeout_s
        self._max_bytes = options.max_in_flight_bytes
        self._frame_max = options.frame_max
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._gated: pika.BlockingConnection | None = None  # the connection that passed it

    def __repr__(self) -> str:
        return f"PikaLink({redact(self._url)!r})"

    def connect(self) -> None:
        self._ensure_channel()

    def _ensure_channel(self) -> BlockingChannel:
        if self._connection is None or not self._connection.is_open:
            reconnecting = self._reconnecting
            self._connection = connect(
                self._url,
                name="delayq-publisher",
                attempts=reconnecting.attempts,
                within_s=reconnecting.within_s if reconnecting.up else None,
                blocked_timeout_s=self._blocked_timeout_s,
            )
            reconnecting.up = True
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
        """Refuse a namespace whose last apply did not complete.

        See :mod:`delayq.topology.marker`.
        """
        try:
            channel.exchange_declare(self._gate.marker, passive=True)
        except CHANNEL_CLOSED as exc:
            if is_missing(exc):
                raise self._gate.refusal() from exc
            raise channel_error(exc) from exc

    def _drop_connection(self) -> None:
        close_quietly(self._connection)
        self._connection = None
        self._channel = None

    def close(self) -> None:
        self._drop_connection()

    def apply(self, topology: Topology, *, raise_on_conflict: bool = True) -> ApplyReport:
        return apply_topology(topology, self._url, raise_on_conflict=raise_on_conflict)

    def send(self, msg: OutgoingMessage) -> None:
        properties = pika_properties(msg)
        last: BaseException | None = None
        handed_over = False  # once written to a socket, its fate is unknown until confirmed
        for attempt in range(self._publish_attempts):
            if attempt:
                time.sleep(self._backoff_s * 2 ** (attempt - 1))
            try:
                channel = self._ensure_channel()
                assert self._connection is not None
                check_header_frame(msg, properties, self._connection, self._frame_max)
                handed_over = True
                channel.basic_publish(
                    msg.exchange, msg.routing_key, msg.body, properties, mandatory=True
                )
                return
            except ConnectionFailed as exc:
                if not handed_over:
                    raise  # never sent: the connect retries are spent, say so plainly
                last = exc
                break
            except DelayqError:
                raise
            except Exception as exc:
                refusal = publish_refusal(exc, msg, self._blocked_timeout_s, redact(self._url))
                if isinstance(refusal, PublishBlocked):  # retrying cannot help while blocked
                    self._drop_connection()
                elif isinstance(exc, CHANNEL_CLOSED):
                    self._channel = None
                if refusal is not None:
                    raise refusal from exc
                if isinstance(exc, CHANNEL_GONE):
                    last = exc  # the channel went away under us: a new one may succeed
                    self._channel = None
                    continue
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

    def send_batch(self, built: list[OutgoingMessage], window: int) -> None:
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
            reconnecting=self._reconnecting,
            frame_max=self._frame_max,
            url_for_errors=redact(self._url),
            explain=broker.tls_failure,
            gate=self._gate,
        )

    def send_stream(self, messages: Iterable[OutgoingMessage], settle: Settle, window: int) -> None:
        self._stream(messages, settle, window, "delayq-publisher-stream")

    def send_live(self, source: Source, settle: Settle, window: int) -> None:
        """A stream fed as it goes: single publishes from many threads
        (:mod:`delayq.sync._shared`), the bridge's deliveries."""
        self._stream(source, settle, window, "delayq-publisher-shared")

    def _stream(
        self, messages: Iterable[OutgoingMessage] | Source, settle: Settle, window: int, name: str
    ) -> None:
        broker = parse_url(self._url)
        send_pipelined(
            host_parameters(self._url, name=name, blocked_timeout_s=self._blocked_timeout_s),
            messages,
            settle=settle,
            window=max(1, window),
            max_bytes=self._max_bytes,
            properties=pika_properties,
            attempts=self._publish_attempts,
            backoff_s=self._backoff_s,
            reconnecting=self._reconnecting,
            frame_max=self._frame_max,
            url_for_errors=redact(self._url),
            explain=broker.tls_failure,
            gate=self._gate,
        )
