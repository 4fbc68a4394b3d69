"""The park soak: a large backlog published into long tiers, the broker's memory and the
consumers' RSS while it waits, and the time to delete it."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path

from benchlib import log
from soak_common import (
    PARK_CHUNK,
    PROGRESS_EVERY_S,
    ROUTING_KEY,
    SETTLE_S,
    ConsumerProcess,
    Environment,
    Result,
    Settings,
    body_of,
    destination,
    queue_depths,
    sample_rss,
    soak_topology,
)
from soak_report import (
    RECORD,
    SEQ,
    counts_line,
    mib,
    signed_mib,
)

from delayq import Message, Topology, build_declarations
from delayq.aio import AsyncPublisher, apply_topology_async
from delayq.durations import format_ms
from delayq.errors import PublishBatchError
from delayq.sync import delete_topology
from delayq.topology.declarations import ExchangeDecl, QueueDecl


async def publish_parked(url: str, topology: Topology, settings: Settings) -> tuple[int, float]:
    """Publish ``settings.park`` messages, delays taking the tiers in turn; (confirmed, s)."""
    delays = [timedelta(milliseconds=ms) for ms in settings.park_ladder_ms]
    padding = os.urandom(max(0, settings.body_bytes - SEQ.size))
    confirmed = 0
    async with AsyncPublisher(url, topology) as publisher:
        await publisher.connect()
        started = time.monotonic()
        reported = started
        for first in range(0, settings.park, PARK_CHUNK):
            last = min(settings.park, first + PARK_CHUNK)
            batch = [
                Message(body_of(seq, padding), ROUTING_KEY, delays[seq % len(delays)])
                for seq in range(first, last)
            ]
            try:
                confirmed += len(await publisher.publish_many(batch, window=settings.window))
            except PublishBatchError as exc:
                log(f"  batch at {first}: {exc}")
                confirmed += sum(1 for r in exc.receipts if r is not None)
            if time.monotonic() - reported >= PROGRESS_EVERY_S:
                reported = time.monotonic()
                rate = confirmed / (reported - started)
                log(f"  {reported - started:6.0f} s: {confirmed:,} confirmed ({rate:,.0f} msg/s)")
        return confirmed, time.monotonic() - started


def entity_counts(topology: Topology) -> tuple[int, int]:
    declarations = build_declarations(topology)
    queues = sum(1 for d in declarations if isinstance(d, QueueDecl))
    exchanges = sum(1 for d in declarations if isinstance(d, ExchangeDecl))
    return queues, exchanges


async def park(env: Environment, settings: Settings, folder: Path) -> Result:
    url = env.url
    parked = soak_topology("soakpark", settings.park_ladder_ms)
    idle = soak_topology("soakidle", settings.park_ladder_ms)
    tier_queues = [parked.tier_name(t) for t in parked.ladder.tiers]
    deleted: list[Topology] = []
    children: list[ConsumerProcess] = []
    memory: list[tuple[str, str, str | None]] = []
    rss: list[tuple[str, list[int]]] = []

    def note_memory(when: str) -> None:
        memory.append((when, env.memory.line(), env.memory.disk()))

    try:
        for topology in (parked, idle):
            await apply_topology_async(topology, url)
        note_memory("before")
        for name, topology in (("subscribed", parked), ("idle", idle)):
            children.append(
                await ConsumerProcess.start(name, url, topology, settings.prefetch, folder)
            )
        rss.append(("ready", sample_rss(children)))
        labels = " ".join(t.label for t in parked.ladder.tiers)
        log(f"parking {settings.park:,} messages in {labels} (window {settings.window}) ...")
        confirmed, publish_s = await publish_parked(url, parked, settings)
        log(f"{confirmed:,} confirmed in {publish_s:.1f} s")
        depths = await queue_depths(url, [*tier_queues, destination(parked)])
        rss.append(("parked", sample_rss(children)))
        note_memory("parked")
        log(f"holding for {format_ms(settings.park_hold_ms)} ...")
        await asyncio.sleep(settings.park_hold_ms / 1000)
        rss.append((f"+{format_ms(settings.park_hold_ms)}", sample_rss(children)))
        note_memory(f"+{format_ms(settings.park_hold_ms)}")
        stats = [await c.stop() for c in children]
        received = [c.records.stat().st_size // RECORD.size for c in children]
        log(f"deleting namespace {parked.namespace} with its backlog ...")
        started = time.monotonic()
        delete_topology(parked, url)
        delete_s = time.monotonic() - started
        deleted.append(parked)
        await asyncio.sleep(SETTLE_S)  # let the deleted queues' processes and memory go
        note_memory("deleted")
    finally:
        for child in children:
            await child.close()
        for topology in (parked, idle):
            if topology not in deleted:
                delete_topology(topology, url)
        log(f"deleted the queues and exchanges of {parked.namespace} and {idle.namespace}")

    in_tiers = sum(depths[q] for q in tier_queues)
    lost = confirmed - in_tiers
    early = received[0] + depths[destination(parked)]
    failed = lost != 0 or early != 0
    queues, exchanges = entity_counts(parked)
    width = max(len(when) for when, _ in rss) + 2
    lines = [
        f"park: {settings.park:,} messages of {settings.body_bytes} bytes into tiers {labels}, "
        f"the delay of each exactly one tier, in turn",
        f"published: {confirmed:,} confirmed in {publish_s:.1f} s = "
        f"{confirmed / publish_s:,.0f} msg/s (publish_many, window {settings.window}, "
        f"{PARK_CHUNK:,} messages a call)",
        "parked: "
        + ", ".join(f"{q} {depths[q]:,}" for q in tier_queues)
        + f"; in the destination queue: {depths[destination(parked)]}",
        f"lost (confirmed - parked): {lost}; received by the subscribed consumer: {received[0]}"
        " (both must be 0)",
        "",
        f"broker memory ({env.memory.source}):",
        *(f"  {when:<8} {line}" for when, line, _ in memory),
    ]
    if memory[0][2] is not None:
        lines.append(
            "broker data folder on disk: " + ", ".join(f"{when} {disk}" for when, _, disk in memory)
        )
    lines += [
        "",
        f"consumer RSS {'subscribed to ' + destination(parked):>40}{'idle (empty namespace)':>26}",
    ]
    for when, (sub, idle_kib) in rss:
        lines.append(f"  {when:<{width}}{mib(sub):>{50 - width}}{mib(idle_kib):>26}")
    first, last = rss[0][1], rss[-1][1]
    lines += [
        f"  growth{signed_mib(last[0] - first[0]):>{50 - 6}}{signed_mib(last[1] - first[1]):>26}",
        f"consumer stats: subscribed: {counts_line(stats[0])}; idle: {counts_line(stats[1])}",
        "",
        f"namespace {parked.namespace} ({queues} queues, {exchanges} exchanges) with its "
        f"{in_tiers:,} parked messages deleted in {delete_s:.1f} s",
    ]
    return Result(lines, ("FAILED" if failed else "ok") + f" (lost {lost}, early {early})", failed)
