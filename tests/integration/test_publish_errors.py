"""Client errors under a batch, on a real broker: a delayq error, never a lost confirm.

What must never happen is a message reported confirmed that did not arrive. A
message reported unconfirmed may still have arrived (its confirm was lost with
the connection); publishing it again with the same id is safe.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import aiormq.channel
import pika
import pika.channel
import pika.exceptions as pex
import pytest

from delayq import Message, PublishBatchError, PublishError, Receipt, Topology, Unroutable
from delayq.aio import AsyncPublisher
from delayq.aio._wire import Wire
from delayq.links import ASYNC_LINKS
from delayq.local.node import LocalNode
from delayq.sync import Publisher, apply_topology
from delayq.sync import _round as sync_round


def publish_many(kind: str, url: str, topo: Topology, batch: list[Message], **kw: Any) -> Any:
    """Receipts, or the PublishBatchError the batch raised (anything else propagates)."""
    try:
        if kind == "sync":
            with Publisher(url, topo, **kw) as pub:
                return pub.publish_many(batch)

        async def run() -> list[Receipt]:
            async with AsyncPublisher(url, topo, **kw) as pub:
                return await pub.publish_many(batch)

        return asyncio.run(run())
    except PublishBatchError as exc:
        return exc


FIRED: list[str] = []
"""One entry each time an injected fault fired (the test checks it did)."""


def fail_once_after(kind: str, calls: int) -> tuple[Any, str, Callable[..., Any]]:
    """A publish of the client that raises once, at call ``calls``, what the client
    raises when its connection goes away under it."""
    FIRED.clear()
    count = 0
    if kind == "sync":  # the pipeline writes delayq's frames through frames_writer
        original = sync_round.frames_writer

        def sync_writer(channel: Any) -> Any:
            write = original(channel)
            assert write is not None, "pika's internals for delayq's frames are missing"

            def sync_publish(frames: bytes) -> None:
                nonlocal count
                count += 1
                if count == calls:
                    FIRED.append(kind)
                    raise pex.ChannelWrongStateError("Channel is closed.")
                write(frames)

            return sync_publish

        return sync_round, "frames_writer", sync_writer
    original_async = aiormq.channel.Channel.basic_publish

    async def async_publish(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal count
        count += 1
        if count == calls:
            FIRED.append(kind)
            raise Exception  # aiormq's reject_all(None) on a closing connection
        return await original_async(self, *args, **kwargs)

    if kind == "async":  # the frame link: the connection dies under the publish
        original_wire = Wire.publish

        def wire_publish(self: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal count
            count += 1
            if count == calls and self.transport is not None:
                FIRED.append(kind)
                self.transport.abort()  # as a reset connection does: the loop reports it
            return original_wire(self, *args, **kwargs)

        return Wire, "publish", wire_publish
    return aiormq.channel.Channel, "basic_publish", async_publish


def wait_for_ids(inbox: Any, wanted: set[str], timeout_s: float = 60) -> set[str]:
    """The ids that arrived, once ``wanted`` all did or the time is up (duplicates count
    once: a message whose confirm was lost is sent again)."""
    deadline = time.monotonic() + timeout_s
    while True:
        arrived = {a.message_id for a in inbox.wait(0, timeout_s=0)}
        if wanted <= arrived or time.monotonic() > deadline:
            return arrived
        time.sleep(0.05)


@pytest.fixture(params=["sync", "async", "async-aiopika"])
def kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``async``: the default frame link; ``async-aiopika``: the aio-pika link, still
    offered (``link=``), whose client errors have their own translation."""
    if request.param == "async-aiopika":
        monkeypatch.setitem(ASYNC_LINKS, "amqp", "delayq.aio._link:AioPikaLink")
    return str(request.param)


def test_a_client_error_mid_batch_is_translated_and_what_it_left_is_sent_again(
    kind: str,
    rabbitmq_url: str,
    make_topology: Callable[..., Topology],
    collect: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    batch = [Message(b"x", "job.err", "0s", message_id=f"mid-{n}") for n in range(3_000)]
    monkeypatch.setattr(*fail_once_after(kind, 1_200))
    result = publish_many(kind, rabbitmq_url, topo, batch)
    assert FIRED == [kind]  # the fault was injected into the path under test
    assert not isinstance(result, PublishBatchError), result  # re-sent on a fresh connection
    assert [r.message_id for r in result] == [m.message_id for m in batch]
    inbox = collect(f"{topo.namespace}.work")
    wanted = {m.message_id for m in batch}
    assert wanted <= wait_for_ids(inbox, wanted)


def test_connections_closed_under_a_batch_never_report_a_lost_message_confirmed(
    kind: str,
    local_rabbitmq_node: LocalNode,
    make_topology: Callable[..., Topology],
    collect: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """All on the node whose connections the test closes: applied, published, watched
    and collected there (the topology was once applied on $RABBITMQ_URL, and the test
    failed whenever that named another broker)."""
    caplog.set_level(logging.WARNING, logger="delayq")
    url = local_rabbitmq_node.url
    topo = make_topology(["1s"])
    apply_topology(topo, url)
    queue = f"{topo.namespace}.work"
    watcher = pika.BlockingConnection(pika.URLParameters(url))

    def work_queue_depth(name: str) -> int:
        return int(watcher.channel().queue_declare(name, passive=True).method.message_count)

    batch = [Message(b"y" * 128, "job.err", "0s", message_id=f"cut-{n}") for n in range(10_000)]

    def close_when_publishing() -> None:
        deadline = time.monotonic() + 60
        while work_queue_depth(queue) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        local_rabbitmq_node.ctl("close_all_connections", "delayq publish-errors test", check=False)

    closer = threading.Thread(target=close_when_publishing, daemon=True)
    closer.start()
    # One attempt per message: the lost connection leaves messages unconfirmed.
    result = publish_many(
        kind, local_rabbitmq_node.url, topo, batch, publish_attempts=1, connect_attempts=1
    )
    closer.join(60)
    try:
        watcher.close()
    except Exception:
        pass  # closed with the others: it was only watching
    if isinstance(result, PublishBatchError):
        confirmed = {r.message_id for r in result.receipts if r is not None}
        unconfirmed = {batch[i].message_id for i in result.failures}
        for index, failure in result.failures.items():
            assert isinstance(failure, PublishError)
            assert failure.message_id == batch[index].message_id
    else:
        confirmed, unconfirmed = {r.message_id for r in result}, set()
    # One line per lost connection, not one per message in flight.
    publisher_lines = [r for r in caplog.records if r.name == "delayq.publisher"]
    assert len(publisher_lines) <= 10, len(publisher_lines)
    assert confirmed | unconfirmed == {m.message_id for m in batch}
    assert not confirmed & unconfirmed
    inbox = collect(queue, url=url)
    arrived = wait_for_ids(inbox, confirmed)
    assert confirmed <= arrived, f"{len(confirmed - arrived)} confirmed messages did not arrive"


def test_a_return_is_pinned_on_the_message_it_names_when_two_share_an_id(
    kind: str, rabbitmq_url: str, make_topology: Callable[..., Topology]
) -> None:
    """Two messages with one id in one batch, the first routable, the second returned
    (its tier queue is gone): the batch must report the second unroutable, not the
    first. Matching a return by message id alone blamed the first."""
    topo = make_topology(["1s", "30s"])
    apply_topology(topo, rabbitmq_url)
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        connection.channel().queue_delete(topo.tier_name(topo.ladder.tiers[0]))
    finally:
        connection.close()
    batch = [
        Message(b"kept", "job.twin", "30s", message_id="twin"),  # tier 30s: routable
        Message(b"lost", "job.twin", "1s", message_id="twin"),  # tier 1s: no queue
    ]
    result = publish_many(kind, rabbitmq_url, topo, batch, publish_attempts=1)
    assert isinstance(result, PublishBatchError), result
    assert sorted(result.failures) == [1], result.failures
    assert isinstance(result.failures[1], Unroutable)
    assert result.receipts[0] is not None and result.receipts[1] is None
