"""What the schedule index costs a publisher, and how fast it answers (issue 51).

In one run against one broker (``--url``, else ``RABBITMQ_URL``, else a throwaway local
node):

1. ``AsyncPublisher.publish_many`` of ``--messages`` delayed messages without an index
   and with each index of ``--stores`` (SQLite, in memory, Redis, PostgreSQL: the last
   two on ``--redis-url`` / ``--postgres-dsn``, else throwaway local servers of the
   installed packages), ``--rounds`` rounds in alternating order; each run's tier is
   purged after it. Printed: messages/s of each and the index's ratio to none (the
   median of each round's), against the goals of 0.7 for SQLite and Redis, 0.5 for
   PostgreSQL. ``--path stream`` times ``Publisher.send_many`` instead (the Spark jobs'
   path: a window of 1,000 recorded at a time);
2. (``--no-answers`` leaves it out) on a SQLite index of ``--entries`` scheduled
   entries (written straight to the store, untimed), 10 % of them due in the first
   minute: ``count`` of all, of a label and by tier (the gauges' read),
   ``list`` of every entry due within the minute, a page of 1,000 at a time, and a
   ``purge`` of those (their cancel marks in a SQLite idempotency store, the index
   moved); goals: count 1 s, list 1 s, purge 10 s.

    .venv/bin/python bench/schedule.py --messages 20000 --rounds 3 --entries 1000000
    .venv/bin/python bench/schedule.py --path stream --stores sqlite,memory --no-answers
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchlib import broker, broker_version, command_line, load_average, log, positive_int, purge

from delayq import Message, Topology
from delayq.aio import AsyncPublisher
from delayq.local.servers import LocalPostgres, LocalRedis
from delayq.message.envelope import epoch_ms
from delayq.schedule.api import Schedule
from delayq.schedule.base import ScheduleStore
from delayq.schedule.entry import Entry, State
from delayq.schedule.memory import MemorySchedule
from delayq.schedule.query import Query
from delayq.schedule.record import ScheduleIndex
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.stores.sqlite import SQLiteStore
from delayq.sync import Publisher, apply_topology, delete_topology

GOALS = {
    "sqlite": 0.7, "redis": 0.7, "postgres": 0.5, "count": 1.0, "list": 1.0, "purge": 10.0
}  # fmt: skip
STORES = ("sqlite", "memory", "redis", "postgres")


def topology() -> Topology:
    return Topology(
        namespace=f"benchsched{uuid.uuid4().hex[:6]}",
        ladder=["1h"],
        destinations=[{"queue": "orders", "bindings": ["orders.#"]}],
    )


async def publish_rate(url: str, topo: Topology, count: int, index: ScheduleStore | None) -> float:
    schedule = None if index is None else ScheduleIndex(index, labels={"tenant": "acme"})
    async with AsyncPublisher(url, topo, schedule=schedule) as publisher:
        await publisher.publish_many([Message(n, "orders.remind", "1h") for n in range(100)])
        messages = [Message({"order": n}, "orders.remind", "1h") for n in range(count)]
        started = time.perf_counter()
        await publisher.publish_many(messages)
        return count / (time.perf_counter() - started)


def stream_rate(url: str, topo: Topology, count: int, index: ScheduleStore | None) -> float:
    """``Publisher.send_many`` (the Spark jobs' path): with an index, recorded a window at a
    time, the pipeline emptied between windows."""
    schedule = None if index is None else ScheduleIndex(index, labels={"tenant": "acme"})
    failed: list[object] = []

    def settle(i: int, msg: object, error: object) -> None:
        if error is not None:
            failed.append(error)

    with Publisher(url, topo, schedule=schedule) as publisher:
        build = publisher.factory.build
        publisher.send_many((build(n, "orders.remind", "1h") for n in range(100)), settle=settle)
        messages = (build({"order": n}, "orders.remind", "1h") for n in range(count))
        started = time.perf_counter()
        publisher.send_many(messages, settle=settle, window=1000)
        rate = count / (time.perf_counter() - started)
    if failed:
        raise SystemExit(f"{len(failed)} messages failed: {failed[0]!r}")
    return rate


@contextlib.contextmanager
def servers(args: argparse.Namespace) -> Iterator[dict[str, str]]:
    """Where the Redis and PostgreSQL indexes live: the options, else local servers."""
    given = {"redis": args.redis_url, "postgres": args.postgres_dsn}
    found: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        servers_of = (("redis", LocalRedis, "url"), ("postgres", LocalPostgres, "dsn"))
        for kind, local, where in servers_of:
            if kind not in args.stores:
                continue
            if given[kind] is None:
                log(f"starting a local {kind} server ...")
                given[kind] = getattr(stack.enter_context(local()), where)
            found[kind] = str(given[kind])
        yield found


def open_store(mode: str, where: dict[str, str], folder: Path, name: str) -> ScheduleStore:
    if mode == "sqlite":
        return SQLiteSchedule(folder / f"{name}.db")
    if mode == "redis":
        from delayq.schedule.redis import RedisSchedule

        return RedisSchedule(where["redis"], prefix=f"bench:{name}:")
    if mode == "postgres":
        from delayq.schedule.postgres import PostgresSchedule

        return PostgresSchedule(where["postgres"], table=f"bench_{name}")
    return MemorySchedule()


def dispose(mode: str, index: ScheduleStore, where: dict[str, str]) -> None:
    """Close ``index`` and remove what a server kept of it."""
    index.close()
    if mode == "redis":
        import redis

        client = redis.Redis.from_url(where["redis"])
        for key in client.scan_iter(match=getattr(index, "prefix", "bench:") + "*"):
            client.delete(key)
        client.close()
    elif mode == "postgres":
        import psycopg

        with psycopg.connect(where["postgres"], autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {getattr(index, 'table', 'bench_none')}")


def publishing(
    url: str, args: argparse.Namespace, folder: Path, where: dict[str, str]
) -> dict[str, list[float]]:
    topo = topology()
    apply_topology(topo, url)
    rates: dict[str, list[float]] = {"none": [], **{mode: [] for mode in args.stores}}
    try:
        for round_ in range(args.rounds):
            order = list(rates) if round_ % 2 == 0 else list(reversed(rates))
            for mode in order:
                index = None
                if mode != "none":
                    index = open_store(mode, where, folder, f"p{round_}{uuid.uuid4().hex[:6]}")
                try:
                    if args.path == "stream":
                        rate = stream_rate(url, topo, args.messages, index)
                    else:
                        rate = asyncio.run(publish_rate(url, topo, args.messages, index))
                    if index is not None:
                        found = index.count(Query())
                        if found != args.messages + 100:
                            raise SystemExit(f"{mode}: the index holds {found} scheduled entries")
                finally:
                    if index is not None:
                        dispose(mode, index, where)
                rates[mode].append(rate)
                log(f"round {round_ + 1}: {mode:8} {rate:,.0f} msg/s")
                purge(url, topo.tier_name(topo.ladder.tiers[0]))
    finally:
        delete_topology(topo, url)
    return rates


def fill(index: SQLiteSchedule, entries: int, now: int) -> int:
    """``entries`` scheduled entries, one in ten due within the minute; how many are."""
    soon = 0
    batch = []
    for n in range(entries):
        due = now + 30_000 if n % 10 == 0 else now + 3_600_000 + n
        soon += n % 10 == 0
        batch.append(
            Entry(f"e{n:08d}", "bench", "orders.remind", due_at_ms=due, tier="1h",
                  published_at_ms=now, size=20, destinations=("orders",),
                  labels={"tenant": f"t{n % 7}"})
        )  # fmt: skip
        if len(batch) == 20_000 or n == entries - 1:
            index.add(batch)
            index.move([e.id for e in batch], State.SCHEDULED, now_ms=now)
            batch = []
    return soon


def answering(url: str, args: argparse.Namespace, folder: Path) -> dict[str, float]:
    index = SQLiteSchedule(folder / "answers.db")
    now = epoch_ms()
    log(f"filling an index with {args.entries:,} entries (untimed) ...")
    soon = fill(index, args.entries, now)
    times: dict[str, float] = {}
    started = time.perf_counter()
    total = index.count(Query(namespace="bench"))
    times["count"] = time.perf_counter() - started
    started = time.perf_counter()
    labelled = index.count(Query(namespace="bench", labels={"tenant": "t3"}))
    times["count a label"] = time.perf_counter() - started
    started = time.perf_counter()
    tiers = index.tiers(Query(namespace="bench"))
    times["count by tier"] = time.perf_counter() - started
    if tiers != {"1h": args.entries}:
        raise SystemExit(f"wrong answer: by tier {tiers}")
    window = Query(namespace="bench", due_before_ms=now + 60_000)
    started = time.perf_counter()
    listed = sum(1 for _ in Schedule(index).iterate(window, page=1000))
    times["list"] = time.perf_counter() - started
    if (total, listed) != (args.entries, soon) or labelled != len(range(3, args.entries, 7)):
        raise SystemExit(f"wrong answers: count {total}, list {listed}, label {labelled}")
    topo = Topology(
        namespace="bench",
        ladder=["1h"],
        destinations=[{"queue": "orders", "bindings": ["orders.#"]}],
    )
    store = SQLiteStore(folder / "idem.db")
    with Publisher(url, topo, store=store, schedule=ScheduleIndex(index)) as publisher:
        started = time.perf_counter()
        report = Schedule(index, publisher).purge(window)
        times["purge"] = time.perf_counter() - started
    if report.stopped != soon or index.count(window) != 0:
        raise SystemExit(f"the purge cancelled {report.stopped} of {soon}")
    times["purged"] = float(soon)
    store.close()
    index.close()
    return times


def stores_list(text: str) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in chosen if t not in STORES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"--stores takes some of {','.join(STORES)}")
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="broker URL (default $RABBITMQ_URL, else a local node)")
    parser.add_argument("--messages", type=positive_int, default=20_000)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--entries", type=positive_int, default=1_000_000)
    parser.add_argument(
        "--stores",
        type=stores_list,
        default=STORES,
        help=f"the indexes to publish with, comma-separated (default {','.join(STORES)})",
    )
    parser.add_argument(
        "--path",
        choices=("many", "stream"),
        default="many",
        help="AsyncPublisher.publish_many (default), or Publisher.send_many (the Spark jobs')",
    )
    parser.add_argument(
        "--answers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time count, list and purge on a large index (default on)",
    )
    parser.add_argument("--redis-url", help="a Redis for its index (default: a local one)")
    parser.add_argument("--postgres-dsn", help="a PostgreSQL for its (default: a local one)")
    args = parser.parse_args(argv)
    with (
        broker(args.url) as (url, _node),
        servers(args) as where,
        tempfile.TemporaryDirectory() as tmp,
    ):
        print(f"# {command_line(sys.argv[1:] if argv is None else argv)}")
        print(f"# broker: {broker_version(url)}; load before: {load_average()}")
        rates = publishing(url, args, Path(tmp), where)
        answers = answering(url, args, Path(tmp)) if args.answers else {}
        print(f"# load after: {load_average()}")
    base = rates["none"]
    what = "send_many (a stream, window 1000)" if args.path == "stream" else "publish_many"
    print(f"{what}, {args.messages:,} messages, medians of {args.rounds} rounds:")
    print(f"  no index  {statistics.median(base):>9,.0f} msg/s")
    for mode in args.stores:
        ratio = statistics.median(a / b for a, b in zip(rates[mode], base, strict=True))
        goal = GOALS.get(mode)
        verdict = "" if goal is None else f" (goal {goal}: {'met' if ratio >= goal else 'NOT met'})"
        rate = statistics.median(rates[mode])
        print(f"  {mode:8}  {rate:>9,.0f} msg/s  {ratio:.2f} of none{verdict}")
    if not answers:
        return 0
    print(f"an index of {args.entries:,} entries (SQLite):")
    for name in ("count", "count a label", "count by tier", "list", "purge"):
        goal = GOALS.get(name)
        verdict = (
            ""
            if goal is None
            else f" (goal {goal:.0f} s: {'met' if answers[name] <= goal else 'NOT met'})"
        )
        what = f" of {answers['purged']:,.0f}" if name in ("list", "purge") else ""
        print(f"  {name:14} {answers[name]:7.2f} s{what}{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
