"""A publisher opened before a fork (gunicorn ``--preload``, Celery's prefork pool) is used
in the child: the child must open a connection of its own, never write on its parent's
socket nor take its parent's confirms for its own."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable

import pika

from delayq import Message, Topology
from delayq.aio import AsyncPublisher
from delayq.sync import Publisher, apply_topology

COUNT = 2000


def in_child(work: Callable[[], object]) -> tuple[int, Callable[[], object]]:
    """Fork; the child runs ``work`` and reports what it returned (or raised) on a pipe.
    Returns the child's pid and a function that waits for its report."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read)
            try:
                report = {"ok": work()}
            except BaseException as exc:
                report = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(write, json.dumps(report).encode())
        finally:
            os._exit(code)
    os.close(write)

    def result() -> object:
        chunks = []
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
        os.close(read)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        report = json.loads(b"".join(chunks) or b"{}")
        assert "ok" in report, report
        return report["ok"]

    return pid, result


def depth(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def messages(tag: str) -> list[Message]:
    return [Message({"n": n}, "job.forked", "1h", message_id=f"{tag}-{n}") for n in range(COUNT)]


def test_a_sync_publisher_used_on_both_sides_of_a_fork(make_topology, rabbitmq_url):
    topo: Topology = make_topology(["1h"])
    tier = topo.tier_name(topo.ladder.tiers[0])
    apply_topology(topo, rabbitmq_url)
    with Publisher(rabbitmq_url, topo) as publisher:
        publisher.publish({"n": -1}, "job.forked", "1h")  # connected before the fork

        def child() -> int:
            return len(publisher.publish_many(messages("child")))

        _, child_result = in_child(child)
        parent_receipts = publisher.publish_many(messages("parent"))
        assert child_result() == COUNT
        assert len(parent_receipts) == COUNT
        # The parent's connection outlived the child's exit.
        publisher.publish({"n": -2}, "job.forked", "1h")
    assert depth(rabbitmq_url, tier) == 2 * COUNT + 2


def test_an_async_publisher_opened_before_a_fork_works_in_the_child(make_topology, rabbitmq_url):
    """Its connection belongs to the parent's event loop, which never runs in the child:
    frames queued there are never written, and the child would wait out its confirm
    timeout (600 s here, past the 60 s the child is given) before reconnecting."""
    topo: Topology = make_topology(["1h"])
    tier = topo.tier_name(topo.ladder.tiers[0])
    apply_topology(topo, rabbitmq_url)
    publisher = AsyncPublisher(rabbitmq_url, topo, confirm_timeout_s=600)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(publisher.publish({"n": -1}, "job.forked", "1h"))

        def child() -> int:
            async def main() -> int:
                return len(await publisher.publish_many(messages("child")))

            return asyncio.run(asyncio.wait_for(main(), 60))

        _, child_result = in_child(child)
        parent = loop.run_until_complete(publisher.publish_many(messages("parent")))
        assert child_result() == COUNT
        assert len(parent) == COUNT
        loop.run_until_complete(publisher.publish({"n": -2}, "job.forked", "1h"))
        loop.run_until_complete(publisher.aclose())
    finally:
        loop.close()
    assert depth(rabbitmq_url, tier) == 2 * COUNT + 2
