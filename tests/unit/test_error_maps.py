"""The adapters' error maps: what each pika / aiormq exception becomes (no broker)."""

from __future__ import annotations

from types import SimpleNamespace

import aiormq.exceptions as aex
import pika.exceptions as pex
import pytest
from pamqp.commands import Basic

from delayq import errors
from delayq.aio import _errors as aio_errors
from delayq.links import FeedLost
from delayq.message.envelope import OutgoingMessage, Receipt
from delayq.sync import _errors as sync_errors
from delayq.urls import parse_url

MISSING = "NOT_FOUND - no exchange 'ns.tier.30s' in vhost '/'"
CONFLICT = (
    "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'ns.tier.30s' in "
    "vhost '/': received the value '30000' of type 'long' but current is none"
)
REFUSED = "ACCESS_REFUSED - access to queue 'ns.work' in vhost '/' refused for user 'app'"
URL = "amqp://app:s3cret@localhost:5672/"


def _msg() -> OutgoingMessage:
    return OutgoingMessage(
        exchange="ns.tier.30s",
        routing_key="job.a",
        body=b"{}",
        headers={},
        content_type="application/json",
        message_id="m1",
        timestamp_s=0,
        receipt=Receipt("m1", "job.a", "ns.tier.30s", "30s", 30_000, 30_000, 0),
    )


def _aio_closed(kind: type[Exception], text: str) -> Exception:
    return kind(SimpleNamespace(reply_code=0, reply_text=text))


@pytest.mark.parametrize(
    ("code", "text", "expected"),
    [
        (404, MISSING, errors.TopologyMissing),
        (406, CONFLICT, errors.TopologyConflict),
        (403, REFUSED, errors.AccessRefused),
        (541, "INTERNAL_ERROR", errors.BrokerError),
    ],
)
def test_a_channel_the_broker_closed_means_the_same_in_both_adapters(
    code: int, text: str, expected: type[errors.DelayqError]
) -> None:
    from_pika = sync_errors.channel_error(pex.ChannelClosedByBroker(code, text))
    from_aiormq = aio_errors.channel_error(_aio_closed(aex.AMQPChannelError, text))
    assert type(from_pika) is type(from_aiormq) is expected
    assert sync_errors.is_missing(pex.ChannelClosedByBroker(code, text)) is (code == 404)


def test_only_a_404_is_missing() -> None:
    assert aio_errors.is_missing(_aio_closed(aex.ChannelNotFoundEntity, MISSING))
    assert not aio_errors.is_missing(_aio_closed(aex.ChannelAccessRefused, REFUSED))
    assert not sync_errors.is_missing(pex.StreamLostError("gone"))
    assert sync_errors.closed_by_broker(pex.ChannelClosedByClient(200, "bye")) is None
    assert isinstance(
        sync_errors.closed_by_broker(pex.ChannelClosedByBroker(404, MISSING)),
        errors.TopologyMissing,
    )


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (pex.UnroutableError([]), errors.Unroutable),
        (pex.NackError([]), errors.PublishRejected),
        (pex.ConnectionBlockedTimeout(), errors.PublishBlocked),
        (pex.ChannelClosedByBroker(404, MISSING), errors.TopologyMissing),
        (pex.ChannelClosedByBroker(403, REFUSED), errors.AccessRefused),
        (pex.ChannelClosedByBroker(406, CONFLICT), errors.PublishRejected),
        (pex.StreamLostError("gone"), None),
        (pex.ChannelWrongStateError("closed"), None),
        (ConnectionResetError(), None),
    ],
)
def test_what_a_failed_sync_publish_means(exc: BaseException, expected: type | None) -> None:
    refusal = sync_errors.publish_refusal(exc, _msg(), 30, "amqp://localhost/")
    if expected is None:
        assert refusal is None  # the link re-sends on a fresh channel or connection
    else:
        assert type(refusal) is expected
        assert "m1" in str(refusal) or expected in (errors.TopologyMissing, errors.AccessRefused)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (
            aex.PublishError(
                SimpleNamespace(delivery=Basic.Return(312, "NO_ROUTE", "ns.ready", "job.a")),
                None,
            ),
            errors.Unroutable,
        ),
        (aex.DeliveryError(None, None), errors.PublishRejected),
        (_aio_closed(aex.ChannelNotFoundEntity, MISSING), errors.TopologyMissing),
        (_aio_closed(aex.ChannelAccessRefused, REFUSED), errors.AccessRefused),
        (_aio_closed(aex.ChannelPreconditionFailed, CONFLICT), errors.PublishRejected),
        (aex.ConnectionClosed(320, "CONNECTION_FORCED"), None),
        (Exception("aiormq's bare close"), None),
    ],
)
def test_what_a_failed_async_publish_means(exc: BaseException, expected: type | None) -> None:
    refusal = aio_errors.publish_refusal(exc, _msg())
    assert (refusal is None) if expected is None else (type(refusal) is expected)


def test_a_refused_consume_is_final_anything_else_reopens_the_feed() -> None:
    assert isinstance(
        sync_errors.feed_lost(pex.ChannelClosedByBroker(403, REFUSED)), errors.AccessRefused
    )
    for exc in (
        pex.ChannelClosedByBroker(406, "PRECONDITION_FAILED - consumer ack timed out"),
        pex.StreamLostError("gone"),
        ConnectionResetError(),
    ):
        assert isinstance(sync_errors.feed_lost(exc), FeedLost)


def test_why_a_connect_failed_for_good_and_no_secret_shown() -> None:
    broker = parse_url(URL)
    for error in (
        sync_errors.connect_error(pex.ProbableAuthenticationError("x"), URL, broker),
        aio_errors.connect_error(aex.ProbableAuthenticationError("x"), URL, broker),
    ):
        assert isinstance(error, errors.ConnectionRejected)  # a ConnectionFailed too
        assert "refused the credentials" in str(error) and "s3cret" not in str(error)
    vhost = sync_errors.connect_error(pex.ProbableAccessDeniedError("x"), URL, broker)
    assert "vhost" in str(vhost) and isinstance(vhost, errors.ConnectionRejected)
    assert "vhost" in str(
        aio_errors.connect_error(_aio_closed(aex.ChannelAccessRefused, ""), URL, broker)
    )
    bad_url = aio_errors.connect_error(ValueError("bad port"), URL, broker)
    assert isinstance(bad_url, errors.ConnectionFailed) and "s3cret" not in str(bad_url)
    # A refused TCP connection may succeed on the next attempt: not final.
    assert sync_errors.connect_error(ConnectionRefusedError(), URL, broker) is None
    assert aio_errors.connect_error(TimeoutError(), URL, broker) is None
    assert aio_errors.connect_error(Exception("handshake cut short"), URL, broker) is None


def test_a_connection_that_failed_to_open_becomes_an_exception() -> None:
    assert isinstance(sync_errors.connection_lost("refused"), pex.AMQPConnectionError)
    lost = ConnectionResetError()
    assert sync_errors.connection_lost(lost) is lost
