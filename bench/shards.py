"""Burst drain rate of one tier spread over K shards (``shards: K`` in the topology).

For each K of ``--shards`` (default 1,2,4), one after the other on the same broker:

1. apply a throwaway namespace with one tier (``--ttl``, default 60s), ``shards: K``
   and one destination queue;
2. park ``--messages`` messages in that tier, each into the shard delayq's
   ``Router`` picks for its id (raw pika, no confirms, so parking is quick; the
   tier's total depth is awaited before the burst). Each carries a per-message
   ``expiration`` that makes *every* message due at one instant (``--window``
   seconds after parking starts): RabbitMQ expires messages at a queue's head,
   and the head is always as due as the rest, so at that instant the whole
   backlog is due at once, a burst, not the publishing rate spread out again;
3. poll the destination queue's depth (a passive declare every 20 ms) until all
   arrived: the drain rate is messages / (last arrival - due instant), and the
   10%-90% rate is 80% of the messages over the time between those depths.

The K=1 figure of the same run is the baseline: each row prints its ratio to it.
``--cluster 3`` starts a local 3-node cluster (``delayq.local.cluster``) for the
run and stops it after, and prints which node leads each shard.

Run it::

    python bench/shards.py                                   # local throwaway node
    python bench/shards.py --messages 100000 --shards 1,2,4,8
    python bench/shards.py --cluster 3
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pika
from benchlib import admin_channel, broker, broker_version, command_line, load_average, log

from delayq.local.cluster import LocalCluster
from delayq.local.probes import tidy_epmd
from delayq.sync.provision import apply_topology, delete_topology
from delayq.topology.model import Topology
from delayq.topology.route import Router

POLL_S = 0.02


@dataclass
class Result:
    shards: int
    parked_s: float
    drain_s: float
    rate: float
    mid_rate: float
    spread: str


def _topology(shards: int, ttl: str) -> Topology:
    namespace = f"bench-shards-{shards}-{secrets.token_hex(3)}"
    return Topology(
        namespace=namespace,
        ladder=[ttl],
        shards=shards,
        destinations=[{"queue": f"{namespace}.inbox", "bindings": ["bench.#"]}],
    )


def _depth(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def _park(url: str, topology: Topology, messages: int, due: float) -> None:
    """Publish every message into its shard, all due at ``due`` (time.time())."""
    router = Router(topology)
    delay_ms = topology.ladder.tiers[0].ttl_ms
    body = b'{"bench": true}'
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for i in range(messages):
            message_id = f"bench-{i}"
            route = router.to_destinations(delay_ms, "bench.shard", message_id=message_id)
            left_ms = int((due - time.time()) * 1000)
            if left_ms < 1:
                raise SystemExit("parking overran --window: raise it, or lower --messages")
            properties = pika.BasicProperties(
                message_id=message_id, expiration=str(left_ms), delivery_mode=2
            )
            channel.basic_publish(route.exchange, route.routing_key, body, properties)
            if i % 5000 == 4999:
                connection.process_data_events(0)
    finally:
        connection.close()


def _measure(url: str, topology: Topology, messages: int, window_s: float) -> Result:
    tier = topology.ladder.tiers[0]
    shards = topology.tier_shards(tier)
    inbox = topology.destinations[0].queue
    started = time.time()
    due = started + window_s
    _park(url, topology, messages, due)
    with admin_channel(url) as channel:
        while sum(_depth(channel, name) for name in shards) < messages:
            if time.time() > due:
                raise SystemExit("messages were still arriving in the tier at the due instant")
            time.sleep(POLL_S)
        parked_s = time.time() - started
        spread = "/".join(str(_depth(channel, name)) for name in shards)
        marks: dict[float, float] = {}
        while True:
            now, depth = time.time(), _depth(channel, inbox)
            for share in (0.1, 0.9, 1.0):
                if share not in marks and depth >= share * messages:
                    marks[share] = now
            if depth >= messages:
                break
            if now > due + 600:
                raise SystemExit(f"only {depth} of {messages} arrived in 10 minutes")
            time.sleep(POLL_S)
    drain_s = marks[1.0] - due
    mid_s = max(marks[0.9] - marks[0.1], POLL_S)
    return Result(
        len(shards), parked_s, drain_s, messages / drain_s, 0.8 * messages / mid_s, spread
    )


@contextlib.contextmanager
def _target(args: argparse.Namespace) -> Iterator[tuple[str, LocalCluster | None]]:
    if args.cluster:
        log(f"starting a local {args.cluster}-node cluster ...")
        with tidy_epmd(), LocalCluster(args.cluster) as cluster:
            cluster.start()
            log("cluster up")
            yield cluster.url.split(",")[0] + "/", cluster
            log("stopping the cluster ...")
        return
    with broker(args.url) as (url, _node):
        yield url, None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="broker (default: $RABBITMQ_URL, else a local node)")
    parser.add_argument("--cluster", type=int, default=0, help="start a local N-node cluster")
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--shards", default="1,2,4", help="the K values, comma-separated")
    parser.add_argument("--ttl", default="60s", help="the tier's TTL (an upper bound)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds to park in")
    args = parser.parse_args(argv)
    counts = [int(k) for k in args.shards.split(",")]
    results: list[Result] = []
    with _target(args) as (url, cluster):
        version = broker_version(url)
        for shards in counts:
            topology = _topology(shards, args.ttl)
            apply_topology(topology, url)
            try:
                log(f"K={shards}: parking {args.messages} messages ...")
                results.append(_measure(url, topology, args.messages, args.window))
                if cluster is not None:
                    leaders = cluster.queue_leaders()
                    names = topology.tier_shards(topology.ladder.tiers[0])
                    log(f"K={shards} leaders: {[leaders.get(n, '?') for n in names]}")
                    results[-1].spread += " @ " + ",".join(
                        leaders.get(n, "?").split("@")[0].removeprefix("delayq-") for n in names
                    )
            finally:
                delete_topology(topology, url)
    base = next((r.rate for r in results if r.shards == 1), None)
    print(f"# {command_line(argv)}")
    where = f"local {args.cluster}-node cluster" if args.cluster else "one node"
    print(f"# {version}, {where}, {args.messages} messages per K, load {load_average()}")
    print(
        f"{'K':>3} {'parked s':>9} {'drain s':>8} {'msg/s':>8} {'10-90% msg/s':>13} "
        f"{'vs K=1':>7}  per shard"
    )
    for r in results:
        ratio = f"{r.rate / base:.2f}x" if base else "-"
        print(
            f"{r.shards:>3} {r.parked_s:>9.1f} {r.drain_s:>8.2f} {r.rate:>8,.0f} "
            f"{r.mid_rate:>13,.0f} {ratio:>7}  {r.spread}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
