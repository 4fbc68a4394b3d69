"""Client CPU a delivery on ``AsyncConsumer``'s frame path, without a broker.

``bench/consume.py`` measures consuming against a broker on the same two cores, where
rates move with whatever else runs. This bench takes the broker out: it builds
``--count`` deliveries' frames beforehand (a ``Basic.Deliver``, the content header
delayq's publisher writes, a 256-byte body) and hands them to the frame feed's reader
(``delayq.aio._framefeed``) in the order the wire would, a quarter of the prefetch per
loop turn, on one event loop, and reads this process's CPU time over the whole drain.
Three modes, each ``--rounds`` times, every other round in reverse order:

1. **raw: pamqp** decodes the same frames into its objects (``pamqp.frame.unmarshal``,
   what aio-pika's aiormq reads every frame with), nothing else: the raw client's
   reading, for scale;
2. **the feed alone**: the reader puts each delivery together (its fields, headers and
   body decoded) and starts a task per delivery that does nothing: what receiving costs
   before any decision;
3. **AsyncConsumer + InMemoryStore**: the same deliveries through the consumer's whole
   flow (claim, a no-op async handler, complete, the coalesced ack written to a wire
   that discards it), as in production.

Then, for the sync ``Consumer``, only the content headers: each read into a
``pika.BasicProperties`` by pika's own decoding (what a raw pika consumer pays) and by
the reader delayq installs on the sync consumer's connection
(``delayq.sync._connection.read_content_headers``).

``--dead-lettered`` gives every delivery the headers a delayed message arrives with:
delayq's, RabbitMQ's ``x-death`` array and its ``x-first-death-*`` and
``x-last-death-*`` strings, as RabbitMQ 4.0.5 writes them after a tier's TTL
(3.10.8 writes the same but the ``x-last-death-*`` three); the ``x-death`` of messages
dead-lettered by one tier in one second is the same bytes, as here.

Run it::

    python bench/consume_path.py                    # fresh deliveries
    python bench/consume_path.py --dead-lettered    # as they arrive from a tier

The whole consumer's figure less the feed's is delayq's flow a delivery; the whole
consumer's plus what reading the socket and splitting frames costs (the limit mode of
``bench/consume.py``: 3-4 us) is about what it spends against a broker.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import struct
import sys
import time
from datetime import datetime, timezone
from typing import Any

from benchlib import command_line, log, positive_int
from pamqp import commands, frame, header
from pika import frame as pika_frame

from delayq import Message
from delayq.aio._acks import AckCoalescer, ack_batch
from delayq.aio._framefeed import _Consuming
from delayq.aio.consumer import AsyncConsumer
from delayq.consume.delivery import Delivery
from delayq.links import Settleable
from delayq.message.factory import MessageFactory
from delayq.stores.memory import InMemoryStore
from delayq.sync._connection import _content_header
from delayq.topology.model import Topology

RAW, FEED, FLOW = "raw: pamqp decodes the frames", "the feed alone", "AsyncConsumer + InMemoryStore"
MODES = (RAW, FEED, FLOW)
PIKA_HEADER, SYNC_HEADER = "pika reads the content header", "the sync consumer's reader"
HEADER_MODES = (PIKA_HEADER, SYNC_HEADER)
QUEUE, ROUTING_KEY = "path.dest", "path.key"
TOPOLOGY = Topology.model_validate(
    {
        "namespace": "path",
        "ladder": ["30s"],
        "destinations": [{"queue": QUEUE, "bindings": ["path.#"]}],
    }
)


def deliveries(count: int, dead_lettered: bool) -> list[tuple[bytes, bytes, bytes]]:
    """``(Basic.Deliver, content header, body)`` payloads of ``count`` deliveries."""
    built = MessageFactory(TOPOLOGY).build_many(
        [Message(os.urandom(256), ROUTING_KEY, "30s" if dead_lettered else "0s")] * count
    )
    died = datetime.now(timezone.utc).replace(microsecond=0)
    tier = "path.tier.30s"
    out = []
    for tag, msg in enumerate(built, start=1):
        headers: dict[str, Any] = dict(msg.headers)
        if dead_lettered:
            death = {"count": 1, "reason": "expired", "queue": tier, "time": died}
            headers["x-death"] = [death | {"exchange": tier, "routing-keys": [tier]}]
            for end in ("first", "last"):
                for field, value in (("exchange", tier), ("queue", tier), ("reason", "expired")):
                    headers[f"x-{end}-death-{field}"] = value
        properties = commands.Basic.Properties(
            content_type=msg.content_type,
            headers=headers,
            delivery_mode=2,
            priority=0,
            message_id=msg.message_id,
            timestamp=died,
        )
        deliver = commands.Basic.Deliver("ctag", tag, False, "", ROUTING_KEY)
        content = header.ContentHeader(0, len(msg.body), properties)
        out.append((_payload(deliver), _payload(content), msg.body))
    return out


def _payload(value: Any) -> bytes:
    return frame.marshal(value, 1)[7:-1]


class _Wire:
    """What the reader writes acks to: counted, discarded."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.frames = 0

    def send_frames(self, data: bytes) -> None:
        self.frames += 1


class _Feed:
    queue = QUEUE

    def broker_cancelled(self, reader: object, tag: str) -> None:
        raise RuntimeError("no broker here")

    def channel_lost(self, reader: object, exc: Exception) -> None:
        raise RuntimeError("no broker here")


def pamqp_reads(frames: list[tuple[bytes, bytes, bytes]]) -> float:
    """pamqp's objects of every frame (whole frames, as aiormq reads them); CPU seconds."""
    whole = [_frame(1, d) + _frame(2, h) + _frame(3, b) for d, h, b in frames]
    gc.collect()
    started = time.process_time()
    for data in whole:
        offset = 0
        while offset < len(data):
            consumed, _, _ = frame.unmarshal(data[offset:])
            offset += consumed
    return time.process_time() - started


def header_reads(mode: str, frames: list[tuple[bytes, bytes, bytes]]) -> float:
    """Each content header frame read into a ``pika.BasicProperties`` by pika, or by the
    sync consumer's reader (:func:`delayq.sync._connection.read_content_headers`); CPU
    seconds."""
    whole = [_frame(2, h) for _, h, _ in frames]
    read = pika_frame.decode_frame if mode == PIKA_HEADER else _content_header
    gc.collect()
    started = time.process_time()
    for data in whole:
        if read(data) is None:
            raise RuntimeError(f"{mode}: a header left to pika")
    return time.process_time() - started


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, 1, len(payload)) + payload + b"\xce"


async def drain(mode: str, frames: list[tuple[bytes, bytes, bytes]], prefetch: int) -> float:
    """Hand every delivery over; the CPU seconds until the last is done."""
    done = 0

    async def nothing(message: Settleable, delivery: Delivery) -> None:
        nonlocal done
        done += 1

    async def handler(value: object) -> None:
        nonlocal done
        done += 1

    consumer = AsyncConsumer(
        "amqp://localhost:1/", TOPOLOGY, QUEUE, handler, store=InMemoryStore(), prefetch=prefetch
    )
    consumer._acks = AckCoalescer(ack_batch(prefetch))  # as _open() sets it; no connection
    loop = asyncio.get_running_loop()
    wire = _Wire(loop)
    on_delivery = nothing if mode == FEED else consumer._on_delivery
    reader = _Consuming(_Feed(), wire, on_delivery)  # type: ignore[arg-type]
    turn = max(1, prefetch // 4)
    gc.collect()
    started = time.process_time()
    for first in range(0, len(frames), turn):
        for deliver, content, body in frames[first : first + turn]:
            reader.content(1, deliver)
            reader.content(2, content)
            reader.content(3, body)
        await asyncio.sleep(0)
    deadline = time.monotonic() + 60
    while done < len(frames):
        if time.monotonic() > deadline:  # a delivery lost on the way: no figure
            raise RuntimeError(f"{done} of {len(frames)} deliveries done after 60 s")
        await asyncio.sleep(0)
    await consumer._acks.drain()
    cpu = time.process_time() - started
    if mode == FLOW and (consumer.stats.handled, consumer._acks.settled) != (len(frames),) * 2:
        raise RuntimeError(
            f"{consumer.stats}, {consumer._acks.settled} acked, for {len(frames)} deliveries"
        )
    return cpu


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=positive_int, default=100_000)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--prefetch", type=positive_int, default=200)
    parser.add_argument(
        "--dead-lettered", action="store_true", help="headers as from a tier (x-death)"
    )
    args = parser.parse_args(argv)
    kind = "dead-lettered" if args.dead_lettered else "fresh"
    log(f"building {args.count:,} {kind} deliveries ...")
    frames = deliveries(args.count, args.dead_lettered)
    header_bytes = statistics.median(len(h) for _, h, _ in frames[:100])
    figures: dict[str, list[float]] = {mode: [] for mode in MODES}
    for n in range(args.rounds):
        for mode in MODES if n % 2 == 0 else MODES[::-1]:
            if mode == RAW:
                cpu = pamqp_reads(frames)
            else:
                cpu = asyncio.run(drain(mode, frames, args.prefetch))
            us = cpu / args.count * 1e6
            figures[mode].append(us)
            log(f"[round {n + 1}/{args.rounds}] {mode}: {us:.2f} us CPU a delivery")
        for mode in HEADER_MODES if n % 2 == 0 else HEADER_MODES[::-1]:
            us = header_reads(mode, frames) / args.count * 1e6
            figures.setdefault(mode, []).append(us)
            log(f"[round {n + 1}/{args.rounds}] {mode}: {us:.2f} us CPU a header")
    raw, feed, flow = (statistics.median(figures[m]) for m in MODES)
    print(f"{kind} deliveries, content header {header_bytes:.0f} bytes, prefetch {args.prefetch}")
    print(f"{'mode':34s} {'us CPU a delivery (rounds)':>36s}  median")
    for mode in MODES:
        rounds = ", ".join(f"{v:.2f}" for v in figures[mode])
        print(f"{mode:34s} {rounds:>36s}  {statistics.median(figures[mode]):.2f}")
    print(
        f"delayq's flow a delivery: {flow - feed:.2f} us; the feed {feed / flow:.2f} of the whole"
    )
    print(f"over pamqp's reading alone: the feed {feed / raw:.2f}, the consumer {flow / raw:.2f}")
    print(
        f"{'the sync consumer (content header only)':34s} {'us CPU a header (rounds)':>36s}  median"
    )
    for mode in HEADER_MODES:
        rounds = ", ".join(f"{v:.2f}" for v in figures[mode])
        print(f"{mode:34s} {rounds:>36s}  {statistics.median(figures[mode]):.2f}")
    pika_us, sync_us = (statistics.median(figures[m]) for m in HEADER_MODES)
    print(f"the sync consumer's reader over pika's: {sync_us / pika_us:.2f}")
    print(f"command:   {command_line(argv)}")
    print(f"client:    Python {sys.version.split()[0]}, {struct.calcsize('P') * 8}-bit")


if __name__ == "__main__":
    main(sys.argv[1:])
