"""Throughput of ``delayq bridge`` (an intake's relay) against a raw pika relay.

Both drain ``--count`` plugin-style messages (``x-delay`` header, raw pika publishes)
from the intake queue of a throwaway namespace into its tiers, each publish confirmed
before its delivery is acked, prefetch ``--prefetch``:

1. raw pika: one connection consuming, one publishing on a confirm channel; each
   message of a batch in hand published to the tier its ``x-delay`` names (a dict
   lookup, nothing checked, its properties as they came), pika's blocking confirm per
   publish, then the batch acked: what a relay written by hand on pika does;
2. delayq's :class:`~delayq.sync.bridge.Bridge`: reading ``x-delay`` as the plugin did,
   choosing the tier, the message id, the properties carried, the DLQ for what cannot
   be scheduled, pipelined confirms.

The clock runs from the first delivery to the last ack (the intake queue's depth read
every ``POLL_S``). Reported: messages per second (median of ``--rounds``), client CPU
per message (this process's ``time.process_time``), and the ratio delayq / raw.

    .venv/bin/python bench/bridge.py --count 20000 --rounds 3
    DELAYQ_RABBITMQ_SERVER=4.0 .venv/bin/python bench/bridge.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pika
from benchlib import (
    broker,
    broker_version,
    command_line,
    load_average,
    log,
    positive_int,
    queue_depth,
)

from delayq import Topology
from delayq.sync import apply_topology, delete_topology
from delayq.sync.bridge import Bridge

POLL_S = 0.01
DELAYS = (500, 1000, 2000, 3000)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="broker URL (default: $RABBITMQ_URL, else a local node)")
    parser.add_argument("--count", type=positive_int, default=20_000)
    parser.add_argument("--prefetch", type=positive_int, default=1000)
    parser.add_argument("--rounds", type=positive_int, default=3)
    return parser.parse_args(argv)


def fill(url: str, exchange: str, count: int) -> None:
    """``count`` plugin-style messages, published with pipelined confirms (untimed)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for n in range(count):
            channel.basic_publish(
                exchange,
                "bench.x",
                b'{"n": 1}',
                pika.BasicProperties(
                    message_id=f"m-{n}",
                    content_type="application/json",
                    headers={"x-delay": DELAYS[n % len(DELAYS)]},
                ),
            )
    finally:
        connection.close()


def timed(url: str, queue: str, count: int, start: Any, stop: Any) -> tuple[float, float]:
    """Run a relay until ``queue`` is empty; (msg/s, CPU µs per message)."""
    cpu0 = time.process_time()
    start()
    began = time.monotonic()
    while queue_depth(url, queue) > 0:
        time.sleep(POLL_S)
    elapsed = time.monotonic() - began
    stop()
    cpu = time.process_time() - cpu0
    return count / elapsed, cpu / count * 1e6


def raw_relay(url: str, topology: Topology, queue: str, prefetch: int) -> tuple[Any, Any]:
    """A raw pika relay: each delivery published to its tier on a confirm channel (pika's
    blocking confirm per publish), with its properties, then the batch acked: what a
    hand-written relay on pika does, nothing checked."""
    tiers = {t.ttl_ms: topology.tier_name(t) for t in topology.ladder.tiers}
    halt = threading.Event()

    def run() -> None:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        out = pika.BlockingConnection(pika.URLParameters(url))
        channel, publish = connection.channel(), out.channel()
        publish.confirm_delivery()
        channel.basic_qos(prefetch_count=prefetch)
        batch: list[tuple[int, Any, bytes, str]] = []
        channel.basic_consume(
            queue, lambda ch, m, p, b: batch.append((m.delivery_tag, p, b, m.routing_key))
        )
        while not halt.is_set():
            connection.process_data_events(time_limit=0.01)
            if not batch:
                continue
            taken, batch[:] = list(batch), []
            for _tag, props, body, key in taken:
                delay = int(props.headers["x-delay"])
                tier = tiers[min(ms for ms in tiers if ms >= delay)]
                publish.basic_publish(tier, key, body, props, mandatory=True)
            channel.basic_ack(taken[-1][0], multiple=True)
        connection.close()
        out.close()

    thread = threading.Thread(target=run, daemon=True)

    def stop() -> None:
        halt.set()
        thread.join(30)

    return thread.start, stop


def bridge_relay(url: str, topology: Topology, prefetch: int) -> tuple[Any, Any]:
    bridge = Bridge(url, topology, prefetch=prefetch)
    thread = threading.Thread(target=lambda: bridge.run(install_signal_handlers=False), daemon=True)

    def stop() -> None:
        bridge.request_stop()
        thread.join(30)

    return thread.start, stop


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    with broker(args.url) as (url, _node):
        ns = f"bench{uuid.uuid4().hex[:8]}"
        topology = Topology(
            namespace=ns,
            ladder=["1s", "2s", "4s"],
            destinations=[{"queue": f"{ns}.work", "bindings": ["bench.#"]}],
            intakes=[{"exchange": f"plugin-{ns}", "type": "topic"}],
        )
        apply_topology(topology, url)
        intake = topology.intakes[0]
        queue = intake.queue_name(ns)
        rates: dict[str, list[tuple[float, float]]] = {"raw relay": [], "delayq bridge": []}
        try:
            for round_no in range(args.rounds):
                order = list(rates) if round_no % 2 == 0 else list(reversed(rates))
                for mode in order:
                    fill(url, intake.exchange, args.count)
                    if mode == "raw relay":
                        start, stop = raw_relay(url, topology, queue, args.prefetch)
                    else:
                        start, stop = bridge_relay(url, topology, args.prefetch)
                    rate, cpu_us = timed(url, queue, args.count, start, stop)
                    rates[mode].append((rate, cpu_us))
                    log(f"round {round_no + 1} {mode}: {rate:,.0f} msg/s, {cpu_us:.1f} µs CPU/msg")
                    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
                        channel = connection.channel()
                        for tier in topology.ladder.tiers:
                            channel.queue_purge(topology.tier_name(tier))
                        channel.queue_purge(f"{ns}.work")
        finally:
            delete_topology(topology, url)
        print(f"# {command_line(argv)}")
        print(f"# broker {broker_version(url)}; load {load_average()}; {args.count:,} messages")
        print(f"{'mode':<15} {'msg/s':>10} {'CPU µs/msg':>11}")
        medians = {}
        for mode, measured in rates.items():
            medians[mode] = statistics.median(r for r, _ in measured)
            cpu = statistics.median(c for _, c in measured)
            print(f"{mode:<15} {medians[mode]:>10,.0f} {cpu:>11.1f}")
        print(f"ratio delayq / raw: {medians['delayq bridge'] / medians['raw relay']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
