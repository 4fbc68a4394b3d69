"""A publisher process with a schedule index, for the kill tests of
``test_schedule_kill.py``: run as ``python -m tests.integration.schedule_kill_target``,
killed with SIGKILL at a step of its publishes.

It publishes ``--count`` messages (``s<n>``, one at a time, or ``--batch`` at a time
with ``publish_many``) through a publisher (``--adapter``) with a SQLite index, and
writes each message id to ``--out`` (unbuffered) once its publish returned: confirmed to
the caller. ``--kill add:K`` SIGKILLs the process right after the K-th pending write of
the index committed (nothing of it sent yet); ``--kill move:K`` right before the K-th
confirm's write (the messages confirmed by the broker, their entries still pending);
``--kill none`` runs until the test kills it from outside.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from delayq import Message, Topology
from delayq.aio import AsyncPublisher
from delayq.schedule.entry import Entry, State
from delayq.schedule.record import ScheduleIndex
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.sync import Publisher


class Killing(SQLiteSchedule):
    """A SQLite index that kills its process at the step it is told."""

    def __init__(self, path: str, kill: str) -> None:
        super().__init__(path)
        step, _, nth = kill.partition(":")
        self.step, self.nth, self.calls = step, int(nth or 0), 0

    def _count(self, step: str) -> bool:
        if self.step != step:
            return False
        self.calls += 1
        return self.calls == self.nth

    def add(self, entries: Sequence[Entry]) -> list[bool]:
        added = super().add(entries)
        if self._count("add"):
            os.kill(os.getpid(), signal.SIGKILL)
        return added

    def move(self, ids: Sequence[str], to: State, **kwargs: Any) -> list[State | None]:
        if to is State.SCHEDULED and self._count("move"):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().move(ids, to, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--topology", required=True, help="a JSON dump of the Topology")
    parser.add_argument("--index", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--adapter", choices=["sync", "async"], required=True)
    parser.add_argument("--kill", default="none")
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args(argv)

    topology = Topology.model_validate_json(Path(args.topology).read_text())
    index = ScheduleIndex(Killing(args.index, args.kill))
    out = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    batches = [
        [Message({"n": n}, "job.remind", "30s", message_id=f"s{n}") for n in range(start, end)]
        for start in range(0, args.count, args.batch)
        if (end := min(args.count, start + args.batch))
    ]

    def confirmed(ids: list[str]) -> None:
        os.write(out, "".join(f"{i}\n" for i in ids).encode())

    print("ready", flush=True)
    if args.adapter == "sync":
        with Publisher(args.url, topology, schedule=index) as pub:
            for batch in batches:
                confirmed([r.message_id for r in pub.publish_many(batch)])
        return 0

    async def run() -> None:
        async with AsyncPublisher(args.url, topology, schedule=index) as pub:
            for batch in batches:
                confirmed([r.message_id for r in await pub.publish_many(batch)])

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
