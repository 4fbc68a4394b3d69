"""A consumer process for the cancel-at-scale SIGKILL test (``test_cancel_at_scale.py``).

Run by the test (``python -m tests.integration.cancel_kill_target ...``), killed with
SIGKILL mid-run and started again. Its handler is transactional, as in
``kill_target``: it appends ``"start <n> <pid> <epoch s>"`` to the *log* (unbuffered,
so the killer can aim at a running handler and the test can tell when each handler
began), pauses a moment, inserts ``(n, pid)`` into ``effects`` in the store's
transaction (no unique key: a double shows as two rows) and pauses again.

A body's ``fail`` says how it fails: ``"first"`` fails the first attempt only,
``"always"`` every attempt (the test cancels those while their retry waits, so a cancel
that did not take would end in the DLQ). The first failure of each is noted in the
``failed`` table (in autocommit, before any write of the transaction, so it outlives a
kill): the test waits for that row before it cancels.
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
    parser.add_argument("--db", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--adapter", choices=["sync", "async"], required=True)
    args = parser.parse_args(argv)

    topology = Topology.model_validate_json(Path(args.topology).read_text())
    store = SQLiteStore(args.db)
    log_fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()
    local = threading.local()

    def own() -> sqlite3.Connection:
        if not hasattr(local, "db"):
            local.db = sqlite3.connect(args.db, isolation_level=None, timeout=30)
        return local.db

    def handler(body: Any, tx: Any) -> None:
        n = int(body["n"])
        os.write(log_fd, f"start {n} {pid} {time.time():.6f}\n".encode())
        time.sleep(random.uniform(0.0002, 0.0006))
        fail = body.get("fail")
        if fail is not None:
            first = own().execute("INSERT OR IGNORE INTO failed (n) VALUES (?)", (n,)).rowcount
            if first or fail == "always":
                raise RuntimeError(f"this attempt fails ({fail})")
        tx.execute("INSERT INTO effects (n, pid) VALUES (?, ?)", (n, pid))
        time.sleep(random.uniform(0.0002, 0.0006))

    options: dict[str, Any] = dict(
        store=store,
        transactional=True,
        handler_timeout="2s",
        lease="3s",
        policy=FixedBackoff(delay="4s", max_attempts=10),
        prefetch=50,
        concurrency=4,  # SQLite has one writer: a few handlers at once are plenty
    )
    queue = topology.destinations[0].queue
    if args.adapter == "sync":
        from delayq.sync import Consumer

        consumer = Consumer(args.url, topology, queue, handler, **options)
        consumer.start()
        print("ready", flush=True)
        consumer.run()
    else:
        from delayq.aio import AsyncConsumer

        async def run() -> None:
            consumer = AsyncConsumer(args.url, topology, queue, handler, **options)
            await consumer.start()
            print("ready", flush=True)
            await asyncio.Event().wait()  # until killed

        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
