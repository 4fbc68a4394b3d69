"""A consumer process for the poison-message tests: its handler kills the process on
poison messages, as a segfaulting C extension or an out-of-memory kill would.

Run by tests (``python -m tests.integration.poison_target ...``) and started again
after each crash. Bodies are ``{"id": ..., "poison": bool, "sleep_s": float}``; the
handler appends ``"start <id> <pid>"`` to the log, calls ``os._exit(3)`` for a
poison message, else sleeps ``sleep_s`` and appends ``"done <id> <pid>"``. The log is
written unbuffered, so nothing is lost when the process dies.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from delayq import FixedBackoff, SQLiteStore, Topology

POISON_EXIT = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--topology", required=True, help="a JSON dump of the Topology")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--adapter", choices=["sync", "async"], required=True)
    parser.add_argument("--store", default=None, help="an SQLiteStore path")
    parser.add_argument("--prefetch", type=int, default=50)
    args = parser.parse_args(argv)

    topology = Topology.model_validate_json(Path(args.topology).read_text())
    log_fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()

    def handler(body: dict[str, Any]) -> None:
        os.write(log_fd, f"start {body['id']} {pid}\n".encode())
        if body.get("poison"):
            os._exit(POISON_EXIT)
        time.sleep(float(body.get("sleep_s", 0)))
        os.write(log_fd, f"done {body['id']} {pid}\n".encode())

    options: dict[str, Any] = dict(
        prefetch=args.prefetch,
        handler_timeout="1s",
        lease="2s",
        policy=FixedBackoff(delay="1s", max_attempts=5),
    )
    if args.store is not None:
        options["store"] = SQLiteStore(args.store)
    if args.adapter == "sync":
        from delayq.sync import Consumer

        Consumer(args.url, topology, args.queue, handler, **options).run()
    else:
        from delayq.aio import AsyncConsumer

        asyncio.run(AsyncConsumer(args.url, topology, args.queue, handler, **options).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
