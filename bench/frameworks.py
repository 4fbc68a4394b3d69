"""The task frameworks' delayed messages by their own brokers and through delayq's tiers
(``delayq.integrations``), in one run against one broker.

For Dramatiq (``RabbitmqBroker`` with ``confirm_delivery=True``, as delayq's publishes
are confirmed, beside ``delayq.integrations.dramatiq.DelayqBroker``), taskiq
(taskiq-aio-pika's ``AioPikaBroker`` with its delay queue, beside
``delayq.integrations.taskiq.DelayqBroker``), Celery (its countdown, confirmed, beside
``delayq.integrations.celery.install``; a worker of 8 threads) and FastStream (through
delayq only: its one delay is the plugin's), each by its own broker and by delayq's:

1. ``--messages`` messages with delays uniform over 1 to ``--max-delay`` seconds, sent
   one by one, each confirmed (msg/s), run by a worker in this process
   (Dramatiq: 8 threads; taskiq: 100 tasks); how late each ran after its due time (p50,
   p99, max; a negative lateness is an early run), runs missing and repeated;
2. ``--held`` messages due in an hour, then a worker started in a child process: how many
   it holds in memory (Dramatiq's takes them from ``<queue>.DQ`` and keeps them unacked
   until due) and its resident memory once it took all it takes.

delayq's ladder is a tier a second up to 10 s (and 1 h), so a delayed message waits up to
a second more than asked; ``delayq-exact`` is delayq's exact strategy (100 ms units, 17
levels: a message waits in the levels of its delay's set bits, and runs within a unit).
Exits 1 if a message sent through delayq ran early, never or twice.

    .venv/bin/python bench/frameworks.py                     # a local throwaway node
    .venv/bin/python bench/frameworks.py --messages 5000 --held 100000 --url amqp://...
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
from pathlib import Path

import dramatiq
import pika
from benchlib import broker, broker_version, command_line, load_average, log, positive_int
from frameworks_more import hold as hold_more
from frameworks_more import run_celery, run_faststream, send_held
from frameworks_runs import RUNS, Names, dramatiq_broker, hold, taskiq_broker

from delayq.sync import delete_topology

FRAMEWORKS = ("dramatiq", "taskiq", "celery", "faststream")
KINDS = ("own", "delayq", "delayq-exact")
MORE = {"celery": run_celery, "faststream": run_faststream}
"""Celery's and FastStream's runs (``frameworks_more.py``)."""


def _kinds(framework: str) -> tuple[str, ...]:
    """FastStream has no delay of its own to measure (the plugin's exchange)."""
    return KINDS[1:] if framework == "faststream" else KINDS


def _send_held(framework: str, kind: str, url: str, names: Names, count: int) -> None:
    """``count`` messages due in an hour, sent by the broker of ``kind`` with no worker."""
    if framework in MORE:
        send_held(framework, kind, url, names, count)
        return
    if framework == "dramatiq":
        b = dramatiq_broker(kind, url, names)
        actor = dramatiq.actor(
            lambda *a: None, broker=b, queue_name=names.queue, actor_name=names.queue, max_retries=0
        )
        for index in range(count):
            actor.send_with_options(args=(index,), delay=3_600_000)
        b.close()
        return

    async def main() -> None:
        b = taskiq_broker(kind, url, names)
        task = b.register_task(lambda *a: None, task_name=names.queue)
        await b.startup()
        for index in range(count):
            await task.kicker().with_labels(delay=3600).kiq(index)
        await b.shutdown()

    asyncio.run(main())


def _held(framework: str, kind: str, url: str, names: Names, count: int) -> tuple[int, float]:
    _send_held(framework, kind, url, names, count)
    out = subprocess.run(
        [sys.executable, __file__, "--hold", framework, kind, "--url", url, "--queue", names.queue],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout  # fmt: skip
    _, held, _, rss = out.split()
    return int(held), float(rss)


def _clean(framework: str, url: str, names: Names) -> None:
    delete_topology(names.topology, url)
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    for queue in names.queues(framework):
        channel.queue_delete(queue)
    if framework in ("taskiq", "celery"):
        channel.exchange_delete(names.queue)
    connection.close()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="broker URL (default: $RABBITMQ_URL, else a local node)")
    parser.add_argument("--messages", type=positive_int, default=2000)
    parser.add_argument("--max-delay", type=positive_int, default=10, help="seconds (at most 10)")
    parser.add_argument("--held", type=positive_int, default=20_000)
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--hold", nargs=2, metavar=("FRAMEWORK", "KIND"), help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hold:
        framework, kind = args.hold
        if framework in MORE:
            hold_more(
                framework, kind, args.url, Names(queue=args.queue, exact=kind == "delayq-exact")
            )
        else:
            hold(framework, kind, args.url, args.queue)
        return 0
    frameworks = args.frameworks.split(",")
    if any(f not in FRAMEWORKS for f in frameworks) or args.max_delay > 10:
        parser.error(f"--frameworks: of {', '.join(FRAMEWORKS)}; --max-delay: at most 10")
    rng = random.Random(args.seed)
    delays = [round(rng.uniform(1, args.max_delay), 3) for _ in range(args.messages)]
    failed = False
    rows = []
    with broker(args.url) as (url, _node):
        log(f"{command_line(sys.argv[1:])}; {broker_version(url)}; load {load_average()}")
        for framework in frameworks:
            for kind in _kinds(framework):
                exact = kind == "delayq-exact"
                names, waiting = Names(exact=exact), Names(exact=exact)
                log(f"{framework} by {kind}: {args.messages} messages over 1-{args.max_delay} s")
                try:
                    run = MORE.get(framework) or RUNS[framework]
                    rate, ran = run(kind, url, names, delays, args.max_delay + 120)
                finally:
                    _clean(framework, url, names)
                log(f"{framework} by {kind}: {args.held} messages due in an hour, then a worker")
                try:
                    held, rss = _held(framework, kind, url, waiting, args.held)
                finally:
                    _clean(framework, url, waiting)
                firsts = [runs[0] for runs in ran.late_ms.values()]
                missing = args.messages - len(ran.late_ms)
                twice = sum(len(runs) - 1 for runs in ran.late_ms.values())
                early = sum(1 for late in firsts if late < -5)  # clocks read 5 ms apart at most
                if kind != "own" and (missing or twice or early):
                    failed = True
                rows.append((framework, kind, rate, early, firsts, missing, twice, held, rss))
    head = ("framework", "delay by", "sent msg/s", "early", "late p50", "p99", "max")
    print(f"{head[0]:<10} {head[1]:<12} {head[2]:>10} {head[3]:>6} {head[4]:>9} {head[5]:>8} "
          f"{head[6]:>8} {'missing':>8} {'twice':>6} {'held':>7} {'RSS MB':>7}")  # fmt: skip
    for framework, kind, rate, early, firsts, missing, twice, held, rss in rows:
        late = (
            [
                f"{v / 1000:.2f}s"
                for v in (statistics.median(firsts), _pct(firsts, 0.99), max(firsts))
            ]
            if firsts
            else ["-"] * 3
        )
        print(f"{framework:<10} {kind:<12} {rate:>10,.0f} {early:>6} {late[0]:>9} {late[1]:>8} "
              f"{late[2]:>8} {missing:>8} {twice:>6} {held:>7} {rss:>7.1f}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
