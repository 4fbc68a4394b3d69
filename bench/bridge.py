"""Throughput of ``delayq bridge`` (an intake's relay) against two raw pika relays.

Each mode drains ``--count`` plugin-style messages (``x-delay`` header, raw pika
publishes) from the intake queue of a throwaway namespace into its tiers, each publish
confirmed before its delivery is acked, prefetch ``--prefetch`` (the relays:
``bench/bridge_modes.py``):

1. ``raw-each``: raw pika, the batch in hand published with pika's blocking confirm
   per publish (one round trip each), then acked: the plain way on pika;
2. ``raw-pipelined``: raw pika on a ``SelectConnection``, each delivery published as
   it arrives and acked once its confirm comes (a window of the prefetch): the fastest
   raw pika relay doing the same job;
3. ``bridge``: delayq's :class:`~delayq.sync.bridge.Bridge`: reading ``x-delay`` as the
   plugin did, choosing the tier, the message id, the properties carried, the DLQ for
   what cannot be scheduled, pipelined confirms, on delayq's own frame wire (asyncio,
   two connections: :mod:`delayq.aio._bridgewire`).

The clock runs from the relay's consume to its last ack (its own count, read every
``POLL_S``). Then each mode is checked: every message reaches the destination queue
once its tier expires, nothing is left in the intake queue, its DLQ or the tiers (a
``PROBLEM`` line and exit 1 otherwise). Reported: messages per second (median of
``--rounds``), client CPU per message (this process's ``time.process_time``), and the
bridge's rate over each mode's.

    .venv/bin/python bench/bridge.py --count 20000 --rounds 3
    DELAYQ_RABBITMQ_SERVER=4.0 .venv/bin/python bench/bridge.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Sequence

import pika
from benchlib import (
    admin_channel,
    broker,
    broker_version,
    command_line,
    load_average,
    log,
    positive_int,
    queue_depth,
)
from bridge_modes import MODES, RelayRun

from delayq import Topology
from delayq.sync import apply_topology, delete_topology

POLL_S = 0.01
DELAYS = (500, 1000, 2000, 3000)
LADDER = ["1s", "2s", "4s"]


def modes_arg(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(
            f"unknown mode(s) {', '.join(unknown) or '(none)'}: choose from {', '.join(MODES)}"
        )
    return modes


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="broker URL (default: $RABBITMQ_URL, else a local node)")
    parser.add_argument("--count", type=positive_int, default=20_000)
    parser.add_argument("--prefetch", type=positive_int, default=1000)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument(
        "--modes", type=modes_arg, default=list(MODES), help=f"of {','.join(MODES)} (all)"
    )
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


def timed(relay: RelayRun, count: int) -> tuple[float, float]:
    """Run ``relay`` until it acked ``count`` deliveries; (msg/s, CPU µs per message)."""
    cpu0 = time.process_time()
    relay.start()
    if not relay.consuming.wait(60):
        relay.problems.append("not consuming after 60 s")
    began = time.monotonic()
    deadline = began + max(60.0, count / 200)
    while relay.acked < count and not relay.problems and time.monotonic() < deadline:
        time.sleep(POLL_S)
    elapsed = time.monotonic() - began
    relay.stop()
    cpu = time.process_time() - cpu0
    if relay.acked != count:
        relay.problems.append(f"{relay.acked:,} of {count:,} deliveries acked")
    return count / elapsed, cpu / count * 1e6


def check_delivered(url: str, topology: Topology, count: int) -> list[str]:
    """Every message in the destination queue once its tier expired, none left behind;
    then the tiers and the destination are emptied for the next mode."""
    ns, intake = topology.namespace, topology.intakes[0]
    work = topology.destinations[0].queue
    deadline = time.monotonic() + topology.ladder.tiers[-1].ttl_ms / 1000 + 60
    while queue_depth(url, work) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {q: queue_depth(url, q) for q in (intake.queue_name(ns), intake.dlq_name(ns))}
    left |= {topology.tier_name(t): queue_depth(url, topology.tier_name(t))
             for t in topology.ladder.tiers}  # fmt: skip
    problems = [f"{depth:,} message(s) left in {q}" for q, depth in left.items() if depth]
    delivered = queue_depth(url, work)
    if delivered != count:
        problems.append(f"{delivered:,} of {count:,} messages in {work}")
    with admin_channel(url) as channel:
        for queue in [*left, work]:
            channel.queue_purge(queue)
    return problems


def report(argv: Sequence[str], url: str, count: int, rates: dict[str, list[tuple[float, float]]]
           ) -> None:  # fmt: skip
    print(f"# {command_line(argv)}")
    print(f"# broker {broker_version(url)}; load {load_average()}; {count:,} messages")
    bridge = MODES["bridge"].label
    print(f"{'mode':<29} {'msg/s':>10} {'CPU µs/msg':>11} {'bridge / mode':>14}")
    medians = {mode: statistics.median(r for r, _ in measured) for mode, measured in rates.items()}
    for mode, measured in rates.items():
        cpu = statistics.median(c for _, c in measured)
        ratio = f"{medians[bridge] / medians[mode]:.2f}" if bridge in medians else "-"
        print(f"{mode:<29} {medians[mode]:>10,.0f} {cpu:>11.1f} {ratio:>14}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    modes = [MODES[m] for m in args.modes]
    problems: list[str] = []
    with broker(args.url) as (url, _node):
        ns = f"bench{uuid.uuid4().hex[:8]}"
        topology = Topology.model_validate(
            {
                "namespace": ns,
                "ladder": LADDER,
                "destinations": [{"queue": f"{ns}.work", "bindings": ["bench.#"]}],
                "intakes": [{"exchange": f"plugin-{ns}", "type": "topic"}],
            }
        )
        apply_topology(topology, url)
        intake = topology.intakes[0]
        rates: dict[str, list[tuple[float, float]]] = {m.label: [] for m in modes}
        try:
            for round_no in range(args.rounds):
                for mode in modes if round_no % 2 == 0 else reversed(modes):
                    fill(url, intake.exchange, args.count)
                    relay = mode(url, topology, intake.queue_name(ns), args.prefetch)
                    rate, cpu_us = timed(relay, args.count)
                    rates[mode.label].append((rate, cpu_us))
                    log(f"round {round_no + 1} {mode.label}: {rate:,.0f} msg/s, "
                        f"{cpu_us:.1f} µs CPU/msg")  # fmt: skip
                    found = relay.problems + check_delivered(url, topology, args.count)
                    problems += [f"round {round_no + 1} {mode.label}: {p}" for p in found]
        finally:
            delete_topology(topology, url)
        report(argv, url, args.count, rates)
    for problem in problems:
        print(f"PROBLEM {problem}")
        log(f"PROBLEM {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
