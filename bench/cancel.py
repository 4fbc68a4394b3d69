"""What cancellation costs a consumer, and how fast one publisher cancels (issue 15).

In one run against one broker (``--url``, else ``RABBITMQ_URL``, else a throwaway
local node), ``--rounds`` rounds, the order reversed every other round:

1. ``AsyncConsumer`` + ``SQLiteStore`` draining ``--count`` messages, no cancel
   issued ("disabled": the cancel check always rides on the claim, so disabled
   means no mark in the store);
2. the same after ``AsyncPublisher.cancel_many`` (same store) marked
   ``--cancel-fraction`` of the message ids: the drain must end with exactly
   N x (1-f) handled and N x f counted in ``consumer.stats.cancelled``; its rate
   counts all N deliveries;
3. and 4. the same pair with ``RedisStore`` (skipped with a note when Redis is
   unavailable, as in ``bench/consume.py``);
5. cancels per second from one publisher: ``cancel_many`` in batches of 100 and
   1000 ids, and single ``cancel`` calls, against SQLite and Redis (untimed setup;
   the marks are pruned after).

The ratio enabled/disabled per store is marked against the 0.9 target; the exit
code is 0 either way. Run it::

    python bench/cancel.py --count 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchlib import broker, broker_version, command_line, load_average, log, positive_int
from consume import redis_server
from consume_modes import (
    ROUTING_KEY,
    Context,
    Drain,
    Settings,
    Timing,
    expect_depth,
    make_redis_store,
)

from delayq import Message
from delayq.aio import AsyncPublisher
from delayq.aio.consumer import AsyncConsumer
from delayq.message.envelope import epoch_ms
from delayq.stores.base import IdempotencyStore
from delayq.stores.sqlite import SQLiteStore
from delayq.sync import apply_topology, delete_topology
from delayq.urls import redact

TARGET = 0.9
FILL_WINDOW = 1000
BATCHES = (1000, 100)
SINGLE_CALLS = 500


def fill_ids(ctx: Context) -> list[str]:
    """Publish exactly ``count`` immediate messages; their message ids."""
    count = ctx.settings.count
    message = Message(ctx.body, ROUTING_KEY, "0s")

    async def run() -> list[str]:
        async with AsyncPublisher(ctx.url, ctx.topology) as publisher:
            receipts = await publisher.publish_many([message] * count, window=FILL_WINDOW)
        return [r.message_id for r in receipts]

    expect_depth(ctx, ctx.queue, 0, "before filling")
    ids = asyncio.run(run())
    expect_depth(ctx, ctx.queue, count, "after filling")
    return ids


def drain(ctx: Context, store: IdempotencyStore, cancel_ids: list[str]) -> Timing:
    """Mark ``cancel_ids`` (untimed), then drain the queue; checks the outcome counts."""
    count, prefetch = ctx.settings.count, ctx.settings.prefetch
    expected_cancelled = len(cancel_ids)

    async def run() -> Timing:
        if cancel_ids:
            async with AsyncPublisher(ctx.url, ctx.topology, store=store) as publisher:
                await publisher.cancel_many(message_ids=cancel_ids, routing_key=ROUTING_KEY)
        clock = Drain(count)

        async def handler(_value: object) -> None:
            clock.first_delivery()

        consumer = AsyncConsumer(
            ctx.url, ctx.topology, ctx.queue, handler, store=store, prefetch=prefetch
        )
        await consumer.start()
        try:
            # A cancelled delivery never reaches the handler: the clock starts at the first
            # handled one, and every delivery, handled or cancelled, counts towards N.
            timing = await clock.wait(lambda: consumer.stats.handled + consumer.stats.cancelled)
        finally:
            await consumer.stop()
        stats = consumer.stats
        got = (stats.handled, stats.cancelled, stats.duplicates, stats.retried)
        if got != (count - expected_cancelled, expected_cancelled, 0, 0) or stats.dead_lettered:
            raise RuntimeError(
                f"AsyncConsumer ended with {stats}, expected {count - expected_cancelled} "
                f"handled and {expected_cancelled} cancelled"
            )
        return timing

    return asyncio.run(run())


def measure(ctx: Context, make_store: Callable[[], IdempotencyStore], fraction: float) -> Timing:
    ids = fill_ids(ctx)
    cancel_ids = (
        ids[:: max(1, round(1 / fraction))][: round(len(ids) * fraction)] if fraction else []
    )
    store = make_store()
    try:
        timing = drain(ctx, store, cancel_ids)
    finally:
        with contextlib.suppress(Exception):
            store.prune(older_than_ms=epoch_ms() + 3_600_000)
        store.close()
    expect_depth(ctx, ctx.queue, 0, "after draining")
    expect_depth(ctx, ctx.dlq, 0, "after draining (DLQ)")
    return timing


def cancel_rates(ctx: Context, store: IdempotencyStore) -> dict[str, float]:
    """Cancels per second through one publisher: batches of 1000 and 100, and singles."""

    async def run() -> dict[str, float]:
        rates: dict[str, float] = {}
        async with AsyncPublisher(ctx.url, ctx.topology, store=store) as publisher:
            for batch in BATCHES:
                ids = [f"bench-{batch}-{i}" for i in range(max(ctx.settings.count // 4, batch))]
                started = time.perf_counter()
                for at in range(0, len(ids), batch):
                    await publisher.cancel_many(
                        message_ids=ids[at : at + batch], routing_key=ROUTING_KEY
                    )
                rates[f"cancel_many x{batch}"] = len(ids) / (time.perf_counter() - started)
            started = time.perf_counter()
            for i in range(SINGLE_CALLS):
                await publisher.cancel(message_id=f"bench-single-{i}", routing_key=ROUTING_KEY)
            rates["cancel (single)"] = SINGLE_CALLS / (time.perf_counter() - started)
        return rates

    try:
        return asyncio.run(run())
    finally:
        with contextlib.suppress(Exception):
            store.prune(older_than_ms=epoch_ms() + 3_600_000)
        store.close()


def benchmark(args: argparse.Namespace, url: str, redis: tuple[str | None, Any, str]) -> str:
    redis_url, redis_class, redis_note = redis
    settings = Settings(
        count=args.count,
        body_bytes=args.body_bytes,
        prefetch=args.prefetch,
        limit_prefetch=1000,
        modes=frozenset(),
        rounds=args.rounds,
        sqlite_dir=args.sqlite_dir,
    )
    ctx = Context.create(url, settings, redis_url, redis_class)
    version = broker_version(url)
    log(f"broker {version} at {redact(url)}; namespace {ctx.topology.namespace}")
    folder = Path(tempfile.mkdtemp(prefix="delayq-cancelbench-", dir=args.sqlite_dir))
    counter = iter(range(1_000_000))

    def sqlite() -> IdempotencyStore:
        return SQLiteStore(folder / f"keys{next(counter)}.db")

    stores: dict[str, Callable[[], IdempotencyStore]] = {"SQLite": sqlite}
    if redis_class is not None:
        prefix = f"{ctx.topology.namespace}:idem:"
        stores["Redis"] = lambda: make_redis_store(redis_class, redis_url or "", prefix)
    else:
        log(f"note: skipping RedisStore: {redis_note}")
    modes = [(name, f) for name in stores for f in (0.0, args.cancel_fraction)]
    samples: dict[tuple[str, float], list[Timing]] = {mode: [] for mode in modes}
    rates: dict[str, dict[str, float]] = {}
    load_before = load_average()
    try:
        apply_topology(ctx.topology, url)
        for index in range(args.rounds):
            order = modes if index % 2 == 0 else modes[::-1]
            for name, fraction in order:
                timing = measure(ctx, stores[name], fraction)
                samples[(name, fraction)].append(timing)
                log(
                    f"round {index + 1} {name} cancel {fraction:.0%}: "
                    f"{args.count / timing.wall_s:,.0f} msg/s"
                )
        for name, make in stores.items():
            rates[name] = cancel_rates(ctx, make())
            log(f"{name} cancel rates: {rates[name]}")
        load = f"{load_before} before, {load_average()} after (1/5/15 min)"
    finally:
        delete_topology(ctx.topology, url)
        shutil.rmtree(folder, ignore_errors=True)
    return report(args, ctx, version, load, samples, rates, redis_note)


def report(
    args: argparse.Namespace,
    ctx: Context,
    version: str,
    load: str,
    samples: dict[tuple[str, float], list[Timing]],
    rates: dict[str, dict[str, float]],
    redis_note: str,
) -> str:
    count = ctx.settings.count

    def rate(mode: tuple[str, float]) -> float:
        return statistics.median(count / t.wall_s for t in samples[mode])

    def cpu_us(mode: tuple[str, float]) -> float:
        return statistics.median(t.cpu_s / count * 1e6 for t in samples[mode])

    lines = [
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"command: {command_line(sys.argv[1:])}",
        f"broker: {version}; load average: {load}; Redis: {redis_note or 'n/a'}",
        f"{count} messages per drain, prefetch {ctx.settings.prefetch}, "
        f"{ctx.settings.rounds} rounds (medians)",
        "",
        "| mode | msg/s | client CPU µs/msg | per round msg/s |",
        "|---|---:|---:|---|",
    ]
    for mode in samples:
        name, fraction = mode
        label = f"AsyncConsumer + {name}Store, " + (
            f"{fraction:.0%} cancelled" if fraction else "no cancels"
        )
        rounds = ", ".join(f"{count / t.wall_s:,.0f}" for t in samples[mode])
        lines.append(f"| {label} | {rate(mode):,.0f} | {cpu_us(mode):.1f} | {rounds} |")
    lines += ["", "| store | enabled / disabled | target |", "|---|---:|---|"]
    for name in dict.fromkeys(name for name, _ in samples):
        ratio = rate((name, args.cancel_fraction)) / rate((name, 0.0))
        mark = "met" if ratio >= TARGET else "BELOW TARGET"
        lines.append(f"| {name} | {ratio:.2f}x | >= {TARGET}x: {mark} |")
    lines += ["", "| store | call | cancels/s |", "|---|---|---:|"]
    for name, by_call in rates.items():
        for call, value in by_call.items():
            lines.append(f"| {name} | {call} | {value:,.0f} |")
    return "\n".join(lines)


def fraction_arg(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return value


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/cancel.py", description="What cancellation costs an AsyncConsumer."
    )
    parser.add_argument("--url", help="broker URL (default: $RABBITMQ_URL, else a local node)")
    parser.add_argument("--redis-url", help="Redis URL (default: $REDIS_URL, else LocalRedis)")
    parser.add_argument("--count", type=positive_int, default=20_000, help="messages per drain")
    parser.add_argument("--body-bytes", type=positive_int, default=256, help="body size")
    parser.add_argument("--prefetch", type=positive_int, default=200, help="prefetch")
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds (medians)")
    parser.add_argument(
        "--cancel-fraction", type=fraction_arg, default=0.1, help="share cancelled (0.1)"
    )
    parser.add_argument(
        "--sqlite-dir", type=Path, default=Path(tempfile.gettempdir()), help="SQLite files"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    with redis_server(args) as redis:
        with broker(args.url) as (url, _node):
            print(benchmark(args, url, redis), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
