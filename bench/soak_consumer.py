"""The consumer process of ``bench/soak.py``: one ``AsyncConsumer``, nothing else.

Started by the driver as ``python bench/soak_consumer.py CONFIG.json`` with
the broker URL in the ``SOAK_URL`` environment variable (never on a command
line, where ``ps`` would show a password). It runs in a process of its own so
that the RSS the driver samples from ``/proc/<pid>/status`` is the consumer's
alone, not the publisher's or the report's.

For every delivery the handler appends one record (the body's sequence number
and the epoch ms it was handled, ``soak_report.RECORD``) to the ``records``
file of the config, through a small fixed buffer flushed every
``FLUSH_EVERY_S``: nothing accumulates in this process, so a growing RSS would
be the consumer's own. There is no idempotency store (an in-memory one would
grow by design); the driver counts duplicates from the records.

It prints ``ready`` on stdout once it consumes, and on SIGTERM or SIGINT (or
when its parent goes away) stops gracefully and prints its ``ConsumerStats``
as one JSON line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path

from soak_report import RECORD, SEQ

from delayq.aio import AsyncConsumer
from delayq.message.envelope import epoch_ms
from delayq.topology.model import Topology

FLUSH_EVERY_S = 0.5
BUFFER_BYTES = 64 * 1024


async def consume(config: dict[str, object], url: str) -> None:
    topology = Topology.model_validate(config["topology"])
    queue = str(config["queue"])
    prefetch = int(str(config["prefetch"]))
    parent = os.getppid()
    with open(Path(str(config["records"])), "ab", buffering=BUFFER_BYTES) as out:
        write, pack, unpack_seq = out.write, RECORD.pack, SEQ.unpack_from

        async def handler(body: bytes) -> None:
            write(pack(unpack_seq(body)[0], epoch_ms()))

        consumer = AsyncConsumer(url, topology, queue, handler, prefetch=prefetch)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await consumer.start()
        print("ready", flush=True)
        try:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), FLUSH_EVERY_S)
                except asyncio.TimeoutError:
                    pass
                out.flush()
                if os.getppid() != parent:  # the driver died: do not linger
                    stop.set()
        finally:
            await consumer.stop()
            out.flush()
    print(json.dumps(dataclasses.asdict(consumer.stats)), flush=True)


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    asyncio.run(consume(config, os.environ["SOAK_URL"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
