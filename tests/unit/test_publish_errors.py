"""Every client error of a publish surfaces as a delayq error naming the unconfirmed messages.

aiormq fails the futures of a connection that closes under a publish with a bare
``Exception`` (its ``reject_all`` default), ``RuntimeError``, a ``ConnectionError``
or ``ChannelInvalidStateError``; pika raises its own. Fakes stand in for the
client here: a channel whose publishes start failing mid-batch, and a fresh
connection that either works or cannot be opened. The real-broker counterpart
is tests/integration/test_publish_errors.py.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable
from typing import Any

import aiormq.exceptions as aex
import pika
import pika.exceptions as pex
import pytest

from delayq import (
    ConnectionFailed,
    DelayqError,
    Message,
    PublishBatchError,
    PublishUnconfirmed,
    Topology,
)
from delayq.aio import AsyncPublisher
from delayq.links import ASYNC_LINKS
from delayq.sync import Publisher

TOPO = Topology(
    namespace="errs", ladder=["1s"], destinations=[{"queue": "errs.work", "bindings": ["job.#"]}]
)
URL = "amqp://guest:guest@127.0.0.1:1/"

FAILURES: list[Callable[[], BaseException]] = [
    lambda: Exception(),  # aiormq's reject_all(None): the class itself, instantiated
    lambda: Exception("writer closed"),
    lambda: ConnectionResetError(104, "Connection reset by peer"),
    lambda: aex.ChannelInvalidStateError("writer is None"),
    lambda: RuntimeError("<Connection: ...> closed"),
]
IDS = ["bare", "bare-text", "reset", "invalid-state", "runtime"]


class FakeExchange:
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn

    async def publish(
        self, message: Any, routing_key: str, *, mandatory: bool, timeout: Any
    ) -> None:
        await asyncio.sleep(0)  # other senders run: many messages are in flight at once
        self.conn.before_confirm(message.message_id)
        self.conn.confirmed.append(message.message_id)


class FakeChannel:
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn
        self.is_closed = False

    async def get_exchange(self, name: str, ensure: bool = False) -> FakeExchange:
        return FakeExchange(self.conn)

    async def close(self) -> None:
        self.is_closed = True


class FakeConnection:
    """A connection whose publishes confirm until ``fail_after``, then all raise ``error``."""

    def __init__(
        self, confirmed: list[str], fail_after: int | None, error: Callable[[], BaseException]
    ) -> None:
        self.confirmed = confirmed
        self.fail_after = fail_after
        self.error = error
        self.is_closed = False
        self.sent = 0

    def before_confirm(self, message_id: str) -> None:
        self.sent += 1
        if self.fail_after is not None and self.sent > self.fail_after:
            raise self.error()

    async def channel(self, **kwargs: Any) -> FakeChannel:
        if self.is_closed:
            raise RuntimeError("closed")
        return FakeChannel(self)

    async def close(self) -> None:
        self.is_closed = True


def fake_connect(
    monkeypatch: pytest.MonkeyPatch, confirmed: list[str], plan: list[FakeConnection | None]
) -> list[int]:
    """``connect`` hands out the connections of ``plan`` in turn; ``None``: cannot connect.
    Returns a list that counts the calls."""
    calls: list[int] = []

    async def connect(url: str, **kwargs: Any) -> FakeConnection:
        calls.append(1)
        step = plan.pop(0) if plan else None
        if step is None:
            raise ConnectionFailed("cannot connect to the broker (fake)")
        return step

    monkeypatch.setattr("delayq.aio._link.connect", connect)
    # These fakes are aio-pika's: the aio-pika link serves the URL (the frame link's
    # counterparts run on a real broker: tests/integration/test_frame_link.py).
    monkeypatch.setitem(ASYNC_LINKS, "amqp", "delayq.aio._link:AioPikaLink")
    return calls


def batch(n: int) -> list[Message]:
    return [Message(b"x", "job.a", "1s", message_id=f"m-{i}") for i in range(n)]


@pytest.mark.parametrize("error", FAILURES, ids=IDS)
def test_a_batch_whose_connection_dies_names_exactly_the_unconfirmed(
    monkeypatch: pytest.MonkeyPatch, error: Callable[[], BaseException]
) -> None:
    confirmed: list[str] = []
    first = FakeConnection(confirmed, 120, error)
    calls = fake_connect(monkeypatch, confirmed, [first])  # then none can be opened

    async def run() -> PublishBatchError:
        pub = AsyncPublisher(URL, TOPO, retry_backoff_s=0)
        with pytest.raises(PublishBatchError) as caught:
            await pub.publish_many(batch(500), window=50)
        return caught.value

    exc = asyncio.run(run())
    assert len(confirmed) == 120
    unconfirmed = {f"m-{i}" for i in exc.failures}
    assert unconfirmed == {f"m-{i}" for i in range(500)} - set(confirmed)
    for index, failure in exc.failures.items():
        assert isinstance(failure, PublishUnconfirmed)
        assert failure.message_id == f"m-{index}" and f"'m-{index}'" in str(failure)
    receipts = {r.message_id for r in exc.receipts if r is not None}
    assert receipts == set(confirmed)  # nothing reported confirmed that was not
    # Those in flight (the window) may each try to reconnect; the rest fail at once.
    assert len(calls) <= 1 + 50 * 3, len(calls)


@pytest.mark.parametrize("error", FAILURES, ids=IDS)
def test_a_batch_resent_on_a_fresh_connection_is_all_confirmed(
    monkeypatch: pytest.MonkeyPatch, error: Callable[[], BaseException]
) -> None:
    confirmed: list[str] = []
    fake_connect(
        monkeypatch,
        confirmed,
        [FakeConnection(confirmed, 70, error), FakeConnection(confirmed, None, error)],
    )

    async def run() -> list[Any]:
        pub = AsyncPublisher(URL, TOPO, retry_backoff_s=0)
        return await pub.publish_many(batch(300), window=40)

    receipts = asyncio.run(run())
    assert [r.message_id for r in receipts] == [f"m-{i}" for i in range(300)]
    assert set(confirmed) == {f"m-{i}" for i in range(300)}


@pytest.mark.parametrize("error", FAILURES, ids=IDS)
def test_a_single_publish_raises_publish_unconfirmed_naming_it(
    monkeypatch: pytest.MonkeyPatch, error: Callable[[], BaseException]
) -> None:
    confirmed: list[str] = []
    plan: list[FakeConnection | None] = [FakeConnection(confirmed, 0, error) for _ in range(3)]
    fake_connect(monkeypatch, confirmed, plan)

    async def run() -> None:
        pub = AsyncPublisher(URL, TOPO, retry_backoff_s=0)
        await pub.publish(b"x", "job.a", "1s", message_id="single-1")

    with pytest.raises(PublishUnconfirmed, match="'single-1'") as caught:
        asyncio.run(run())
    assert caught.value.message_id == "single-1"
    assert not plan and not confirmed  # each of the 3 attempts on a fresh connection


def test_one_lost_connection_logs_one_warning_and_one_short_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Thousands of messages in flight fail together: the log and the error stay small."""
    confirmed: list[str] = []
    fake_connect(monkeypatch, confirmed, [FakeConnection(confirmed, 10, Exception)])
    caplog.set_level(logging.WARNING, logger="delayq")

    async def run() -> PublishBatchError:
        pub = AsyncPublisher(URL, TOPO, retry_backoff_s=0)
        with pytest.raises(PublishBatchError) as caught:
            await pub.publish_many(batch(2_000), window=1_000)
        return caught.value

    exc = asyncio.run(run())
    assert len(exc.failures) == 2_000 - 10
    warnings = [r for r in caplog.records if r.name.startswith("delayq")]
    assert 1 <= len(warnings) <= 3, [r.getMessage() for r in warnings]
    printed = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    assert len(printed) < 5_000, len(printed)


def test_a_batch_whose_first_check_fails_with_a_bare_exception_raises_connection_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Refusing(FakeConnection):
        async def channel(self, **kwargs: Any) -> FakeChannel:
            raise Exception  # aiormq, on a connection closing during channel.open

    fake_connect(monkeypatch, [], [Refusing([], None, Exception)])

    async def run() -> None:
        pub = AsyncPublisher(URL, TOPO, retry_backoff_s=0)
        await pub.publish_many(batch(5))

    with pytest.raises(ConnectionFailed, match="nothing of it was sent"):
        asyncio.run(run())


# --- sync: Publisher.send on a BlockingChannel that raises what pika raises mid-publish -----


class FakeBlockingChannel:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error
        self.is_open = True
        self.published: list[str] = []

    def confirm_delivery(self) -> None:
        pass

    def exchange_declare(self, name: str, passive: bool = False) -> None:
        pass  # the apply marker's check: present

    def basic_publish(self, exchange: str, key: str, body: bytes, props: Any, **kw: Any) -> None:
        if self.error is not None:
            raise self.error
        self.published.append(props.message_id)

    def close(self) -> None:
        self.is_open = False


class FakeBlockingConnection:
    def __init__(self, error: BaseException | None) -> None:
        self.chan = FakeBlockingChannel(error)
        self.is_open = True
        self.params = pika.ConnectionParameters()  # frame_max as negotiated: the default

    def channel(self) -> FakeBlockingChannel:
        return self.chan

    def close(self) -> None:
        self.is_open = False


SYNC_FAILURES: list[BaseException] = [
    Exception("unexpected"),
    pex.ReentrancyError(),
    pex.AMQPError("frame error"),
    AssertionError("pika internal state"),
]


@pytest.mark.parametrize("error", SYNC_FAILURES, ids=lambda e: type(e).__name__)
def test_sync_send_translates_any_pika_error_and_retries_on_a_fresh_connection(
    monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    connections = [FakeBlockingConnection(error), FakeBlockingConnection(None)]
    monkeypatch.setattr("delayq.sync._link.connect", lambda *a, **k: connections.pop(0))
    pub = Publisher(URL, TOPO, retry_backoff_s=0)
    receipt = pub.publish(b"x", "job.a", "1s", message_id="sync-1")
    assert receipt.message_id == "sync-1" and not connections

    pub.close()
    monkeypatch.setattr(
        "delayq.sync._link.connect", lambda *a, **k: FakeBlockingConnection(error)
    )
    with pytest.raises(PublishUnconfirmed, match="'sync-2'") as caught:
        pub.publish(b"x", "job.a", "1s", message_id="sync-2")
    assert isinstance(caught.value, DelayqError) and caught.value.message_id == "sync-2"
