"""A URL naming several hosts: clients skip the ones that do not answer, on both adapters."""

from __future__ import annotations

import asyncio
import random
from urllib.parse import urlsplit

from delayq import Message
from delayq.local.node import free_port
from delayq.urls import host_label, host_urls


def _with_dead_hosts(url: str) -> str:
    """``url`` with two closed ports around its host: ``dead, live, dead``."""
    parts = urlsplit(url)
    userinfo, _, live = parts.netloc.rpartition("@")
    hosts = f"127.0.0.1:{free_port()},{live},127.0.0.1:{free_port()}"
    netloc = f"{userinfo}@{hosts}" if userinfo else hosts
    rest = url.split(parts.netloc, 1)[1]
    return f"{parts.scheme}://{netloc}{rest}"


def test_publishers_reach_the_live_host_of_a_multi_host_url(
    driver_for, rabbitmq_url, make_topology, collect
):
    url = _with_dead_hosts(rabbitmq_url)
    topo = make_topology(["1s"])
    driver = driver_for(url)
    driver.apply(topo)
    inbox = collect(f"{topo.namespace}.work")
    one = driver.publish(topo, {"n": 0}, "job.multi", "0s", message_id="multi-0")
    batch = driver.publish_many(
        topo, [Message({"n": n}, "job.multi", "1s", message_id=f"multi-{n}") for n in range(1, 300)]
    )
    assert one.message_id == "multi-0" and len(batch) == 299
    arrived = {a.message_id for a in inbox.wait(300, timeout_s=20)}
    assert arrived == {f"multi-{n}" for n in range(300)}


def test_connect_tries_the_hosts_in_turn_from_where_the_rng_says(rabbitmq_url):
    from delayq.aio._connection import connect as connect_async
    from delayq.sync._connection import connect as connect_sync

    url = _with_dead_hosts(rabbitmq_url)
    live = host_label(host_urls(url)[1])
    for seed in range(6):  # starts on a dead host or on the live one; always ends on the live one
        connection = connect_sync(url, attempts=1, rng=random.Random(seed))
        try:
            assert f"{connection._impl.params.host}:{connection._impl.params.port}" == live
        finally:
            connection.close()

    async def run() -> None:
        for seed in range(6):
            connection = await connect_async(url, attempts=1, rng=random.Random(seed))
            try:
                assert f"{connection.url.host}:{connection.url.port}" == live
            finally:
                await connection.close()

    asyncio.run(run())
