"""Consume throughput of delayq's consumers against raw aio-pika and raw pika consumers.

What it measures (messages per second, handled and acked), in one run against
one broker, so that the ratios compare like with like: the time to drain
``--count`` messages of ``--body-bytes`` bytes from a destination queue, from
the first delivery to the last ack, with prefetch ``--prefetch`` in every mode:

1. raw aio-pika: ``queue.consume`` with manual acks and a callback that only
   acks (``await message.ack()``): the usual pattern, which the ratios divide by;
2. the physical limit: raw frames on delayq's own AMQP wire, reading only each
   ``Basic.Deliver``'s delivery tag (nothing decoded, no message object, no task),
   prefetch ``--limit-prefetch`` (1000), no handler, one ``basic.ack(multiple=True)`` per
   quarter of the prefetch received (or 10 ms after the first): what consuming
   costs in Python at the least, shown as each mode's share of it ("of limit");
3. ``delayq.aio.AsyncConsumer`` with a no-op async handler and
   ``store=InMemoryStore()``;
4. the same with ``store=SQLiteStore(<fresh file>)`` (in ``--sqlite-dir``,
   else the system's temporary folder);
5. the same with ``store=RedisStore(...)`` from ``delayq.stores.redis``,
   when that module can be imported and a Redis URL is at hand (``--redis-url``,
   else ``REDIS_URL``, else a server started with
   ``delayq.local.servers.LocalRedis`` when that module exists); otherwise the
   mode is skipped with a note;
6. raw pika: a ``BlockingConnection`` channel with ``basic_qos(prefetch)``,
   ``basic_consume`` with manual acks and a callback that only acks
   (``channel.basic_ack(tag)``), ``start_consuming()`` in the main thread: the
   blocking pattern, which the sync modes' ratios divide by;
7. ``delayq.sync.Consumer`` with a no-op handler, its default handler threads
   (``concurrency`` = min(prefetch, 8)) and ``store=InMemoryStore()``, ``start()``
   before the clock and ``run()`` in the main thread; its cautious start (prefetch 1
   until the first fresh delivery, then consuming again with ``--prefetch``) is
   part of its figure, as it is of every start;
8. and 9. the same with ``SQLiteStore`` and ``RedisStore``, set up as in 4. and 5.

Two more run only when named in ``--modes``: raw clients doing some of what delayq does,
to tell what that part costs by itself:

10. ``limit-work``: the physical limit's reader spending ``--work-us`` (10) microseconds
    of CPU a delivery (a busy loop on the thread's CPU clock, no I/O) as it takes each
    tag: what a consumer's own CPU costs the rate when it and the broker share the
    machine's cores (runs with several ``--work-us`` in turn draw the curve);
11. ``raw-pika-threads``: raw pika handing each delivery's tag to 8 handler threads (the
    sync ``Consumer``'s default) and acking what they hand back in the connection's
    thread, woken by ``add_callback_threadsafe`` (no message object, no store, no
    timeout, each tag acked alone): a pika consumer that runs its handlers in threads,
    done plainly, with its ratio to raw pika.

Targets (median msg/s over the median msg/s of the raw client of the same kind):
over raw aio-pika, 2.0 with the in-memory store, 1.5 with SQLite, 1.0 with Redis
(whose every claim and completion is a round trip); over raw pika, 1.0 for the
sync ``Consumer`` with the in-memory store (none for its other stores).
``--modes memory,limit`` runs only those besides raw aio-pika, ``--modes
sync-memory,raw-pika`` only those (raw pika runs when a sync mode does, raw aio-pika
when an asyncio mode does).
``--tracing`` adds ``AsyncConsumer + InMemoryStore`` traced (an OpenTelemetry SDK
provider whose spans are batched and dropped, the queue filled by a traced publisher so
each message carries a context to extract and link), in the same rounds, and prints
its rate and CPU beside the untraced memory mode's.

The queue is the one destination of a throwaway namespace (``bench<hex>``,
ladder ``["1h"]``, quorum queues as delayq declares them), bound to
``bench.#``. Before every measurement it is filled, untimed, with exactly
``--count`` immediate messages by ``AsyncPublisher.publish_many`` (delay
``"0s"``, so they are routed straight to the destination, each with its own
message id: the idempotency key), and its depth is checked with a passive
``queue.declare`` (exact for a quorum queue once the publishes are confirmed).
After every measurement the consumer is stopped (its channel closed, so an
unacked message would be back in the queue) and the queue and its DLQ are
checked to be empty; ``AsyncConsumer`` must report exactly ``--count`` handled
messages and no duplicate, retry or dead letter.

Timing: the clock starts at the first delivery (the raw callback, or the first
call of delayq's handler) and stops when the ack count reaches ``--count``.
Every side is watched the same way: a loop that looks at the count every
``POLL_S`` seconds (the raw callback's count, or ``consumer.stats.handled``,
which delayq increments after the ack), so all pay the same polling cost and
quantisation; in the asyncio modes it runs on the consumer's event loop, in the
blocking modes (whose connection's loop holds the main thread) in a thread of its
own, which then stops the consumer (``stop_consuming``, ``request_stop()``).
Connecting, declaring and ``consume`` happen before the clock starts; stopping
happens after it stops.

Every mode runs ``--rounds`` times, in reverse order every other round, and
the table shows the median per mode. Besides msg/s, the report shows the
client's CPU time per message (this process's ``time.process_time``, all
threads: the store's calls run in a thread of its own, a sync Consumer's handlers
in threads too): it moves much
less than wall-clock time on a busy machine and is what the framework itself
adds. The broker runs on the same machine when it is a local node, so on a
machine with few CPUs client and broker compete; look at the per-round figures
and the load average before trusting a ratio.

Run it::

    python bench/consume.py                        # starts a throwaway local node
    python bench/consume.py --url amqp://guest:guest@localhost:5672/ --rounds 5
    RABBITMQ_URL=amqp://... REDIS_URL=redis://localhost:6379/0 python bench/consume.py
    python bench/consume.py --count 20000 --profile sqlite   # plus a cProfile of one drain
    python bench/consume.py --modes limit,memory --rounds 1  # a quick look
    python bench/consume.py --modes memory --tracing          # tracing on vs off
    python bench/consume.py --modes sync-memory --profile sync-memory  # raw pika + sync
    python bench/consume.py --modes limit,limit-work,memory --work-us 10
    python bench/consume.py --modes raw-pika-threads,sync-memory

The broker is ``--url``, else ``RABBITMQ_URL``, else a node started from the
RabbitMQ server installed in ``/usr/lib/rabbitmq/bin`` with
:class:`delayq.local.node.LocalNode` (stopped and removed at the end). Progress
goes to stderr, the results table to stdout. The exit code is 0 whether or not
the targets are met; a ratio that misses its target is marked ``BELOW TARGET``.
The namespace's queues and exchanges are deleted at the end, also on errors.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import importlib
import io
import os
import platform
import pstats
import statistics
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

from benchlib import (
    broker,
    broker_version,
    command_line,
    discarding_tracer_provider,
    load_average,
    log,
    non_negative_float,
    positive_int,
)
from consume_modes import (
    LABELS as ASYNC_LABELS,
)
from consume_modes import (
    LIMIT,
    LIMIT_WORK,
    MEMORY,
    MEMORY_TRACED,
    RAW,
    REDIS,
    SQLITE,
    Context,
    Settings,
    Timing,
    expect_depth,
    fill,
)
from consume_modes import (
    MEASURE as ASYNC_MEASURE,
)
from consume_modes import (
    PROFILE_CHOICES as ASYNC_CHOICES,
)
from consume_modes import (
    TARGETS as ASYNC_TARGETS,
)
from consume_sync_modes import (
    RAW_PIKA,
    RAW_PIKA_THREADS,
    SYNC_CHOICES,
    SYNC_KEYS,
    SYNC_LABELS,
    SYNC_MEASURE,
    SYNC_MEMORY,
    SYNC_REDIS,
    SYNC_SQLITE,
    SYNC_TARGETS,
)

from delayq.sync import apply_topology, delete_topology
from delayq.urls import redact

LABELS = {**ASYNC_LABELS, **SYNC_LABELS}
"""Every mode, in the report's order: the asyncio ones, then the blocking ones."""
TARGETS = {**ASYNC_TARGETS, **SYNC_TARGETS}
PROFILE_CHOICES = {**ASYNC_CHOICES, **SYNC_CHOICES}
EXTRA_MODES = frozenset({LIMIT_WORK, RAW_PIKA_THREADS})
"""Run only when named in ``--modes``: what a raw client doing some work would reach."""
MEASURE = {**ASYNC_MEASURE, **SYNC_MEASURE}
REDIS_KEYS = (REDIS, SYNC_REDIS)


def baseline(key: str) -> str:
    """The raw client a mode's ratio divides by: raw pika for the blocking ones."""
    return RAW_PIKA if key == RAW_PIKA or key in SYNC_KEYS else RAW


def modes_of(ctx: Context) -> tuple[str, ...]:
    """The modes of this run, each group's raw client first (even rounds run them in this
    order); a raw client runs when a mode of its group does."""
    redis = ctx.redis_class is not None
    groups = (
        (RAW, LIMIT, LIMIT_WORK, MEMORY, SQLITE) + ((REDIS,) if redis else ()),
        (RAW_PIKA, RAW_PIKA_THREADS, SYNC_MEMORY, SYNC_SQLITE) + ((SYNC_REDIS,) if redis else ()),
    )
    chosen = set(ctx.settings.modes)
    every = not chosen
    if ctx.tracing is not None:
        chosen.add(MEMORY)
    modes: tuple[str, ...] = ()
    for raw, *others in groups:
        picked = tuple(
            key for key in others if key in chosen or (every and key not in EXTRA_MODES)
        )
        if picked or raw in chosen or every:
            modes += (raw, *picked)
    if ctx.tracing is not None:
        modes += (MEMORY_TRACED,)
    return modes


# Running and reporting --------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    rate: float
    """Messages handled and acked per second."""
    cpu_us: float
    """Client CPU microseconds per message."""


@dataclass
class Results:
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def add(self, key: str, sample: Sample) -> None:
        self.samples.setdefault(key, []).append(sample)

    def rate(self, key: str) -> float:
        return statistics.median(s.rate for s in self.samples[key])

    def cpu_us(self, key: str) -> float:
        return statistics.median(s.cpu_us for s in self.samples[key])

    def round_ratios(self, key: str) -> list[float]:
        """Each round's rate over the same round's rate of its raw client."""
        raw = self.samples[baseline(key)]
        return [s.rate / r.rate for s, r in zip(self.samples[key], raw, strict=True)]


def drained(ctx: Context, key: str, prefix: str) -> Timing:
    """Fill the queue, drain it in mode ``key``, check that everything was acked."""
    filled_s = fill(ctx, traced=key == MEMORY_TRACED)
    log(f"{prefix} {LABELS[key]}: queue filled in {filled_s:.1f} s (untimed); draining ...")
    gc.collect()
    timing = MEASURE[key](ctx)
    expect_depth(ctx, ctx.queue, 0, f"after {LABELS[key]}")
    expect_depth(ctx, ctx.dlq, 0, f"after {LABELS[key]}")
    return timing


def run_rounds(ctx: Context) -> Results:
    results = Results()
    count, rounds = ctx.settings.count, ctx.settings.rounds
    modes = modes_of(ctx)
    for index in range(rounds):
        order = modes if index % 2 == 0 else tuple(reversed(modes))
        prefix = f"[round {index + 1}/{rounds}]"
        for key in order:
            timing = drained(ctx, key, prefix)
            sample = Sample(count / timing.wall_s, timing.cpu_s / count * 1e6)
            results.add(key, sample)
            log(
                f"{prefix} {LABELS[key]}: {count} in {timing.wall_s:.2f} s = "
                f"{sample.rate:,.0f} msg/s, client CPU {sample.cpu_us:.0f} us/msg"
            )
    return results


def profile(ctx: Context, key: str, out: Path | None) -> None:
    """One extra, untimed drain under cProfile (main thread only: a blocking mode's
    connection loop runs there, its handler threads do not); top functions to stderr."""
    fill(ctx)
    gc.collect()
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        MEASURE[key](ctx)
    finally:
        profiler.disable()
    expect_depth(ctx, ctx.queue, 0, f"after profiling {LABELS[key]}")
    if out is not None:
        profiler.dump_stats(str(out))
        log(f"profile of {LABELS[key]} written to {out}")
    for sort in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(sort).print_stats(30)
        log(f"profile of {LABELS[key]}, {ctx.settings.count} messages, by {sort}:")
        log(text.getvalue())


@dataclass(frozen=True)
class Environment:
    command: str
    version: str
    load: str
    redis_note: str


def report(ctx: Context, results: Results, env: Environment) -> str:
    s = ctx.settings
    width = max(len(v) for v in LABELS.values()) + 2
    limit_rate = results.rate(LIMIT) if LIMIT in results.samples else None
    lines = [
        f"{'mode (prefetch ' + str(s.prefetch) + ')':<{width}}{'msg/s':>9}{'ratio':>8}"
        f"{'of limit':>10}{'CPU us/msg':>12}   target (ratio to the raw client above it)"
    ]
    for key, label in LABELS.items():
        if key == MEMORY_TRACED and key not in results.samples:
            continue  # not asked for (--tracing)
        if baseline(key) not in results.samples:
            continue  # no mode of this group was asked for
        if key not in results.samples:
            chosen = s.modes
            if key in EXTRA_MODES and key not in chosen:
                why = "runs when named in --modes"
            elif chosen and key not in chosen:
                why = "not among --modes"
            else:
                why = env.redis_note
            lines.append(f"{label:<{width}}{'skipped':>9}   ({why})")
            continue
        if key == RAW_PIKA and RAW in results.samples:
            lines.append("")  # the blocking group: its ratios are to raw pika
        rate, cpu = results.rate(key), results.cpu_us(key)
        ratio = round(rate / results.rate(baseline(key)), 2)  # judged as shown
        share = f"{rate / limit_rate:.0%}" if limit_rate else "-"
        target = TARGETS.get(key)
        verdict = ""
        if target is not None:
            verdict = f">= {target:.2f}" + ("" if ratio >= target else "   BELOW TARGET")
        lines.append(
            f"{label:<{width}}{rate:>9,.0f}{ratio:>8.2f}{share:>10}{cpu:>12.0f}   {verdict}"
        )
    if limit_rate:
        lines.append(
            f"(the limit: prefetch {s.limit_prefetch}, no handler, one multiple ack per quarter "
            "of it, asyncio)"
        )
    if LIMIT_WORK in results.samples:
        lines.append(f"(the limit + work: {s.work_us:g} us of CPU a delivery, --work-us)")

    lines += [
        "",
        f"per mode: msg/s in each of {s.rounds} rounds (ratio to the same round's raw client); "
        "medians",
    ]
    for key, label in LABELS.items():
        if key not in results.samples:
            continue
        per_round = ", ".join(
            f"{x.rate:,.0f} ({q:.2f})"
            for x, q in zip(results.samples[key], results.round_ratios(key), strict=True)
        )
        lines.append(
            f"  {label:<{width}}{per_round}  median {results.rate(key):,.0f} msg/s, "
            f"{results.cpu_us(key):.0f} us CPU/msg"
        )
    lines.append("client CPU per message over its raw client's (aio-pika, or pika: sync modes):")
    for key, label in LABELS.items():
        if key in (RAW, RAW_PIKA) or key not in results.samples:
            continue
        raw_cpu = results.cpu_us(baseline(key))
        extra = results.cpu_us(key) - raw_cpu
        lines.append(f"  {label:<{width}}{extra:+.0f} us ({extra / raw_cpu:+.0%} of raw)")
    if MEMORY_TRACED in results.samples:
        off, on = results.rate(MEMORY), results.rate(MEMORY_TRACED)
        extra = results.cpu_us(MEMORY_TRACED) - results.cpu_us(MEMORY)
        lines += [
            "",
            "tracing on (SDK, spans dropped) vs off, same run (medians):",
            f"  {LABELS[MEMORY]:<{width}}{off:,.0f} -> {on:,.0f} msg/s ({on / off:.2f}x), "
            f"{extra:+.0f} us CPU/msg",
        ]

    redis = env.redis_note
    if ctx.redis_url and ctx.redis_class:
        redis = (
            f"{redact(ctx.redis_url)} ({env.redis_note}), keys under {ctx.topology.namespace}:idem:"
        )
    lines += [
        "",
        f"command:   {env.command}",
        f"broker:    {env.version}, {redact(ctx.url)}",
        f"client:    Python {platform.python_version()}, aio-pika {package_version('aio-pika')}, "
        f"aiormq {package_version('aiormq')}, pika {package_version('pika')}, "
        f"delayq {package_version('delayq')}",
        f"machine:   {platform.machine()}, {os.cpu_count()} CPUs, load average {env.load}",
        f"workload:  {s.count} messages of {s.body_bytes} bytes per drain, prefetch "
        f"{s.prefetch}, {ctx.topology.queue_type.value} queue {ctx.queue}",
        f"stores:    SQLite file in {s.sqlite_dir} (fresh per drain); Redis: {redis}",
    ]
    return "\n".join(lines)


def benchmark(
    url: str,
    settings: Settings,
    command: str,
    redis: tuple[str | None, Any, str],
    profile_key: str | None,
    profile_out: Path | None,
    tracing: bool = False,
) -> None:
    redis_url, redis_class, redis_note = redis
    version = broker_version(url)
    provider = discarding_tracer_provider() if tracing else None
    ctx = Context.create(url, settings, redis_url, redis_class, provider)
    log(f"broker {version} at {redact(url)}; namespace {ctx.topology.namespace}")
    if redis_class is None:
        log(f"note: skipping {LABELS[REDIS]} and {LABELS[SYNC_REDIS]}: {redis_note}")
    load_before = load_average()
    try:
        apply_topology(ctx.topology, url)
        results = run_rounds(ctx)
        load = f"{load_before} before, {load_average()} after (1/5/15 min)"
        if profile_key is not None:
            if profile_key in REDIS_KEYS and redis_class is None:
                log(f"note: cannot profile {LABELS[profile_key]}: {redis_note}")
            else:
                profile(ctx, profile_key, profile_out)
    finally:
        delete_topology(ctx.topology, url)
        log(f"deleted the queues and exchanges of {ctx.topology.namespace}")
    env = Environment(command=command, version=version, load=load, redis_note=redis_note)
    print(report(ctx, results, env), flush=True)


# Redis (optional) -------------------------------------------------------------------------


def redis_store_class() -> tuple[Any, str]:
    """``RedisStore``, or ``None`` and why not."""
    try:
        module = importlib.import_module("delayq.stores.redis")
        return module.RedisStore, ""
    except ImportError as exc:
        return None, f"delayq.stores.redis.RedisStore cannot be imported ({exc})"
    except AttributeError:
        return None, "delayq.stores.redis has no RedisStore"


@contextlib.contextmanager
def redis_server(args: argparse.Namespace) -> Iterator[tuple[str | None, Any, str]]:
    """(Redis URL, RedisStore class, note): a local server is started only if needed."""
    cls, note = redis_store_class()
    if cls is None:
        yield None, None, note
        return
    url = args.redis_url or os.environ.get("REDIS_URL")
    if url:
        yield url, cls, "--redis-url" if args.redis_url else "REDIS_URL"
        return
    try:
        local_redis = importlib.import_module("delayq.local.servers").LocalRedis
    except (ImportError, AttributeError) as exc:
        yield None, None, f"no --redis-url or REDIS_URL, and no delayq.local.servers ({exc})"
        return
    log("no --redis-url or REDIS_URL: starting a local Redis server ...")
    try:
        server = local_redis()
        server.__enter__()
    except Exception as exc:
        yield None, None, f"could not start LocalRedis: {type(exc).__name__}: {exc}"
        return
    try:
        log(f"local Redis is up at {redact(server.url)}")
        yield server.url, cls, "a LocalRedis started for this run"
    finally:
        log("stopping the local Redis server ...")
        server.__exit__(None, None, None)


# Command line -----------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/consume.py",
        description="Consume throughput of delayq's consumers against raw aio-pika and pika.",
    )
    parser.add_argument("--url", help="broker URL (default: $RABBITMQ_URL, else a local node)")
    parser.add_argument(
        "--redis-url",
        help="Redis URL for the RedisStore mode (default: $REDIS_URL, else LocalRedis if any)",
    )
    parser.add_argument(
        "--count",
        type=positive_int,
        default=50_000,
        help="messages per drain (default 50000)",
    )
    parser.add_argument(
        "--body-bytes", type=positive_int, default=256, help="body size in bytes (default 256)"
    )
    parser.add_argument(
        "--prefetch", type=positive_int, default=200, help="prefetch of every mode (default 200)"
    )
    parser.add_argument(
        "--limit-prefetch",
        type=positive_int,
        default=1000,
        help="prefetch of the physical limit's raw-frames consumer (default 1000)",
    )
    parser.add_argument(
        "--work-us",
        type=non_negative_float,
        default=10.0,
        help="client CPU a delivery of the limit-work mode, in microseconds (default 10)",
    )
    parser.add_argument(
        "--modes",
        default="",
        help="comma-separated modes to run besides their raw client ("
        + ",".join(PROFILE_CHOICES)
        + "; default all but "
        + ", ".join(k for k, v in PROFILE_CHOICES.items() if v in EXTRA_MODES)
        + ")",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=3,
        help="rounds, alternating the order of modes; medians are reported",
    )
    parser.add_argument(
        "--sqlite-dir",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="folder for the SQLite stores' files (default: the temporary folder)",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILE_CHOICES),
        help="after the rounds, drain once more in this mode under cProfile (untimed)",
    )
    parser.add_argument("--profile-out", type=Path, help="also write that profile to this file")
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="also run AsyncConsumer + InMemoryStore traced (OpenTelemetry SDK, spans dropped)",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.modes.split(",") if name and name not in PROFILE_CHOICES]
    if unknown:
        parser.error(
            f"unknown --modes {', '.join(unknown)}; choose from {', '.join(PROFILE_CHOICES)}"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    settings = Settings(
        count=args.count,
        body_bytes=args.body_bytes,
        prefetch=args.prefetch,
        limit_prefetch=args.limit_prefetch,
        modes=frozenset(PROFILE_CHOICES[name] for name in args.modes.split(",") if name),
        rounds=args.rounds,
        sqlite_dir=args.sqlite_dir,
        work_us=args.work_us,
    )
    command = command_line(argv)
    profile_key = PROFILE_CHOICES[args.profile] if args.profile else None
    with redis_server(args) as redis:
        with broker(args.url) as (url, _node):
            benchmark(url, settings, command, redis, profile_key, args.profile_out, args.tracing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
