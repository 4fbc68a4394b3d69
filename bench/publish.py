"""Publish throughput of delayq's publishers against the raw client libraries.

What it measures (messages per second, confirmed by the broker), in one run
against one broker, so that the ratios compare like with like:

1. ``delayq.sync.Publisher.publish``, one confirmed publish at a time, vs raw
   pika: a ``BlockingConnection`` channel with ``confirm_delivery()`` and one
   ``basic_publish`` at a time.
2. ``delayq.aio.AsyncPublisher.publish_many(window=W)`` vs raw aio-pika: a
   ``publisher_confirms=True`` channel with up to ``W`` confirms in flight
   (an ``asyncio.Semaphore`` plus one task per ``exchange.publish``).
   ``AsyncPublisher`` writes AMQP frames itself (:mod:`delayq.aio._framelink`),
   so the target is at least 3x, and at least 0.9x ``Publisher.publish_many``.
3. ``delayq.sync.Publisher.publish_many(window=W)`` (pipelined over pika's
   ``SelectConnection``) vs the raw pika single-publish figure of pair 1: the
   reason ``publish_many`` exists, so the target is a speed-up of at least 3x.
4. The physical limit: the same publishes encoded by pamqp *before* the clock
   starts, written to a plain socket with up to ``W`` unconfirmed and the
   broker's acks counted (no framework, no future per message, next to no client
   CPU): what the broker alone takes. Each pipelined mode is shown as a share of it.
   Beside it (``raw-frames-work``), the same raw frames from a client that spends
   ``--work-us`` (14) microseconds of CPU a message before writing it, as delayq's
   async ``publish_many`` does: on a machine whose cores the client and the broker
   share, what that much client work alone costs the broker's rate.
5. ``--callers`` N (100) coroutines sharing one ``AsyncPublisher``, each awaiting
   ``publish(...)`` (one message, its confirm) in a loop until ``--batch-count`` are
   sent between them, vs ``AsyncPublisher.publish_many(window=W)`` of the same
   messages (pair 2's figure): the target is at least 0.8x. Beside it, the raw twin:
   N coroutines sharing one aio-pika confirm channel, each awaiting
   ``exchange.publish``.
6. N threads calling ``Publisher.publish`` vs ``Publisher.publish_many(window=W)``
   (pair 3's figure), target at least 0.8x: one ``Publisher`` called by all N at once
   ("1 shared": it is thread-safe, the callers share its pipelined connection). Beside
   it, how it was shared before: behind a ``threading.Lock`` around each call ("1
   locked": one confirm at a time), and one ``Publisher`` per thread ("1 each": N
   connections), with that one's raw twin: N threads with a pika
   ``BlockingConnection`` and ``confirm_delivery()`` channel each; and the raw twin
   of the shared one: N threads handing their messages to one raw pika I/O thread
   (a ``SelectConnection`` confirm channel, pika's ``basic_publish``), each waiting on a
   lock of its own that the confirm releases: the least a thread-safe publisher on pika
   must do. And that hand-off with no broker at all (``thread-handoff``): N threads
   handing a lock to one thread that releases it at once, what CPython's thread
   switches alone cost a message, the floor under any publisher whose callers wait in
   their own threads.
   Each caller takes a ticket from a shared counter before every publish, so exactly
   ``--batch-count`` are sent; the clock starts when all N are ready (connections
   open, warm-up sent the same way, threads waiting at a barrier).

Every message goes, with ``mandatory=True`` and ``delivery_mode=2``, to the
tier exchange of a throwaway namespace (``bench<hex>``, ladder ``["1h"]``,
quorum queues as delayq declares them) with a 1 h delay, so nothing is
consumed while the benchmark runs. The raw modes send the same bytes as delayq
does: the same body, the same headers dict (taken from a message built by
``delayq.message.factory.MessageFactory``), a fresh ``message_id`` per message, and
the ``content_type`` and ``timestamp`` properties delayq sets too. Building
that message (validation, headers, ids) is part of delayq's figure; it is what
the framework costs.

Fairness: every mode opens its connection and publishes a short warm-up batch
before the clock starts (``Publisher.publish_many`` opens a connection per
call by design, so its figure includes that); the tier queue is checked to
hold exactly what was confirmed and then purged after every measurement, so
each one starts from an empty queue. The two single-publish modes are bound by
the round trip to the broker, which drifts with the load on the machine, so
they run together on two open connections, taking turns every 100 publishes.
Everything runs ``--rounds`` times, in reverse order every other round, and the
table shows the median per mode.

Besides msg/s, the report shows the client's CPU time per message (this
process's ``time.process_time``): it moves much less than wall-clock time on a
busy machine and is what the framework itself adds. On a shared machine, look
at the per-round figures and the load average before trusting a ratio. With a
local node (no ``--url``), each mode's line also gives the broker's CPU per message
(the node's processes, from /proc, over the step, warm-up included): on a 2-CPU
machine the client's and the broker's CPU together bound the rate, so every
microsecond the client spends is one the broker does not get. And the client's
context switches per message (``getrusage``: every thread's, voluntary or not): what a
mode's threads cost in thread switches beside their CPU.

``--modes`` runs a subset (``--modes async-callers,sync-callers-each``; a callers mode
brings the ``publish_many`` it is compared with). ``async-many-narrow`` and
``sync-many-narrow`` run ``publish_many`` with a window of ``--callers``: N callers never
have more than N messages unconfirmed, so N divided by the broker's confirm latency bounds
them, whatever the client does; beside the callers modes, they say how much of a gap to
``publish_many`` (window W) is that bound and how much is delayq. ``--tracing`` adds the
traced twins of the three delayq modes (an OpenTelemetry SDK provider whose spans are
batched and dropped: ``benchlib.discarding_tracer_provider``),
run in the same rounds, and a table of what tracing costs next to the untraced figure.

Run it::

    python bench/publish.py                       # starts a throwaway local node
    python bench/publish.py --url amqp://guest:guest@localhost:5672/ --rounds 5
    python bench/publish.py --tracing              # tracing on vs off, same run
    RABBITMQ_URL=amqp://... python bench/publish.py --count 5000 --batch-count 50000
    python bench/publish.py --modes async-callers,raw-aio-callers --callers 100

The broker is ``--url``, else ``RABBITMQ_URL``, else a node started from the
RabbitMQ server installed in ``/usr/lib/rabbitmq/bin`` with
:class:`delayq.local.node.LocalNode` (stopped and removed at the end). Progress
goes to stderr, the results table to stdout. The exit code is 0 whether or not
the targets are met; a ratio that misses its target is marked ``BELOW TARGET``.
The namespace's queues and exchanges are deleted at the end, also on errors.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version as package_version

from benchlib import (
    broker,
    broker_cpu_s,
    broker_version,
    command_line,
    discarding_tracer_provider,
    load_average,
    log,
    non_negative_float,
    positive_int,
    purge,
    queue_depth,
)
from publish_concurrent_modes import (
    ASYNC_CALLERS,
    ASYNC_MANY_NARROW,
    CALLERS_LABELS,
    CALLERS_MEASURE,
    CALLERS_VS_MANY_TARGET,
    RAW_AIO_CALLERS,
    RAW_PIKA_CALLERS,
    RAW_PIKA_CALLERS_SHARED,
    SYNC_CALLERS_EACH,
    SYNC_CALLERS_LOCKED,
    SYNC_CALLERS_SHARED,
    SYNC_MANY_NARROW,
    THREAD_HANDOFF,
)
from publish_modes import (
    ASYNC_MANY,
    ASYNC_MANY_TRACED,
    ASYNC_VS_RAW_AIO_TARGET,
    ASYNC_VS_SYNC_MANY_TARGET,
    FRAMEWORK_VS_RAW_TARGET,
    PIPELINED_VS_SINGLE_TARGET,
    RAW_AIO_PIPELINED,
    RAW_FRAMES,
    RAW_FRAMES_WORK,
    RAW_PIKA_SINGLE,
    SYNC_MANY,
    SYNC_MANY_TRACED,
    SYNC_PUBLISH,
    SYNC_PUBLISH_TRACED,
    TRACED,
    Context,
    Settings,
    Timing,
    delayq_async_publish_many,
    delayq_sync_publish_many,
    delete_namespace,
    raw_aio_pika_pipelined,
    raw_frames_socket,
    raw_frames_working,
    single_publish_pair,
    warmup_count,
)
from publish_modes import (
    LABELS as PUBLISH_LABELS,
)

from delayq.local.node import LocalNode
from delayq.sync import apply_topology
from delayq.urls import redact


@dataclass(frozen=True)
class Step:
    """One measurement of a round: one mode, or the two single-publish modes together."""

    keys: tuple[str, ...]
    pipelined: bool
    run: Callable[[Context, bool], dict[str, Timing]]
    """Called with the context and whether framework modes go first."""

    def count(self, settings: Settings) -> int:
        return settings.batch_count if self.pipelined else settings.single_count


def pipelined(key: str, measure: Callable[[Context], Timing]) -> Step:
    return Step((key,), True, lambda ctx, _framework_first: {key: measure(ctx)})


LABELS = {**PUBLISH_LABELS, **CALLERS_LABELS}

STEPS: tuple[Step, ...] = (
    Step((SYNC_PUBLISH, RAW_PIKA_SINGLE), False, single_publish_pair),
    pipelined(ASYNC_MANY, delayq_async_publish_many),
    pipelined(RAW_AIO_PIPELINED, raw_aio_pika_pipelined),
    pipelined(SYNC_MANY, delayq_sync_publish_many),
    pipelined(RAW_FRAMES, raw_frames_socket),
    pipelined(RAW_FRAMES_WORK, raw_frames_working),
    *(pipelined(key, measure) for key, measure in CALLERS_MEASURE.items()),
)
"""Even rounds run these in this order, framework first; odd rounds reversed."""

MODE_CHOICES = {
    "single": SYNC_PUBLISH,
    "async-many": ASYNC_MANY,
    "raw-aio": RAW_AIO_PIPELINED,
    "sync-many": SYNC_MANY,
    "raw-frames": RAW_FRAMES,
    "raw-frames-work": RAW_FRAMES_WORK,
    "async-callers": ASYNC_CALLERS,
    "raw-aio-callers": RAW_AIO_CALLERS,
    "sync-callers-shared": SYNC_CALLERS_SHARED,
    "sync-callers-locked": SYNC_CALLERS_LOCKED,
    "sync-callers-each": SYNC_CALLERS_EACH,
    "raw-pika-callers": RAW_PIKA_CALLERS,
    "raw-pika-callers-shared": RAW_PIKA_CALLERS_SHARED,
    "async-many-narrow": ASYNC_MANY_NARROW,
    "sync-many-narrow": SYNC_MANY_NARROW,
    "thread-handoff": THREAD_HANDOFF,
}
"""``--modes`` names ("single": the two single-publish modes, which take turns)."""
COMPARED_WITH = {
    ASYNC_CALLERS: ASYNC_MANY,
    SYNC_CALLERS_SHARED: SYNC_MANY,
    SYNC_CALLERS_LOCKED: SYNC_MANY,
    SYNC_CALLERS_EACH: SYNC_MANY,
    RAW_PIKA_CALLERS_SHARED: SYNC_MANY,
    THREAD_HANDOFF: SYNC_MANY,
}
"""The ``publish_many`` a callers mode is judged against, run whenever it is."""
SENDS_NOTHING = frozenset({THREAD_HANDOFF})
"""Modes that measure the client alone: the tier queue must hold nothing of theirs."""


def steps_of(ctx: Context) -> tuple[Step, ...]:
    """The run's steps: :data:`STEPS` (those of ``--modes``), with the traced twins when
    ``--tracing``."""
    steps = STEPS
    if ctx.tracing is not None:
        pair = Step(
            (SYNC_PUBLISH, RAW_PIKA_SINGLE, SYNC_PUBLISH_TRACED), False, single_publish_pair
        )
        traced_async = functools.partial(delayq_async_publish_many, traced=True)
        traced_sync = functools.partial(delayq_sync_publish_many, traced=True)
        steps = (
            pair,
            *STEPS[1:],
            pipelined(ASYNC_MANY_TRACED, traced_async),
            pipelined(SYNC_MANY_TRACED, traced_sync),
        )
    chosen = ctx.settings.modes
    if not chosen:
        return steps
    wanted = set(chosen) | {COMPARED_WITH[k] for k in chosen if k in COMPARED_WITH}
    wanted |= {TRACED[k] for k in wanted if k in TRACED and ctx.tracing is not None}
    return tuple(step for step in steps if wanted.intersection(step.keys))


# Running and reporting --------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    rate: float
    """Confirmed messages per second."""
    cpu_us: float
    """Client CPU microseconds per message."""
    broker_us: float | None = None
    """The local node's CPU microseconds per message sent in the step (its warm-up and
    connection set-up included); ``None`` for a broker not started by the bench."""
    switches: float = 0.0
    """The client's context switches per message (all its threads')."""


@dataclass
class Results:
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def add(self, key: str, sample: Sample) -> None:
        self.samples.setdefault(key, []).append(sample)

    def rate(self, key: str) -> float:
        return statistics.median(s.rate for s in self.samples[key])

    def cpu_us(self, key: str) -> float:
        return statistics.median(s.cpu_us for s in self.samples[key])

    def switches(self, key: str) -> float:
        return statistics.median(s.switches for s in self.samples[key])

    def broker_us(self, key: str) -> float | None:
        values = [s.broker_us for s in self.samples[key] if s.broker_us is not None]
        return statistics.median(values) if values else None


def run_step(
    ctx: Context,
    results: Results,
    step: Step,
    framework_first: bool,
    prefix: str,
    node: LocalNode | None = None,
) -> None:
    count = step.count(ctx.settings)
    names = " + ".join(LABELS[k] for k in step.keys)
    log(f"{prefix} {names}: {count} messages each ...")
    gc.collect()
    broker_before = broker_cpu_s(node)
    timings = step.run(ctx, framework_first)
    broker_after = broker_cpu_s(node)
    parked = queue_depth(ctx.url, ctx.queue)
    sending = [k for k in step.keys if k not in SENDS_NOTHING]
    expected = len(sending) * (count + warmup_count(count))
    if parked != expected:
        raise RuntimeError(f"the tier queue holds {parked} messages, expected {expected}")
    purge(ctx.url, ctx.queue)
    broker_us = None
    if broker_before is not None and broker_after is not None and expected:
        broker_us = (broker_after - broker_before) / expected * 1e6
    for key, timing in timings.items():
        sample = Sample(
            count / timing.wall_s, timing.cpu_s / count * 1e6, broker_us, timing.switches / count
        )
        results.add(key, sample)
        log(
            f"{prefix} {LABELS[key]}: {count} in {timing.wall_s:.2f} s = "
            f"{sample.rate:,.0f} msg/s, client CPU {sample.cpu_us:.0f} us/msg"
        )


def run_rounds(ctx: Context, node: LocalNode | None = None) -> Results:
    results = Results()
    rounds = ctx.settings.rounds
    for index in range(rounds):
        framework_first = index % 2 == 0
        steps = steps_of(ctx) if framework_first else tuple(reversed(steps_of(ctx)))
        for step in steps:
            prefix = f"[round {index + 1}/{rounds}]"
            run_step(ctx, results, step, framework_first, prefix, node)
    return results


@dataclass(frozen=True)
class Row:
    label: str
    framework: str
    raw: str
    """The mode it is compared with: a raw client's, or another of delayq's."""
    target: float | None
    raw_client: bool = True
    """Whether ``raw`` is a raw client's mode (then the CPU delayq adds is shown)."""

    def ratio(self, results: Results) -> float:
        return results.rate(self.framework) / results.rate(self.raw)


def rows_of(s: Settings) -> list[Row]:
    n, w = s.callers, s.window
    return [
        Row("sync publish (1 confirm at a time)", SYNC_PUBLISH, RAW_PIKA_SINGLE,
            FRAMEWORK_VS_RAW_TARGET),
        Row(f"async publish_many (window {w})", ASYNC_MANY, RAW_AIO_PIPELINED,
            ASYNC_VS_RAW_AIO_TARGET),
        Row("async publish_many vs sync publish_many", ASYNC_MANY, SYNC_MANY,
            ASYNC_VS_SYNC_MANY_TARGET, raw_client=False),
        Row(f"sync publish_many (window {w}) vs raw pika single", SYNC_MANY, RAW_PIKA_SINGLE,
            PIPELINED_VS_SINGLE_TARGET, raw_client=False),
        Row(f"{n} coroutines x async publish vs publish_many", ASYNC_CALLERS, ASYNC_MANY,
            CALLERS_VS_MANY_TARGET, raw_client=False),
        Row(f"{n} coroutines x async publish vs raw aio-pika", ASYNC_CALLERS, RAW_AIO_CALLERS,
            None),
        Row(f"{n} threads x 1 shared Publisher vs publish_many", SYNC_CALLERS_SHARED,
            SYNC_MANY, CALLERS_VS_MANY_TARGET, raw_client=False),
        Row(f"{n} coroutines x async publish vs publish_many (window {n})", ASYNC_CALLERS,
            ASYNC_MANY_NARROW, CALLERS_VS_MANY_TARGET, raw_client=False),
        Row(f"{n} threads x 1 shared Publisher vs publish_many (window {n})",
            SYNC_CALLERS_SHARED, SYNC_MANY_NARROW, CALLERS_VS_MANY_TARGET, raw_client=False),
        Row(f"publish_many, window {n} vs {w} (the broker's confirm latency)", SYNC_MANY_NARROW,
            SYNC_MANY, None, raw_client=False),
        Row(f"{n} threads x 1 locked Publisher vs publish_many", SYNC_CALLERS_LOCKED, SYNC_MANY,
            CALLERS_VS_MANY_TARGET, raw_client=False),
        Row(f"{n} threads x 1 Publisher each vs publish_many", SYNC_CALLERS_EACH, SYNC_MANY,
            CALLERS_VS_MANY_TARGET, raw_client=False),
        Row(f"{n} threads x 1 Publisher each vs raw pika", SYNC_CALLERS_EACH, RAW_PIKA_CALLERS,
            None),
        Row(f"{n} threads x 1 shared Publisher vs raw pika, 1 I/O thread",
            SYNC_CALLERS_SHARED, RAW_PIKA_CALLERS_SHARED, None),
        Row(f"raw pika, {n} threads to 1 I/O thread vs publish_many", RAW_PIKA_CALLERS_SHARED,
            SYNC_MANY, None, raw_client=False),
        Row(f"{n} threads to 1 thread, no broker, vs publish_many", THREAD_HANDOFF, SYNC_MANY,
            None, raw_client=False),
    ]  # fmt: skip


def report(ctx: Context, results: Results, command: str, version: str, load: str) -> str:
    s = ctx.settings
    measured = results.samples
    rows = [r for r in rows_of(s) if r.framework in measured and r.raw in measured]
    width = max((len(r.label) for r in rows), default=4) + 2
    lines = [f"{'mode':<{width}}{'delayq msg/s':>13}{'vs msg/s':>12}{'ratio':>8}   target"]
    for row in rows:
        ratio = round(row.ratio(results), 2)  # judged as shown
        verdict = "" if row.target is None else f"   >= {row.target:.2f}"
        if row.target is not None and ratio < row.target:
            verdict += "   BELOW TARGET"
        lines.append(
            f"{row.label:<{width}}{results.rate(row.framework):>13,.0f}"
            f"{results.rate(row.raw):>12,.0f}{ratio:>8.2f}{verdict}"
        )

    lines += [
        "",
        f"per mode: msg/s in each of {s.rounds} rounds; medians of msg/s, of client CPU and"
        " of its context switches",
    ]
    shown = {k: label for k, label in LABELS.items() if k in measured}
    label_width = max(len(label) for label in shown.values())
    rates = {k: ", ".join(f"{x.rate:,.0f}" for x in measured[k]) for k in shown}
    rates_width = max(len(r) for r in rates.values())
    for key, label in shown.items():
        broker_us = results.broker_us(key)
        lines.append(
            f"  {label:<{label_width}} {rates[key]:<{rates_width}}  "
            f"median {results.rate(key):>7,.0f} msg/s, {results.cpu_us(key):>4.0f} us CPU/msg"
            + ("" if broker_us is None else f" + broker {broker_us:.0f}")
            + f", {results.switches(key):.2f} switches/msg"
        )
    if RAW_FRAMES_WORK in shown:
        lines.append(f"  (N = {s.work_us:g} us: --work-us)")
    if CALLERS_LABELS.keys() & shown.keys():
        lines.append(f"  (N = {s.callers} callers, sharing one publisher unless '1 each')")
    if RAW_FRAMES in measured:
        lines.append(f"share of the physical limit ({LABELS[RAW_FRAMES]}, window {s.window}):")
        limit = results.rate(RAW_FRAMES)
        for key in (
            ASYNC_MANY,
            SYNC_MANY,
            RAW_FRAMES_WORK,
            RAW_AIO_PIPELINED,
            ASYNC_CALLERS,
            RAW_AIO_CALLERS,
        ):
            if key in measured:
                lines.append(f"  {LABELS[key]:<{label_width}} {results.rate(key) / limit:>5.0%}")
    cpu_rows = [r for r in rows if r.raw_client]
    if cpu_rows:
        lines.append("client CPU that delayq adds per message:")
    for row in cpu_rows:
        extra = results.cpu_us(row.framework) - results.cpu_us(row.raw)
        share = extra / results.cpu_us(row.raw)
        lines.append(f"  {row.label:<{width}} {extra:+.0f} us ({share:+.0%} of raw)")
    if ctx.tracing is not None:
        lines += ["", "tracing on (SDK, spans dropped) vs off, same run (medians):"]
        for plain, traced in TRACED.items():
            if traced not in measured:
                continue  # not among --modes
            ratio = results.rate(traced) / results.rate(plain)
            extra = results.cpu_us(traced) - results.cpu_us(plain)
            lines.append(
                f"  {LABELS[plain]:<36} {results.rate(plain):>8,.0f} -> "
                f"{results.rate(traced):>8,.0f} msg/s ({ratio:.2f}x), {extra:+.0f} us CPU/msg"
            )

    lines += [
        "",
        f"command:   {command}",
        f"broker:    {version}, {redact(ctx.url)}",
        f"client:    Python {platform.python_version()}, pika {package_version('pika')}, "
        f"aio-pika {package_version('aio-pika')}, aiormq {package_version('aiormq')}, "
        f"delayq {package_version('delayq')}",
        f"machine:   {platform.machine()}, {os.cpu_count()} CPUs, load average {load}",
        f"workload:  {s.body_bytes}-byte body, {ctx.topology.queue_type.value} tier queue "
        f"{ctx.queue}; {s.single_count} single / {s.batch_count} pipelined messages per "
        f"measurement, window {s.window}; {s.callers} callers in the callers modes",
    ]
    return "\n".join(lines)


def benchmark(
    url: str,
    settings: Settings,
    command: str,
    tracing: bool = False,
    node: LocalNode | None = None,
) -> None:
    version = broker_version(url)
    ctx = Context.create(url, settings, discarding_tracer_provider() if tracing else None)
    log(f"broker {version} at {redact(url)}; namespace {ctx.topology.namespace}")
    load_before = load_average()
    try:
        apply_topology(ctx.topology, url)
        results = run_rounds(ctx, node)
    finally:
        delete_namespace(url, ctx.topology)
    load = f"{load_before} before, {load_average()} after (1/5/15 min)"
    print(report(ctx, results, command, version, load), flush=True)


# Command line -----------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/publish.py",
        description="Publish throughput of delayq's publishers against raw pika and aio-pika.",
    )
    parser.add_argument("--url", help="broker URL (default: $RABBITMQ_URL, else a local node)")
    parser.add_argument(
        "--count",
        type=positive_int,
        default=3000,
        help="messages per single-publish measurement (default 3000)",
    )
    parser.add_argument(
        "--batch-count",
        type=positive_int,
        default=20000,
        help="messages per pipelined measurement (default 20000)",
    )
    parser.add_argument(
        "--body-bytes", type=positive_int, default=256, help="body size in bytes (default 256)"
    )
    parser.add_argument(
        "--window",
        type=positive_int,
        default=1000,
        help="unconfirmed messages in flight for pipelined modes (default 1000)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=3,
        help="rounds, alternating the order of modes; medians are reported",
    )
    parser.add_argument(
        "--callers",
        type=positive_int,
        default=100,
        help="concurrent callers (coroutines or threads) of the callers modes (default 100)",
    )
    parser.add_argument(
        "--modes",
        default="",
        help="comma-separated modes to run (" + ",".join(MODE_CHOICES) + "; default all)",
    )
    parser.add_argument(
        "--work-us",
        type=non_negative_float,
        default=14.0,
        help="client CPU a message, in microseconds, of the raw-frames-work mode: raw frames "
        "from a client doing that much work (default 14, about delayq's async publish_many)",
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="also run the delayq modes traced (OpenTelemetry SDK, spans dropped), same run",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.modes.split(",") if name and name not in MODE_CHOICES]
    if unknown:
        parser.error(f"unknown --modes {', '.join(unknown)}; choose from {', '.join(MODE_CHOICES)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    settings = Settings(
        single_count=args.count,
        batch_count=args.batch_count,
        body_bytes=args.body_bytes,
        window=args.window,
        rounds=args.rounds,
        callers=args.callers,
        modes=frozenset(MODE_CHOICES[name] for name in args.modes.split(",") if name),
        work_us=args.work_us,
    )
    with broker(args.url) as (url, node):
        benchmark(url, settings, command_line(argv), tracing=args.tracing, node=node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
