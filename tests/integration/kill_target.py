"""A consumer process for the SIGKILL tests: a transactional handler writing to SQLite.

Run by tests (``python -m tests.integration.kill_target ...``), killed with SIGKILL in
the middle of handlers and started again. Each handler appends ``"start <n> <pid>"``
to the *started* log (unbuffered, so the killer can aim at a running handler), waits a
few milliseconds, inserts ``(n, pid)`` into ``effects``, appends ``"wrote <n> <pid>"``
and waits a few milliseconds more before returning: a kill then lands after the write
and before the commit. The ``effects`` table has no unique key, so a side effect run
twice would show as two rows.

With ``--schedule-index`` a ``ScheduleReporter`` (every ``--report-interval``) tells
that index what became of each message. With ``--no-transaction`` (the control case)
the handler writes with a connection of its own in autocommit mode and the key is
completed afterwards, as a handler with an external side effect would: the same kills
then do run effects twice.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from delayq import FixedBackoff, SQLiteStore, Topology


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--topology", required=True, help="a JSON dump of the Topology")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--started", required=True)
    parser.add_argument("--adapter", choices=["sync", "async"], required=True)
    parser.add_argument("--no-transaction", action="store_true")
    parser.add_argument("--schedule-index", help="a SQLite schedule index to report into")
    parser.add_argument("--report-interval", default="100ms")
    parser.add_argument(
        "--sleep-ms",
        type=float,
        nargs=2,
        default=[4.0, 12.0],
        help="each of the handler's two pauses is uniform over this range",
    )
    args = parser.parse_args(argv)

    topology = Topology.model_validate_json(Path(args.topology).read_text())
    store = SQLiteStore(args.db)
    log_fd = os.open(args.started, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()
    pause_s = (args.sleep_ms[0] / 1000, args.sleep_ms[1] / 1000)

    # One connection per handler thread: a sqlite3 connection shared by concurrent
    # handlers is not thread-safe (rows written by one can be lost with another's).
    local = threading.local()

    def own() -> sqlite3.Connection:
        if not hasattr(local, "db"):
            local.db = sqlite3.connect(args.db, isolation_level=None, timeout=30)
        return local.db

    def handler(body: Any, tx: Any = None) -> None:
        n = int(body["n"])
        os.write(log_fd, f"start {n} {pid}\n".encode())
        time.sleep(random.uniform(*pause_s))
        (tx or own()).execute("INSERT INTO effects (n, pid) VALUES (?, ?)", (n, pid))
        os.write(log_fd, f"wrote {n} {pid}\n".encode())
        time.sleep(random.uniform(*pause_s))

    options: dict[str, Any] = dict(
        store=store,
        transactional=not args.no_transaction,
        handler_timeout="2s",
        lease="3s",
        policy=FixedBackoff(delay="1s", max_attempts=10),
    )
    if args.schedule_index is not None:  # the schedule index's consumer-side kill test
        from delayq.schedule.report import ScheduleReporter
        from delayq.schedule.sqlite import SQLiteSchedule

        reporter = ScheduleReporter(
            SQLiteSchedule(args.schedule_index), interval=args.report_interval
        )
        options["observers"] = [reporter]
    if args.adapter == "sync":
        from delayq.sync import Consumer

        # SQLite has one writer: a few handlers at once are plenty (as for the async one).
        consumer = Consumer(
            args.url, topology, args.queue, handler, prefetch=20, concurrency=4, **options
        )
        consumer.start()
        print("ready", flush=True)
        consumer.run()
    else:
        from delayq.aio import AsyncConsumer

        async def run() -> None:
            consumer = AsyncConsumer(
                args.url, topology, args.queue, handler, prefetch=20, concurrency=4, **options
            )
            await consumer.start()
            print("ready", flush=True)
            stop = asyncio.Event()
            await stop.wait()  # until killed

        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
