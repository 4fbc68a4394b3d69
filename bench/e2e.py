"""End to end: publish with a 1 s delay, consume after the TTL; the rate a deployment sustains
and how late messages arrive at 80 % of that rate (issue 31, item 1).

The path, in a throwaway namespace ``bench<hex>`` applied with delayq (ladder ``["1s"]``,
quorum queues as delayq declares them, one destination bound to ``bench.#``): publish to the
1 s tier exchange -> tier queue -> TTL dead-letter into the ready exchange -> destination
queue -> consumer acks. Publisher and consumer run in OS processes of their own (spawn), the
broker is the third party on the machine.

Modes (``--modes``, default ``raw,memory,sqlite,redis``; the others run when named):

- ``raw``, the broker's ceiling for this path: pre-encoded publish frames written on a plain
  socket (bench/publish_modes.py's raw frames: the exchange, routing key and headers delayq
  sends, confirms counted) and a raw-frames consumer on delayq's wire (the reader of
  consume_modes.raw_frames_limit: delivery tags, ``basic.ack(multiple=True)``, prefetch 1000)
  that reads only each body's stamp;
- ``memory``, ``sqlite``, ``redis``: ``AsyncPublisher.publish_many`` + ``AsyncConsumer`` with
  ``InMemoryStore``, ``SQLiteStore(<fresh file>)``, ``RedisStore`` (``--redis-url``, else
  ``$REDIS_URL``, else a LocalRedis, as bench/consume.py; skipped with a note if none), at the
  raw consumer's prefetch of 1000 unless ``--prefetch`` says otherwise (like for like: at 200,
  session 20 measured 0.75 of the raw path on 4.0.5 where 1000 gave 0.96);
- ``sync``: the same publisher + ``delayq.sync.Consumer`` with ``InMemoryStore``;
- ``pub-only`` (delayq's publisher, the raw consumer) and ``cons-only`` (the raw publisher,
  ``AsyncConsumer`` with ``InMemoryStore``): delayq on one side only, to tell which side
  costs the path its rate;
- ``raw-work``: the raw path whose publisher and consumer spend ``--work-us P,C``
  microseconds of CPU a message (a busy loop, no I/O; default 10,25, about what delayq's
  spend beyond the raw clients'): what a client's own CPU costs the path when it and the
  broker share the machine's cores.

Every body carries its sequence number and its publish time (``time.time_ns()``), so the
consumer process counts each message (exactly once, none early: not before the TTL in the
broker's whole milliseconds) and its lateness after the TTL: arrival - publish time - 1 s.
Both processes pace in 10 ms slices. Per mode:

1. a search run (``--seconds``): the publisher offers as fast as it goes, but holds back when
   more than 2000 + 2 s x the delivery rate is sent and not yet delivered, so the rate settles
   at what the whole path (publisher, broker, consumer) sustains with the backlog bounded;
   the sustained rate is the arrivals per second from ``t0`` + TTL + warm-up to the end;
2. a run at 80 % of the mode's own sustained rate (or ``--rate``, which also skips the
   searches): lateness p50/p99/max over messages published after the warm-up, and whether it
   kept up (publisher on schedule, all delivered in the window, lateness not growing).

CPU per message: each process's ``time.process_time()`` (all threads) over the run, and the
local node's processes' CPU (from /proc) when the broker is a LocalNode. ``--profile DIR``
runs the delayq modes' processes under cProfile (every thread), writes ``.prof`` files and
prints each one's top functions and where the busy time goes.

Run it::

    python bench/e2e.py                                  # throwaway local node, all modes
    python bench/e2e.py --modes raw,memory --seconds 10
    python bench/e2e.py --modes memory,sqlite --rate 3000 --profile /tmp/e2e-prof
    python bench/e2e.py --rounds 3                       # medians of per-round ratios
    python bench/e2e.py --modes raw,memory,raw-work --work-us 10,25 --rounds 3

It exits 1 when a message was lost, duplicated or early, or a queue was left non-empty.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import platform
import pstats
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from benchlib import (
    admin_channel,
    broker,
    broker_cpu_s,
    broker_version,
    command_line,
    load_average,
    log,
    non_negative_float,
    positive_int,
)
from consume import redis_server
from consume_modes import BINDING
from e2e_modes import MODE_LABELS, RAW_PREFETCH, TTL_S, Shared, Spec, child_main

from delayq import Topology
from delayq.local.node import LocalNode
from delayq.sync import apply_topology, delete_topology
from delayq.urls import redact

MODES = ("raw", "memory", "sqlite", "redis", "sync", "pub-only", "cons-only", "raw-work")
DEFAULT_MODES = "raw,memory,sqlite,redis"
GOALS = {"memory": 0.8, "sqlite": 0.6, "redis": 0.6}
"""Sustained rate over the raw path's (issue 31)."""
LOAD_SHARE = 0.8
LATENESS_GOAL_S = 0.5
"""p99 lateness after the TTL at ``LOAD_SHARE`` of the raw path's rate."""
WARMUP_S = 3.0
"""Excluded after ``t0`` (a quarter of the run at most): publish times for lateness, and
after the TTL too for the delivered rate."""
CHILD_START_S = 60.0


@dataclass(frozen=True)
class Env:
    url: str
    node: LocalNode | None
    topology: Topology
    queue: str
    args: argparse.Namespace
    redis_url: str | None


@dataclass
class Outcome:
    """One run, measured."""

    mode: str
    rate: float | None
    sent: int = 0
    offered: float = 0.0
    delivered: float = 0.0
    late_s: tuple[float, float, float] = (float("nan"),) * 3
    growth_s: float = 0.0
    early: int = 0
    earliest_ms: float = 0.0
    """The smallest arrival - publish time - TTL (negative: before the TTL), in ms."""
    kept_up: bool = True
    max_lag_s: float = 0.0
    max_depth: tuple[int, int] = (0, 0)
    """The most the destination and the tier queue held at once (sampled every second)."""
    cpu_us: tuple[float, float, float | None] = (0.0, 0.0, None)
    """Publisher, consumer, broker CPU microseconds per message."""
    problems: list[str] = field(default_factory=list)
    profiles: tuple[str, str] | None = None


# Running one measurement ---------------------------------------------------------------------


Runs = dict[str, tuple[Outcome | None, Outcome]]
"""One round: each mode's search run (``None`` with ``--rate``) and fixed run."""


def receive(conn: Any, process: Any, want: str, timeout_s: float) -> Any:
    """The next message of a child: ``want``'s payload, or raise on its error."""
    if not conn.poll(timeout_s):
        raise RuntimeError(f"{process.name} sent nothing in {timeout_s:.0f} s")
    try:
        kind, payload = conn.recv()
    except EOFError:
        process.join(5)
        raise RuntimeError(f"{process.name} exited ({process.exitcode}) before {want}") from None
    if kind == "error":
        raise RuntimeError(payload)
    assert kind == want, (kind, want)
    return payload


def empty_queues(env: Env) -> list[str]:
    """Every queue of the namespace holding messages now (after a few looks over a second:
    a quorum queue's count can trail the last ack by a moment)."""
    topology = env.topology
    names = [env.queue, topology.destination(env.queue).dlq, f"{topology.namespace}.unrouted"]
    names += [topology.tier_name(t) for t in topology.ladder.tiers]
    with admin_channel(env.url) as channel:
        for _ in range(10):
            depths = {n: channel.queue_declare(n, passive=True).method.message_count for n in names}
            if not any(depths.values()):
                return []
            time.sleep(0.1)
    return [f"{name} holds {n}" for name, n in depths.items() if n]


def run_once(env: Env, mode: str, rate: float | None, label: str) -> Outcome:
    args = env.args
    context = multiprocessing.get_context("spawn")
    shared = Shared(context)
    store_dir = tempfile.mkdtemp(prefix="delayq-e2e-") if mode == "sqlite" else None
    profile = None
    if args.profile is not None and mode not in ("raw", "raw-work"):
        profile = str(args.profile / f"{mode}-{label}")
    spec = Spec(
        mode=mode,
        url=env.url,
        topology=env.topology.model_dump(mode="json"),
        queue=env.queue,
        rate=rate,
        seconds=args.seconds,
        body_bytes=args.body_bytes,
        prefetch=args.prefetch,
        store_dir=store_dir,
        redis_url=env.redis_url,
        profile=profile,
        work_us=args.work_us,
    )
    asked = "as fast as the path goes" if rate is None else f"{rate:,.0f} msg/s"
    log(f"{MODE_LABELS[mode]}, {label} run ({asked}, {args.seconds:g} s) ...")
    children = []
    try:
        for role in ("consumer", "publisher"):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=child_main, args=(role, spec, shared, theirs), name=f"e2e {mode} {role}"
            )
            process.start()
            theirs.close()
            children.append((process, ours))
            receive(ours, process, "ready", CHILD_START_S)
        (consumer, from_consumer), (publisher, from_publisher) = children
        t0 = time.time() + 0.2
        for _, conn in children:
            conn.send(t0)
        cpu0 = broker_cpu_s(env.node)
        max_depth, next_log = (0, 0), t0 + 5
        tier = env.topology.tier_name(env.topology.ladder.tiers[0])
        with admin_channel(env.url) as channel:
            while not from_publisher.poll(1.0):
                depth = tuple(
                    channel.queue_declare(q, passive=True).method.message_count
                    for q in (env.queue, tier)
                )
                max_depth = (max(max_depth[0], depth[0]), max(max_depth[1], depth[1]))
                if time.time() >= next_log:
                    next_log += 5
                    log(
                        f"  {time.time() - t0:4.0f} s: delivered {shared.delivered.value:,}; "
                        f"destination holds {depth[0]:,}, tier {depth[1]:,}"
                    )
        published = receive(from_publisher, publisher, "done", 0)
        shared.total.value = published["sent"]
        consumed = receive(from_consumer, consumer, "done", 600)  # it fails on a stall itself
        cpu1 = broker_cpu_s(env.node)
        for process, _ in children:
            process.join(30)
    finally:
        for process, conn in children:
            if process.is_alive():
                process.terminate()
                process.join(10)
            conn.close()
        if store_dir is not None:
            shutil.rmtree(store_dir, ignore_errors=True)
    outcome = measure(mode, rate, t0, args.seconds, published, consumed)
    outcome.max_depth = max_depth
    broker_s = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    outcome.cpu_us = (
        published["cpu_s"] / max(1, published["sent"]) * 1e6,
        consumed["cpu_s"] / max(1, consumed["distinct"]) * 1e6,
        None if broker_s is None else broker_s / max(1, consumed["distinct"]) * 1e6,
    )
    outcome.problems += empty_queues(env)
    if profile is not None:
        outcome.profiles = (f"{profile}-publisher.prof", f"{profile}-consumer.prof")
    summary = f"{outcome.delivered:,.0f} msg/s delivered"
    if rate is not None:
        p50, p99, top = outcome.late_s
        summary += (
            f", late p50 {p50 * 1000:.0f} / p99 {p99 * 1000:.0f} / max {top * 1000:.0f} ms, "
            + ("kept up" if outcome.kept_up else "SATURATED")
        )
    log(f"  {summary}" + "".join(f"; PROBLEM: {p}" for p in outcome.problems))
    return outcome


def measure(
    mode: str,
    rate: float | None,
    t0: float,
    seconds: float,
    pub: dict[str, Any],
    cons: dict[str, Any],
) -> Outcome:
    warm = min(WARMUP_S, seconds / 4)
    out = Outcome(mode, rate, sent=pub["sent"], max_lag_s=pub["max_lag_s"])
    stamped, arrived = cons["stamped"], cons["arrived"]
    to_ns = 1_000_000_000
    start_ns, end_ns = int((t0 + warm) * to_ns), int((t0 + seconds) * to_ns)
    ttl_ns = int(TTL_S * to_ns)
    out.delivered = sum(start_ns + ttl_ns <= a < end_ns for a in arrived) / (seconds - warm - TTL_S)
    out.offered = sum(start_ns <= s < end_ns for s in stamped) / (seconds - warm)
    late = [
        (s, (a - s - ttl_ns) / to_ns)
        for s, a in zip(stamped, arrived, strict=True)
        if start_ns <= s < end_ns
    ]
    # Early: before the TTL as RabbitMQ keeps it, in whole milliseconds (a message enqueued
    # at x.9 ms is stamped x ms by the broker and may expire up to 1 ms before publish + TTL
    # in nanoseconds); both stamps floored to ms, as the intake tests compare them.
    ns_ms, ttl_ms = 1_000_000, int(TTL_S * 1000)
    pairs = list(zip(stamped, arrived, strict=True))
    out.early = sum(a // ns_ms - s // ns_ms < ttl_ms for s, a in pairs)
    out.earliest_ms = min(((a - s) / ns_ms - ttl_ms for s, a in pairs), default=0.0)
    if late:
        ordered = sorted(v for _, v in late)
        n = len(ordered)
        out.late_s = (ordered[n // 2], ordered[min(n - 1, int(n * 0.99))], ordered[-1])
        edge = 2 * to_ns
        first = [v for s, v in late if s < start_ns + edge]
        last = [v for s, v in late if s >= end_ns - edge]
        if first and last:
            out.growth_s = statistics.median(last) - statistics.median(first)
    if rate is not None:
        out.kept_up = out.max_lag_s < 0.5 and out.delivered >= 0.95 * rate and out.growth_s < 0.25
    problems = out.problems
    if pub["failed"] or pub["confirmed"] != pub["sent"]:
        problems.append(f"{pub['sent'] - pub['confirmed']} of {pub['sent']} not confirmed")
    if cons["distinct"] != pub["sent"] or cons["extra"]:
        problems.append(
            f"{cons['distinct']} distinct messages delivered of {pub['sent']} sent, "
            f"{cons['extra']} duplicate deliveries"
        )
    if out.early:
        problems.append(
            f"{out.early} messages arrived BEFORE their TTL (the earliest "
            f"{-out.earliest_ms:.3f} ms before it)"
        )
    stats = cons["stats"]
    if stats is not None:
        bad = {k: stats[k] for k in ("duplicates", "retried", "dead_lettered", "returned")}
        if stats["handled"] != pub["sent"] or any(bad.values()):
            problems.append(f"consumer stats: handled {stats['handled']}, {bad}")
    return out


# Reporting ----------------------------------------------------------------------------------


def ms(value: float) -> str:
    return f"{value * 1000:,.0f}"


def report(env: Env, runs: Runs, meta: list[str]) -> str:
    raw = runs.get("raw")
    raw_rate = None if raw is None else sustained(raw)
    if not runs:
        return "\n".join(["(no mode ran)", "", *meta])
    width = max(len(MODE_LABELS[m]) for m in runs) + 2
    lines = [
        f"{'mode':<{width}}{'sustained':>10}{'ratio':>7}  {'goal':<9}| "
        f"{'at msg/s':>8} {'':<10}{'p50':>6}{'p99':>7}{'max ms':>8}"
        f"  p99<{ms(LATENESS_GOAL_S)} | CPU us/msg: pub  cons broker"
    ]
    for mode, (search, fixed) in runs.items():
        rate = sustained((search, fixed))
        ratio = f"{rate / raw_rate:.2f}" if raw_rate else "-"
        goal = GOALS.get(mode)
        verdict = "-"
        if goal is not None and raw_rate:
            verdict = f"{goal:.1f} " + ("ok" if rate / raw_rate >= goal else "NO")
        p50, p99, top = fixed.late_s
        kept = "kept up" if fixed.kept_up else "SATURATED"
        late_ok = "ok" if p99 < LATENESS_GOAL_S and fixed.kept_up else "NO"
        pub_cpu, cons_cpu, broker_cpu = fixed.cpu_us
        broker_text = "-" if broker_cpu is None else f"{broker_cpu:.0f}"
        lines.append(
            f"{MODE_LABELS[mode]:<{width}}{rate:>10,.0f}{ratio:>7}  {verdict:<9}| "
            f"{fixed.rate or 0:>8,.0f} {kept:<10}{ms(p50):>6}{ms(p99):>7}{ms(top):>8}  "
            f"{late_ok:<8}| "
            f"{'':>11}{pub_cpu:>4.0f}{cons_cpu:>6.0f}{broker_text:>7}"
        )
    lines += [
        "(sustained: msg/s delivered in the steady window of the search run, else of the "
        f"fixed run; lateness after the 1 s TTL, goal p99 < {ms(LATENESS_GOAL_S)} ms at "
        f"{LOAD_SHARE:.0%} of the mode's own sustained rate; CPU from that run)",
        "",
        "runs (offered: sent per s after the warm-up; delivered: arrivals per s after the "
        "warm-up and the TTL; a search keeps up to 2000 + 2 s of deliveries in the path, so "
        "where that backlog sits says what limits it: the destination, the consumer):",
    ]
    for mode, (search, fixed) in runs.items():
        for out in (search, fixed):
            if out is None:
                continue
            asked = "search" if out.rate is None else f"at {out.rate:,.0f}"
            extra = (
                ""
                if out.rate is None
                else (f"; pacer lag max {out.max_lag_s:.2f} s, lateness grew {ms(out.growth_s)} ms")
            )
            lines.append(
                f"  {mode:<10}{asked:<10} sent {out.sent:>8,}  offered {out.offered:>7,.0f}  "
                f"delivered {out.delivered:>7,.0f}  late p50 {ms(out.late_s[0]):>5} ms, earliest "
                f"{out.earliest_ms:+.1f} ms  held at "
                f"most: destination {out.max_depth[0]:,}, tier {out.max_depth[1]:,}{extra}"
                + "".join(f"\n    PROBLEM: {p}" for p in out.problems)
            )
    return "\n".join([*lines, "", *meta])


def rounds_summary(rounds: list[Runs]) -> str:
    """Each mode over the rounds: its sustained rate and its ratio to the same round's raw
    path (a ratio from one run moves by up to 2x on a shared machine), and the medians."""
    lines = [
        f"over {len(rounds)} rounds: sustained msg/s | ratio to the same round's raw path "
        f"| p99 lateness ms at {LOAD_SHARE:.0%} (kept up)"
    ]
    width = max(len(MODE_LABELS[m]) for m in rounds[0]) + 2
    for mode in rounds[0]:
        rates = [sustained(runs[mode]) for runs in rounds]
        raws = [sustained(runs["raw"]) if "raw" in runs else 0.0 for runs in rounds]
        ratios = [rate / raw for rate, raw in zip(rates, raws, strict=True) if raw]
        fixed = [runs[mode][1] for runs in rounds]
        ratio_text = "-"
        if ratios:
            median = statistics.median(ratios)
            ratio_text = ", ".join(f"{r:.2f}" for r in ratios) + f" median {median:.2f}"
            goal = GOALS.get(mode)
            if goal is not None:
                ratio_text += f" (goal {goal:.1f} {'ok' if median >= goal else 'NO'})"
        late = ", ".join(
            f"{ms(out.late_s[1])}{'' if out.kept_up else ' SATURATED'}" for out in fixed
        )
        lines.append(
            f"  {MODE_LABELS[mode]:<{width}}"
            + ", ".join(f"{r:,.0f}" for r in rates)
            + f" median {statistics.median(rates):,.0f} | {ratio_text} | {late}"
        )
    return "\n".join(lines)


def sustained(pair: tuple[Outcome | None, Outcome]) -> float:
    search, fixed = pair
    return (search or fixed).delivered


IDLE = (
    "select.epoll",
    "SimpleQueue",
    "acquire' of '_thread",
    "sleep",
    "select.select",
    "posix.read",
)
"""Waits: the event loop's, threads' on locks and queues, the pipe's (only the start time)."""
CATEGORIES = (
    ("AMQP frames and wire (delayq.aio's; pika)", ("/message/frames.py", "/aio/_deliveries.py",
        "/aio/_framing.py", "/aio/_wire.py", "/aio/_framebatch.py", "/aio/_framefeed.py",
        "/aio/_framelink.py", "/aio/_confirms.py", "/pamqp/", "/pika/")),
    ("socket reads/writes", ("selector_events.py", "_socket.socket", "transports.py")),
    ("store", ("/delayq/stores/", "/aio/_store.py", "sqlite3", "/redis/")),
    ("delayq, the rest (uuid4 ids included)", ("/delayq/", "/uuid.py")),
    ("asyncio loop", ("asyncio/", "contextvars", "_asyncio", "selectors.py")),
    ("bench (pacer, handler, records)", ("/bench/",)),
)  # fmt: skip


def category(path: str, func: str) -> str:
    where = f"{path}:{func}"
    return next((name for name, keys in CATEGORIES if any(k in where for k in keys)), "other")


def where_time_goes(stats: Any) -> str:
    """Own time per category (a built-in's shared among its callers), as shares of the busy
    total: waiting in epoll, on locks and queues, in sleeps is idle."""
    totals: dict[str, float] = {}
    idle = 0.0
    for (path, _line, func), (_cc, _nc, own, _cum, callers) in stats.stats.items():
        if any(k in func for k in IDLE):
            idle += own
        elif path == "~" and callers:
            weight = sum(c[2] for c in callers.values()) or 1.0
            for (c_path, _, c_func), c in callers.items():
                name = category(c_path, c_func)
                totals[name] = totals.get(name, 0.0) + own * (c[2] / weight)
        else:
            name = category(path, func)
            totals[name] = totals.get(name, 0.0) + own
    busy = sum(totals.values()) or 1.0
    shares = ", ".join(
        f"{n} {t / busy:.0%}" for n, t in sorted(totals.items(), key=lambda x: -x[1])
    )
    return f"busy {busy:.1f} s (idle {idle:.1f} s): {shares}"


def profile_report(runs: Runs) -> str:
    lines = []
    for mode, (search, fixed) in runs.items():
        out = search or fixed
        if out.profiles is None:
            continue
        for path in out.profiles:
            if not Path(path).exists():
                continue
            text = io.StringIO()
            stats = pstats.Stats(path, stream=text)
            stats.sort_stats("cumulative").print_stats("/delayq/", 15)
            lines += [f"profile {path} ({MODE_LABELS[mode]}):", "  " + where_time_goes(stats)]
            body = text.getvalue()
            lines.append(body[body.find("   ncalls") :].rstrip())
            lines.append("")
    return "\n".join(lines)


# Command line ------------------------------------------------------------------------------


def benchmark(args: argparse.Namespace, url: str, node: LocalNode | None, redis: Any) -> int:
    redis_url, redis_class, redis_note = redis
    version = broker_version(url)
    log(f"broker {version} at {redact(url)}")
    namespace = f"bench{secrets.token_hex(4)}"
    queue = f"{namespace}.e2e"
    topology = Topology(
        namespace=namespace, ladder=["1s"], destinations=[{"queue": queue, "bindings": [BINDING]}]
    )
    env = Env(url, node, topology, queue, args, redis_url if redis_class else None)
    load_before = load_average()
    rounds: list[Runs] = []
    notes = []
    modes = list(args.modes)
    if "redis" in modes and env.redis_url is None:
        modes.remove("redis")
        notes.append(f"{MODE_LABELS['redis']} skipped: {redis_note}")
        log(f"note: {notes[-1]}")
    apply_topology(topology, url)
    try:
        for index in range(args.rounds):
            runs: Runs = {}
            # Every other round in reverse: a mode is not always the one after the raw path.
            for mode in modes if index % 2 == 0 else modes[::-1]:
                label = "" if args.rounds == 1 else f"round {index + 1}/{args.rounds}, "
                search = None if args.rate else run_once(env, mode, None, f"{label}search")
                if args.rate:
                    rate = args.rate
                else:  # each mode at 80 % of what it sustained itself
                    assert search is not None
                    rate = LOAD_SHARE * search.delivered
                runs[mode] = (search, run_once(env, mode, rate, f"{label}fixed"))
            rounds.append({mode: runs[mode] for mode in modes})
    finally:
        delete_topology(topology, url)
        log(f"deleted the queues and exchanges of {namespace}")
    meta = [
        *notes,
        f"command:   {command_line(args.argv)}",
        f"date:      {datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"broker:    {version}, {redact(url)}"
        + ("" if node is None else f" (local node, {node.version})"),
        f"machine:   Python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{load_before} before, {load_average()} after (1/5/15 min)",
        f"workload:  {args.seconds:g} s per run, {args.body_bytes}-byte bodies, delay 1 s into "
        f"quorum tier {topology.tier_name(topology.ladder.tiers[0])}, destination {queue}; "
        f"prefetch {args.prefetch} (raw consumer {RAW_PREFETCH}); warm-up "
        f"{min(WARMUP_S, args.seconds / 4):g} s excluded",
    ]
    if "raw-work" in modes:
        publisher_us, consumer_us = args.work_us
        meta.append(
            f"raw-work:  the raw clients spend {publisher_us:g} us (publisher) and "
            f"{consumer_us:g} us (consumer) of CPU a message (--work-us)"
        )
    if len(rounds) == 1:
        print(report(env, rounds[0], meta), flush=True)
    else:
        for index, runs in enumerate(rounds):
            print(f"round {index + 1}/{len(rounds)}:", flush=True)
            print(report(env, runs, []) + "\n", flush=True)
        print(rounds_summary(rounds) + "\n\n" + "\n".join(meta), flush=True)
    if args.profile is not None:
        print("\n" + profile_report(rounds[-1]), flush=True)
    failed = [
        f"{m}: {p}"
        for runs in rounds
        for m, pair in runs.items()
        for o in pair
        if o
        for p in o.problems
    ]
    for problem in failed:
        print(f"ERROR: {problem}", flush=True)
    return 1 if failed else 0


def work_pair(text: str) -> tuple[float, float]:
    """``--work-us P,C``: two finite numbers of at least 0 (a single one: both sides)."""
    parts = text.split(",")
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"must be P,C (two numbers), got {text!r}")
    publisher, consumer = (non_negative_float(part) for part in parts)
    return publisher, consumer


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/e2e.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--url", help="broker URL (default: $RABBITMQ_URL, else a local node)")
    parser.add_argument("--seconds", type=float, default=20.0, help="per run (default 20)")
    parser.add_argument(
        "--modes", default=DEFAULT_MODES, help=f"of {','.join(MODES)} (default {DEFAULT_MODES})"
    )
    parser.add_argument(
        "--rate", type=float, help="offer this many msg/s in every mode instead of searching"
    )
    parser.add_argument("--profile", type=Path, metavar="DIR", help="cProfile the delayq modes")
    parser.add_argument(
        "--redis-url", help="Redis for RedisStore (default: $REDIS_URL, else a LocalRedis)"
    )
    parser.add_argument(
        "--work-us",
        type=work_pair,
        default=(10.0, 25.0),
        metavar="P,C",
        help="CPU a message the raw-work mode's publisher and consumer spend, in "
        "microseconds (default 10,25: about what delayq's spend beyond the raw clients')",
    )
    parser.add_argument("--body-bytes", type=int, default=256, help="default 256")
    parser.add_argument(
        "--prefetch",
        type=positive_int,
        default=RAW_PREFETCH,
        help=f"delayq consumers' (default {RAW_PREFETCH}, the raw path consumer's: like for "
        "like; a consumer's own default is 50)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every mode this many times, every other round in reverse order, and "
        "report each mode's ratio to the same round's raw path and the median (default 1)",
    )
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    args.modes = [m for m in MODES if m in modes]
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.seconds < 4:
        parser.error("--seconds must be at least 4 (TTL and warm-up are excluded)")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    args.argv = list(argv)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    wants_redis = "redis" in args.modes
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(redis_server(args)) if wants_redis else (None, None, "")
        url, node = stack.enter_context(broker(args.url))
        return benchmark(args, url, node, redis)


if __name__ == "__main__":
    sys.exit(main())
