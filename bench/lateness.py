"""Lateness of three ways to delay a message, on one broker, with one random workload.

Modes, run one after the other against the same broker with the same delays
(``--count`` messages, delays uniform in whole milliseconds over (0, largest
tier of ``--ladder``], published in a random order):

1. ``naive``: one classic queue, a per-message TTL (``expiration``) and a
   dead-letter route to the destination queue. RabbitMQ expires messages only
   at the head of a queue, so a short delay waits behind a long one
   (head-of-line blocking);
2. ``tiered``: delayq's tiered strategy on ``--ladder`` (one hop into the
   smallest tier at or above the delay);
3. ``exact``: delayq's binary cascade with unit ``--unit`` and enough levels
   for the largest tier (``popcount`` hops).

Each mode publishes through ``AsyncPublisher.publish_many`` in batches of
``--batch`` (the raw ``naive`` mode through aio-pika with confirms, in the
same batches), and a raw aio-pika consumer on the destination queue records
each arrival. Lateness is arrival minus (publish time + requested delay): a
negative value is an early message. Reported per mode: early count, p50, p99
and max lateness, mean hops (queues a message waited in), publish msg/s
(confirmed) and delivered msg/s (arrivals over the span from the first to the
last arrival). A PNG of the lateness distributions is written to ``--plot``.
It exits 1 when any mode lost a message or delivered one early.

Run it::

    python bench/lateness.py                                  # local throwaway node
    python bench/lateness.py --count 10000 --ladder 1s,2s,5s,10s,20s --unit 100ms
    python bench/lateness.py --url amqp://guest:guest@localhost:5672/ --plot out.png

Needs the ``bench`` extra (matplotlib) for the plot; without it the table is
still printed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import aio_pika
from benchlib import broker, log

from delayq import Message, Topology
from delayq.aio import AsyncPublisher, apply_topology_async
from delayq.durations import format_ms, to_ms
from delayq.sync import delete_topology

MODES = ("naive", "tiered", "exact")


@dataclass
class Result:
    mode: str
    lateness_ms: list[float] = field(default_factory=list)
    early: int = 0
    missing: int = 0
    hops: float = 0.0
    publish_rate: float = 0.0
    deliver_rate: float = 0.0

    def pct(self, q: float) -> float:
        ordered = sorted(self.lateness_ms)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


class Inbox:
    """Arrival times (epoch ms) by message id, from a raw aio-pika consumer."""

    def __init__(self) -> None:
        self.at_ms: dict[str, float] = {}

    async def on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.at_ms.setdefault(message.message_id or "", time.time() * 1000)
        await message.ack()


async def wait_for(inbox: Inbox, ids: set[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not ids <= inbox.at_ms.keys():
        await asyncio.sleep(0.1)


async def run_mode(
    mode: str,
    url: str,
    topology: Topology,
    delays_ms: list[int],
    batch: int,
    channel: aio_pika.abc.AbstractChannel,
    inbox: Inbox,
) -> Result:
    ids = [f"{mode}-{n}" for n in range(len(delays_ms))]
    sent_ms: dict[str, float] = {}
    hops: dict[str, int] = {}
    started = time.monotonic()
    if mode == "naive":
        exchange = channel.default_exchange
        queue = f"{topology.namespace}.naive"
        for start in range(0, len(ids), batch):
            now = time.time() * 1000
            chunk = range(start, min(start + batch, len(ids)))
            await asyncio.gather(
                *(
                    exchange.publish(
                        aio_pika.Message(
                            b"x",
                            message_id=ids[i],
                            expiration=timedelta(milliseconds=delays_ms[i]),
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        ),
                        routing_key=queue,
                    )
                    for i in chunk
                )
            )
            for i in chunk:
                sent_ms[ids[i]] = now
                hops[ids[i]] = 1
    else:
        async with AsyncPublisher(url, topology) as pub:
            for start in range(0, len(ids), batch):
                msgs = [
                    Message(
                        b"x",
                        "lat.due",
                        timedelta(milliseconds=delays_ms[i]),
                        message_id=ids[i],
                        strategy=mode,
                    )
                    for i in range(start, min(start + batch, len(ids)))
                ]
                for receipt in await pub.publish_many(msgs):
                    sent_ms[receipt.message_id] = receipt.published_at_ms
                    hops[receipt.message_id] = receipt.hops
    published = time.monotonic() - started
    await wait_for(inbox, set(ids), timeout_s=max(delays_ms) / 1000 * 3 + 60)
    result = Result(mode, publish_rate=len(ids) / published)
    arrivals = []
    for i, message_id in enumerate(ids):
        at = inbox.at_ms.get(message_id)
        if at is None:
            result.missing += 1
            continue
        arrivals.append(at)
        late = at - sent_ms[message_id] - delays_ms[i]
        result.early += late < 0
        result.lateness_ms.append(late)
    result.hops = sum(hops.values()) / len(hops)
    if len(arrivals) > 1:
        result.deliver_rate = len(arrivals) / ((max(arrivals) - min(arrivals)) / 1000)
    return result


async def benchmark(url: str, args: argparse.Namespace) -> list[Result]:
    ladder = args.ladder.split(",")
    ns = f"lat{secrets.token_hex(4)}"
    topology = Topology(
        namespace=ns,
        ladder=ladder,
        exact={"unit": args.unit},
        destinations=[{"queue": f"{ns}.work", "bindings": ["lat.#"]}],
    )
    await apply_topology_async(topology, url)
    rng = random.Random(args.seed)
    largest = topology.ladder.max_ms
    delays_ms = [rng.randint(1, largest) for _ in range(args.count)]
    unit = format_ms(topology.exact_unit_ms)
    log(
        f"namespace {ns}: ladder {' '.join(ladder)}, exact unit {unit} x "
        f"{topology.exact_levels} levels; {args.count} delays over (0, {format_ms(largest)}]"
    )
    connection = await aio_pika.connect(url)
    results = []
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(
            f"{ns}.naive",
            durable=True,
            arguments={
                "x-queue-type": "classic",
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": f"{ns}.work",
            },
        )
        consume_channel = await connection.channel()
        await consume_channel.set_qos(prefetch_count=1000)
        inbox = Inbox()
        work = await consume_channel.get_queue(f"{ns}.work", ensure=False)
        await work.consume(inbox.on_message)
        for mode in args.modes.split(","):
            log(f"{mode}: publishing {args.count} messages ...")
            result = await run_mode(mode, url, topology, delays_ms, args.batch, channel, inbox)
            log(f"{mode}: done ({result.missing} missing)")
            results.append(result)
        await channel.queue_delete(f"{ns}.naive")
    finally:
        await connection.close()
        delete_topology(topology, url)
    return results


def report(results: list[Result], command: str, unit_ms: int) -> str:
    lines = [
        f"# {command}",
        "| mode | early | p50 late | p99 late | max late | mean hops | publish msg/s "
        "| delivered msg/s | missing |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.mode} | {r.early} | {r.pct(0.5):.0f} ms | {r.pct(0.99):.0f} ms | "
            f"{max(r.lateness_ms, default=float('nan')):.0f} ms | {r.hops:.2f} | "
            f"{r.publish_rate:,.0f} | {r.deliver_rate:,.0f} | {r.missing} |"
        )
    lines.append(f"(exact unit {unit_ms} ms: rounding up alone adds 0 to {unit_ms - 1} ms)")
    return "\n".join(lines)


def plot(results: list[Result], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed (pip install 'delayq[bench]'): no plot")
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results:
        ordered = sorted(r.lateness_ms)
        ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
        ax.plot([max(v, 1.0) / 1000 for v in ordered], ys, label=f"{r.mode} (hops {r.hops:.2f})")
    ax.set_xscale("log")
    ax.set_xlabel("lateness (s, log scale; values under 1 ms drawn at 1 ms)")
    ax.set_ylabel("fraction of messages")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot written to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="broker URL (default: $RABBITMQ_URL, else a local node)")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--ladder", default="1s,2s,5s,10s,20s", help="the scaled ladder")
    parser.add_argument("--unit", default="100ms", help="the exact strategy's unit")
    parser.add_argument("--batch", type=int, default=100, help="messages per publish batch")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--plot", type=Path, default=Path("bench/lateness.png"))
    args = parser.parse_args(argv)
    command = "python bench/lateness.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with broker(args.url) as (url, _node):
        results = asyncio.run(benchmark(url, args))
    print(report(results, command.strip(), to_ms(args.unit)))
    plot(results, args.plot, f"lateness, {args.count} messages over ladder {args.ladder}")
    failure = verdict(results)
    if failure:
        print(f"FAILED: {failure}", file=sys.stderr)
        return 1
    return 0


def verdict(results: list[Result]) -> str | None:
    """Why the run failed (a message missing or early in any mode), or ``None``: a
    lateness table over lost or early messages is no measurement."""
    bad = [
        f"{r.mode}: {r.missing} missing, {r.early} early" for r in results if r.missing or r.early
    ]
    return "; ".join(bad) or None


if __name__ == "__main__":
    sys.exit(main())
