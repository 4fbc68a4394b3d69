"""The steady soak: paced publishing at a rate for a duration, the ledger of what was sent and
confirmed, and the report of lateness per tier, losses, duplicates and the consumer's RSS."""

from __future__ import annotations

import asyncio
import os
import random
import resource
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from benchlib import log
from soak_common import (
    BATCH_EVERY_S,
    BATCHES_IN_FLIGHT,
    MAX_BATCH,
    POLL_S,
    PROGRESS_EVERY_S,
    ROUTING_KEY,
    SETTLE_S,
    ConsumerProcess,
    Environment,
    Records,
    Result,
    RssSampler,
    Settings,
    body_of,
    destination,
    queue_depths,
    soak_topology,
)
from soak_report import (
    IMMEDIATE,
    SEQ,
    Handled,
    account,
    accounting_table,
    counts_line,
    lateness_table,
    rss_table,
    summarize,
)

from delayq import InFlightLimit, Message, Receipt, Topology
from delayq.aio import AsyncPublisher, apply_topology_async
from delayq.durations import format_ms
from delayq.errors import DelayqError, PublishBatchError
from delayq.sync import delete_topology


@dataclass
class Ledger:
    """What the publisher sent and the broker confirmed, per sequence number."""

    total: int
    tier_labels: list[str]
    published_at: array[int] = field(init=False)
    delay_ms: array[int] = field(init=False)
    tier_ms: array[int] = field(init=False)
    tier: array[int] = field(init=False)
    confirmed: bytearray = field(init=False)
    sent: int = 0
    confirmed_count: int = 0
    failed: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    """Messages reported not confirmed, by the error that said so."""
    last_confirm_at: float = 0.0
    max_lag_s: float = 0.0
    """How far the pacer fell behind its schedule at worst."""

    def __post_init__(self) -> None:
        self.published_at = array("q", [0]) * self.total
        self.delay_ms = array("q", [0]) * self.total
        self.tier_ms = array("q", [0]) * self.total
        self.tier = array("b", [0]) * self.total
        self.confirmed = bytearray(self.total)

    def confirm(self, seq: int, receipt: Receipt) -> None:
        self.published_at[seq] = receipt.published_at_ms
        self.delay_ms[seq] = receipt.delay_ms
        self.tier_ms[seq] = receipt.tier_ms
        self.tier[seq] = self.tier_labels.index(receipt.tier or IMMEDIATE)
        self.confirmed[seq] = 1
        self.confirmed_count += 1

    def handled(self, records: Records) -> list[Handled]:
        return [
            Handled(
                tier=self.tier_labels[self.tier[seq]],
                tier_ms=self.tier_ms[seq],
                delay_ms=self.delay_ms[seq],
                published_at_ms=self.published_at[seq],
                delivered_at_ms=records.first_at[seq],
            )
            for seq in range(self.total)
            if self.confirmed[seq] and records.calls[seq]
        ]

    def all_handled(self, records: Records) -> bool:
        if records.distinct < self.confirmed_count:
            return False
        return all(records.calls[s] for s in range(self.total) if self.confirmed[s])


class DelayPicker:
    """Random delays in whole ms: uniform over [0, top tier], or exactly one of the tiers."""

    def __init__(self, settings: Settings) -> None:
        self._rng = random.Random(settings.seed)
        self._ladder = settings.ladder_ms
        self._uniform = settings.distribution == "uniform"

    def __call__(self) -> int:
        if self._uniform:
            return self._rng.randint(0, self._ladder[-1])
        return self._rng.choice(self._ladder)


async def send_batch(
    publisher: AsyncPublisher, first: int, batch: list[Message], ledger: Ledger
) -> None:
    """One ``publish_many``; every message ends confirmed or counted under its error."""
    try:
        receipts: list[Receipt | None] = list(
            await publisher.publish_many(batch, window=len(batch))
        )
    except PublishBatchError as exc:
        log(f"  batch at {first}: {exc}")
        receipts = list(exc.receipts)
        for error in exc.failures.values():
            ledger.failures[type(error).__name__] += 1
    except DelayqError as exc:  # nothing of it sent (PublishBackpressure, ConnectionFailed)
        log(f"  batch at {first} not confirmed: {exc}")
        receipts = [None] * len(batch)
        ledger.failures[type(exc).__name__] += len(batch)
    for offset, receipt in enumerate(receipts):
        if receipt is None:
            ledger.failed += 1
        else:
            ledger.confirm(first + offset, receipt)
    ledger.last_confirm_at = time.monotonic()


def publisher_rss_kib() -> int:
    """This process's resident memory now (the publisher runs here), in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def publisher_peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


async def publish_paced(
    url: str, topology: Topology, settings: Settings, ledger: Ledger
) -> tuple[float, float]:
    """Send ``settings.total`` messages at ``settings.rate``; returns (start, end) monotonic.

    A pacer that falls behind (the publisher slows it: its in-flight bound is full)
    builds what is due in batches of at most ``MAX_BATCH``, with at most
    ``BATCHES_IN_FLIGHT`` of them handed to the publisher: what this process holds
    stays bounded however far behind the schedule it falls, and the lag is reported.
    """
    pick_delay = DelayPicker(settings)
    padding = os.urandom(max(0, settings.body_bytes - SEQ.size))
    in_flight: set[asyncio.Task[None]] = set()
    limit = InFlightLimit(messages=settings.in_flight)
    async with AsyncPublisher(url, topology, in_flight=limit) as publisher:
        await publisher.connect()
        start = time.monotonic()
        while ledger.sent < ledger.total:
            due = min(ledger.total, int(settings.rate * (time.monotonic() - start)) + 1)
            if due > ledger.sent:
                while len(in_flight) >= BATCHES_IN_FLIGHT:
                    await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                first = ledger.sent
                last = min(due, first + MAX_BATCH)
                batch = [
                    Message(
                        body_of(seq, padding), ROUTING_KEY, timedelta(milliseconds=pick_delay())
                    )
                    for seq in range(first, last)
                ]
                lag = time.monotonic() - start - first / settings.rate
                ledger.max_lag_s = max(ledger.max_lag_s, lag)
                task = asyncio.create_task(send_batch(publisher, first, batch, ledger))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                ledger.sent = last
                if last < due:
                    await asyncio.sleep(0)  # behind: the next batch at once
                    continue
            await asyncio.sleep(BATCH_EVERY_S)
        if in_flight:
            await asyncio.gather(*in_flight)
        return start, ledger.last_confirm_at


async def report_progress(ledger: Ledger, records: Records, started: float) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY_S)
        records.poll()
        waiting = ledger.confirmed_count - records.distinct
        log(
            f"  {time.monotonic() - started:6.0f} s: sent {ledger.sent:,}, confirmed "
            f"{ledger.confirmed_count:,}, handled {records.distinct:,}, waiting {waiting:,}; "
            f"publisher RSS {publisher_rss_kib() / 1024:,.0f} MiB"
        )


async def drain(ledger: Ledger, records: Records, settings: Settings) -> float:
    """Wait for every confirmed message, up to the top tier plus the margin; returns seconds."""
    limit_s = (settings.ladder_ms[-1] + settings.drain_margin_ms) / 1000
    started = time.monotonic()
    log(f"publishing done; draining (up to {limit_s:.0f} s) ...")
    while time.monotonic() - started < limit_s:
        records.poll()
        if ledger.all_handled(records):
            break
        await asyncio.sleep(POLL_S)
    return time.monotonic() - started


async def steady(env: Environment, settings: Settings, folder: Path) -> Result:
    url = env.url
    topology = soak_topology("soak", settings.ladder_ms)
    labels = [IMMEDIATE, *(t.label for t in topology.ladder.tiers)]
    ledger = Ledger(settings.total, labels)
    try:
        await apply_topology_async(topology, url)
        result = await steady_in(env, settings, folder, topology, ledger)
    finally:
        delete_topology(topology, url)
        log(f"deleted the queues and exchanges of {topology.namespace}")
    await asyncio.sleep(SETTLE_S)  # let the deleted queues' processes and memory go
    result.lines.append(f"  deleted  {env.memory.line()}")
    return result


async def steady_in(
    env: Environment, settings: Settings, folder: Path, topology: Topology, ledger: Ledger
) -> Result:
    url = env.url
    labels = ledger.tier_labels
    memory_before = env.memory.line()
    child = await ConsumerProcess.start("consumer", url, topology, settings.prefetch, folder)
    records = Records(child.records, settings.total)
    try:
        sampler = RssSampler(child, env.memory, settings.rss_every_ms / 1000)
        sampler.start()
        progress = asyncio.create_task(report_progress(ledger, records, sampler.started))
        log(
            f"publishing {settings.total:,} messages at {settings.rate:g}/s for "
            f"{format_ms(settings.duration_ms)}, delays {settings.distribution} over "
            f"{' '.join(labels[1:])} ..."
        )
        try:
            start, last_confirm = await publish_paced(url, topology, settings, ledger)
            peak_kib = publisher_peak_kib()  # before the report's own per-message lists
            drain_s = await drain(ledger, records, settings)
        finally:
            progress.cancel()
            await sampler.stop()
        stats = await child.stop()
    finally:
        await child.close()
    records.poll()
    depths = await queue_depths(
        url,
        [destination(topology), topology.destinations[0].dlq]
        + [topology.tier_name(t) for t in topology.ladder.tiers],
    )
    memory_after = env.memory.line()
    publish_s = max(last_confirm - start, 1e-9)

    accounting = account(ledger.total, ledger.confirmed, records.calls)
    rows = summarize(ledger.handled(records))
    early = rows[-1].early if rows else 0
    failed = accounting.lost > 0 or early > 0 or records.stray > 0
    left = sum(depths.values())
    lines = [
        f"steady: {ledger.total:,} messages at {settings.rate:g}/s for "
        f"{format_ms(settings.duration_ms)}; ladder {' '.join(labels[1:])}; delays "
        f"{settings.distribution}; {settings.body_bytes}-byte bodies; one AsyncConsumer "
        f"(prefetch {settings.prefetch}) in its own process",
        f"published: {ledger.confirmed_count:,} confirmed in {publish_s:.1f} s = "
        f"{ledger.confirmed_count / publish_s:,.0f} msg/s (asked {settings.rate:g}/s; the "
        f"pacer was at most {ledger.max_lag_s:.2f} s behind its schedule)",
        f"drain: {drain_s:.1f} s after the last confirm",
        f"not confirmed, each reported to the caller: {ledger.failed:,}"
        + "".join(f", {name} {n:,}" for name, n in sorted(ledger.failures.items())),
        f"publisher process RSS: peak {peak_kib / 1024:,.0f} MiB while publishing (the "
        f"publisher holds at most {settings.in_flight:,} messages / 64 MiB unconfirmed, the "
        f"pacer at most {BATCHES_IN_FLIGHT} x {MAX_BATCH:,} built ahead; the soak's own "
        "ledger adds about 40 bytes per message sent)",
        "",
        "lateness in ms (late: delivered - (published + delay asked); after TTL: delivered -"
        " (published + tier TTL))",
        lateness_table(rows) if rows else "(nothing handled)",
        "",
        accounting_table(accounting),
        f"consumer stats: {counts_line(stats)}",
        f"left in the broker (destination, DLQ, tiers): {left:,}"
        + "".join(f", {name} {n:,}" for name, n in depths.items() if n),
        "",
        rss_table(sampler.samples),
        "",
        f"broker memory ({env.memory.source}):",
        f"  before   {memory_before}",
        f"  drained  {memory_after}",
    ]
    verdict = "FAILED" if failed else "ok"
    verdict += f" (lost {accounting.lost}, early {early}, stray records {records.stray})"
    return Result(lines, verdict, failed)
