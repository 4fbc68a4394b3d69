"""Soak: delayq at a steady rate for minutes, and a large backlog parked in long tiers.

Two modes, each against one broker and a throwaway namespace:

``steady`` (the default)
    A paced ``AsyncPublisher`` sends ``--rate`` messages a second for
    ``--duration`` (``publish_many`` of the messages due every 100 ms, several
    batches in flight, so a slow confirm does not slow the pace), each with a
    random delay: uniform over [0, top tier] in whole ms, or with
    ``--distribution tiers`` exactly one of the tiers. One ``AsyncConsumer``
    consumes the destination queue in a process of its own
    (``bench/soak_consumer.py``), so the RSS sampled from ``/proc/<pid>/status``
    every ``--rss-every`` is the consumer's alone. After the last publish the
    run waits up to the top tier plus ``--drain-margin`` for the last messages.

    Each message is due at ``published_at + delay``: the receipt's
    ``published_at_ms``, ``delay_ms`` and ``tier_ms`` are the values delayq
    stamps in the ``delayq-published-at``, ``delayq-delay-ms`` and
    ``delayq-tier-ms`` headers (built once, by ``MessageFactory``); the body
    carries only a sequence number, and the consumer records when its handler
    saw it. The report shows, per tier and overall, the lateness (delivered
    minus requested due, so it includes the tier's rounding up) and the time
    after the TTL (delivered minus published plus the tier's TTL: what broker
    and consumer add), p50/p99/max in ms; messages early (before the requested
    due: must be 0); sent, confirmed, handled, lost (confirmed minus handled:
    must be 0) and duplicates; and the consumer's RSS series with its growth.

``park``
    Publishes ``--park`` messages into long tiers (``--park-ladder``, the
    delay of each message exactly one of them, in turn) with
    ``publish_many(window=--window)``, as fast as the broker confirms. It
    reports the publish rate; the broker's memory before, with the backlog
    parked, and after the namespace is deleted (``rabbitmqctl status`` for a
    local node, else the management API when it answers: the report says
    which); the depth of the tier queues (must equal what was confirmed); and
    the RSS of a consumer process subscribed to the destination queue (which
    receives nothing while the messages wait in the broker) beside an idle
    consumer process of an empty namespace, when ready, once the backlog is
    parked and after ``--park-hold``.

Run it::

    python bench/soak.py --rate 200 --duration 60s             # a smoke run
    python bench/soak.py --rate 1000 --duration 10m --ladder 1s,2s,5s,10s
    python bench/soak.py park --park 100000 --park-ladder 1h,3h
    python bench/soak.py --url amqp://guest:guest@localhost:5672/ --rss-every 30s

The broker is ``--url``, else ``RABBITMQ_URL``, else a node started from the
RabbitMQ server installed in ``/usr/lib/rabbitmq/bin`` with
:class:`delayq.local.node.LocalNode` (stopped and removed at the end). Progress
goes to stderr, the results to stdout. The exit code is 1 when a confirmed
message was lost or one arrived early, else 0: correctness decides it, not
speed. Consumer processes are stopped and the namespaces' queues and exchanges
deleted at the end, also on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import platform
import random
import secrets
import shutil
import signal
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

import aio_pika
from benchlib import broker, command_line, load_average, log, positive_int
from soak_report import (
    IMMEDIATE,
    RECORD,
    SEQ,
    Handled,
    RssSample,
    account,
    accounting_table,
    broker_memory_brief,
    broker_memory_line,
    counts_line,
    lateness_table,
    mib,
    parse_ladder,
    parse_vmrss_kib,
    rss_table,
    signed_mib,
    summarize,
)

from delayq import Message, Receipt, Topology, build_declarations
from delayq.aio import AsyncPublisher, apply_topology
from delayq.durations import format_ms, to_ms
from delayq.errors import DelayqError, InvalidDelay, PublishBatchError
from delayq.local.node import LocalNode
from delayq.sync import delete_topology
from delayq.topology.declarations import ExchangeDecl, QueueDecl
from delayq.urls import redact

CONSUMER_SCRIPT = Path(__file__).resolve().with_name("soak_consumer.py")
ROUTING_KEY = "soak.message"
BINDING = "soak.#"

BATCH_EVERY_S = 0.1
"""The steady publisher sends what is due every 100 ms, as one ``publish_many``."""
BATCHES_IN_FLIGHT = 50
"""Unconfirmed batches at most; past that the pacer waits (and the lag is reported)."""
PROGRESS_EVERY_S = 10.0
POLL_S = 0.5
PARK_CHUNK = 10_000
"""Messages per ``publish_many`` call in park mode (a receipt each is kept per call)."""
CHILD_TIMEOUT_S = 90.0
SETTLE_S = 5.0
"""Wait after deleting a namespace before reading the broker's memory."""


# Settings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    mode: str
    rate: float
    duration_ms: int
    ladder_ms: list[int]
    distribution: str
    rss_every_ms: int
    drain_margin_ms: int
    prefetch: int
    body_bytes: int
    seed: int
    park: int
    park_ladder_ms: list[int]
    window: int
    park_hold_ms: int
    management_url: str | None

    @property
    def total(self) -> int:
        """Messages the steady mode sends."""
        return max(1, round(self.rate * self.duration_ms / 1000))


@dataclass(frozen=True)
class Environment:
    """Where the run happens: the broker, how to read its memory, the command line."""

    url: str
    command: str
    memory: BrokerMemory


def soak_topology(prefix: str, ladder_ms: Sequence[int]) -> Topology:
    namespace = f"{prefix}{secrets.token_hex(4)}"
    return Topology(
        namespace=namespace,
        ladder=[format_ms(ms) for ms in ladder_ms],
        # Destination queue names are global, not per namespace: keep them unique.
        destinations=[{"queue": f"{namespace}.work", "bindings": [BINDING]}],
    )


def destination(topology: Topology) -> str:
    return topology.destinations[0].queue


def body_of(seq: int, padding: bytes) -> bytes:
    return SEQ.pack(seq) + padding


# Broker facts: version, queue depths, memory ----------------------------------------------


async def broker_version(url: str) -> str:
    connection = await aio_pika.connect(url)
    async with connection:
        transport = connection.transport
        assert transport is not None
        props = transport.connection.server_properties
    values = [props.get("product", "?"), props.get("version", "?")]
    return " ".join(v.decode() if isinstance(v, bytes) else str(v) for v in values)


async def queue_depths(url: str, queues: Sequence[str]) -> dict[str, int]:
    """Ready messages per queue, from passive declares (exact for quorum queues)."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        depths = {}
        for name in queues:
            queue = await channel.declare_queue(name, passive=True)
            depths[name] = int(queue.declaration_result.message_count or 0)
    return depths


@dataclass(frozen=True)
class BrokerMemory:
    """Reads the broker's memory breakdown: ``rabbitmqctl`` for a local node, else the
    management API, else nothing (``source`` says which)."""

    source: str
    read_json: Callable[[], dict[str, Any]] | None
    data_dir: Path | None = None

    def line(self) -> str:
        if self.read_json is None:
            return "unavailable"
        try:
            return broker_memory_line(self.read_json())
        except Exception as exc:  # a figure is missing from the report, the run goes on
            return f"unavailable ({type(exc).__name__}: {exc})"

    def brief(self) -> str:
        if self.read_json is None:
            return ""
        try:
            return broker_memory_brief(self.read_json())
        except Exception as exc:
            return f"unavailable ({type(exc).__name__})"

    def disk(self) -> str | None:
        """Bytes under the local node's data folder (queues, WAL, segments), if known."""
        if self.data_dir is None:
            return None
        total = 0
        for root, _dirs, files in os.walk(self.data_dir):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(root, name)).st_size
        return f"{total / 2**20:,.1f} MiB"

    @classmethod
    def of_local_node(cls, node: LocalNode) -> BrokerMemory:
        def read() -> dict[str, Any]:
            memory = json.loads(node.ctl("status", "--formatter", "json"))["memory"]
            assert isinstance(memory, dict)
            return memory

        return cls("rabbitmqctl status (local node)", read, node.base_dir / "mnesia")

    @classmethod
    def of_management_api(cls, amqp_url: str, management_url: str | None) -> BrokerMemory:
        parts = urllib.parse.urlsplit(amqp_url)
        base = management_url or f"http://{parts.hostname or 'localhost'}:15672"
        user = urllib.parse.unquote(parts.username or "guest")
        password = urllib.parse.unquote(parts.password or "guest")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()

        def get(path: str) -> Any:
            request = urllib.request.Request(
                base.rstrip("/") + path, headers={"Authorization": f"Basic {token}"}
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.load(response)

        def read() -> dict[str, Any]:
            nodes = get("/api/nodes")
            name = urllib.parse.quote(nodes[0]["name"], safe="")
            memory = get(f"/api/nodes/{name}?memory=true")["memory"]
            assert isinstance(memory, dict)
            return memory

        try:
            read()
        except Exception as exc:
            return cls(f"unavailable (management API at {redact(base)}: {exc})", None)
        return cls(f"management API at {redact(base)}", read)


# The consumer process ---------------------------------------------------------------------


class ConsumerProcess:
    """``bench/soak_consumer.py`` in a process of its own, with its records file."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, records: Path) -> None:
        self.name = name
        self.process = process
        self.records = records
        self.stats: dict[str, int] = {}

    @classmethod
    async def start(
        cls, name: str, url: str, topology: Topology, prefetch: int, folder: Path
    ) -> ConsumerProcess:
        records = folder / f"{name}.records"
        records.touch()
        config = folder / f"{name}.json"
        config.write_text(
            json.dumps(
                {
                    "topology": topology.model_dump(mode="json"),
                    "queue": destination(topology),
                    "prefetch": prefetch,
                    "records": str(records),
                }
            )
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(CONSUMER_SCRIPT),
            str(config),
            stdout=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
            env={**os.environ, "SOAK_URL": url},  # not on the command line: ps shows that
        )
        child = cls(name, process, records)
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), CHILD_TIMEOUT_S)
        except asyncio.TimeoutError:
            line = b""
        if line.strip() != b"ready":
            await child.close()
            raise RuntimeError(f"consumer process {name} did not start (said {line!r})")
        log(f"consumer process {name} (pid {process.pid}) consumes {destination(topology)}")
        return child

    def rss_kib(self) -> int:
        return parse_vmrss_kib(Path(f"/proc/{self.process.pid}/status").read_text())

    async def stop(self) -> dict[str, int]:
        """SIGTERM, a graceful stop, then its ``ConsumerStats`` (a JSON line)."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            out, _ = await asyncio.wait_for(self.process.communicate(), CHILD_TIMEOUT_S)
        except asyncio.TimeoutError:
            await self.close()
            raise RuntimeError(f"consumer process {self.name} did not stop in time") from None
        lines = [x for x in out.decode().splitlines() if x.strip()]
        if self.process.returncode != 0 or not lines:
            raise RuntimeError(
                f"consumer process {self.name} exited with {self.process.returncode}"
            )
        self.stats = json.loads(lines[-1])
        return self.stats

    async def close(self) -> None:
        """Kill it if it still runs (after an error)."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()


class Records:
    """The consumer's records, read as they grow: first delivery time and calls per message."""

    def __init__(self, path: Path, total: int) -> None:
        self.path = path
        self.offset = 0
        self.first_at = array("q", [0]) * total
        self.calls = array("I", [0]) * total
        self.distinct = 0
        self.stray = 0
        """Records whose sequence number was never sent (must not happen)."""

    def poll(self) -> int:
        """Read the records added since the last poll; returns how many."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        data = data[: len(data) - len(data) % RECORD.size]
        self.offset += len(data)
        total = len(self.calls)
        for seq, at in RECORD.iter_unpack(data):
            if not 0 <= seq < total:
                self.stray += 1
                continue
            if self.calls[seq] == 0:
                self.first_at[seq] = at
                self.distinct += 1
            self.calls[seq] += 1
        return len(data) // RECORD.size


def sample_rss(children: Sequence[ConsumerProcess]) -> list[int]:
    return [c.rss_kib() for c in children]


# Steady mode ------------------------------------------------------------------------------


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
    try:
        receipts: list[Receipt | None] = list(
            await publisher.publish_many(batch, window=len(batch))
        )
    except PublishBatchError as exc:
        log(f"  batch at {first}: {exc}")
        receipts = list(exc.receipts)
    except DelayqError as exc:
        log(f"  batch at {first} not confirmed: {exc}")
        receipts = [None] * len(batch)
    for offset, receipt in enumerate(receipts):
        if receipt is None:
            ledger.failed += 1
        else:
            ledger.confirm(first + offset, receipt)
    ledger.last_confirm_at = time.monotonic()


async def publish_paced(
    url: str, topology: Topology, settings: Settings, ledger: Ledger
) -> tuple[float, float]:
    """Send ``settings.total`` messages at ``settings.rate``; returns (start, end) monotonic."""
    pick_delay = DelayPicker(settings)
    padding = os.urandom(max(0, settings.body_bytes - SEQ.size))
    in_flight: set[asyncio.Task[None]] = set()
    async with AsyncPublisher(url, topology) as publisher:
        await publisher.connect()
        start = time.monotonic()
        while ledger.sent < ledger.total:
            due = min(ledger.total, int(settings.rate * (time.monotonic() - start)) + 1)
            if due > ledger.sent:
                while len(in_flight) >= BATCHES_IN_FLIGHT:
                    await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                first = ledger.sent
                batch = [
                    Message(
                        body_of(seq, padding), ROUTING_KEY, timedelta(milliseconds=pick_delay())
                    )
                    for seq in range(first, due)
                ]
                lag = time.monotonic() - start - first / settings.rate
                ledger.max_lag_s = max(ledger.max_lag_s, lag)
                task = asyncio.create_task(send_batch(publisher, first, batch, ledger))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                ledger.sent = due
            await asyncio.sleep(BATCH_EVERY_S)
        if in_flight:
            await asyncio.gather(*in_flight)
        return start, ledger.last_confirm_at


class RssSampler:
    """Samples the consumer's RSS (and the broker's memory) now and every ``every_s``."""

    def __init__(self, child: ConsumerProcess, memory: BrokerMemory, every_s: float) -> None:
        self.child = child
        self.memory = memory
        self.every_s = every_s
        self.started = time.monotonic()
        self.samples: list[RssSample] = []
        self._task: asyncio.Task[None] | None = None

    async def take(self) -> None:
        at_s, kib = time.monotonic() - self.started, self.child.rss_kib()
        broker = await asyncio.to_thread(self.memory.brief)  # rabbitmqctl takes a second
        self.samples.append(RssSample(at_s, kib, broker))
        log(f"  consumer RSS at {at_s:6.0f} s: {mib(kib)}; broker {broker or 'unknown'}")

    def start(self) -> None:
        async def run() -> None:
            while True:
                await self.take()
                await asyncio.sleep(self.every_s - (time.monotonic() - self.started) % self.every_s)

        self._task = asyncio.create_task(run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.samples and time.monotonic() - self.started - self.samples[-1].at_s < 2:
            self.samples.pop()  # the periodic sample of this very moment
        await self.take()  # the last sample, at the end of the drain


async def report_progress(ledger: Ledger, records: Records, started: float) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY_S)
        records.poll()
        waiting = ledger.confirmed_count - records.distinct
        log(
            f"  {time.monotonic() - started:6.0f} s: sent {ledger.sent:,}, confirmed "
            f"{ledger.confirmed_count:,}, handled {records.distinct:,}, waiting {waiting:,}"
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


@dataclass(frozen=True)
class Result:
    lines: list[str]
    verdict: str
    failed: bool

    @property
    def text(self) -> str:
        return "\n".join([*self.lines, "", "verdict: " + self.verdict])


async def steady(env: Environment, settings: Settings, folder: Path) -> Result:
    url = env.url
    topology = soak_topology("soak", settings.ladder_ms)
    labels = [IMMEDIATE, *(t.label for t in topology.ladder.tiers)]
    ledger = Ledger(settings.total, labels)
    try:
        await apply_topology(topology, url)
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


# Park mode --------------------------------------------------------------------------------


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
            await apply_topology(topology, url)
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


# Running ----------------------------------------------------------------------------------


async def run(env: Environment, settings: Settings) -> int:
    version = await broker_version(env.url)
    log(f"broker {version} at {redact(env.url)}; broker memory from {env.memory.source}")
    load_before = load_average()
    folder = Path(tempfile.mkdtemp(prefix="delayq-soak-"))
    try:
        if settings.mode == "park":
            result = await park(env, settings, folder)
        else:
            result = await steady(env, settings, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines = [
        result.text,
        "",
        f"command:   {env.command}",
        f"broker:    {version}, {redact(env.url)}",
        f"client:    Python {platform.python_version()}, aio-pika {package_version('aio-pika')}, "
        f"delayq {package_version('delayq')}",
        f"machine:   {platform.machine()}, {os.cpu_count()} CPUs, load average {load_before} "
        f"before, {load_average()} after (1/5/15 min)",
    ]
    print("\n".join(lines), flush=True)
    return 1 if result.failed else 0


# Command line -----------------------------------------------------------------------------


def duration(text: str) -> int:
    try:
        return to_ms(text, what="duration")
    except InvalidDelay as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def ladder(text: str) -> list[int]:
    try:
        return parse_ladder(text)
    except (InvalidDelay, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/soak.py",
        description="Soak: lateness, loss and consumer RSS at a steady rate (steady), or a "
        "large backlog parked in long tiers (park).",
    )
    parser.add_argument("mode", nargs="?", choices=("steady", "park"), default="steady")
    parser.add_argument("--url", help="broker URL (default: $RABBITMQ_URL, else a local node)")
    steady_args = parser.add_argument_group("steady")
    steady_args.add_argument(
        "--rate", type=positive_float, default=1000.0, help="messages per second (default 1000)"
    )
    steady_args.add_argument(
        "--duration",
        type=duration,
        default=duration("10m"),
        help="how long to publish (default 10m)",
    )
    steady_args.add_argument(
        "--ladder", type=ladder, default=ladder("1s,2s,5s,10s"), help="tiers (default 1s,2s,5s,10s)"
    )
    steady_args.add_argument(
        "--distribution",
        choices=("uniform", "tiers"),
        default="uniform",
        help="delays uniform over [0, top tier] (default), or exactly one of the tiers",
    )
    steady_args.add_argument(
        "--rss-every",
        type=duration,
        default=duration("60s"),
        help="consumer RSS sampling period (default 60s)",
    )
    steady_args.add_argument(
        "--drain-margin",
        type=duration,
        default=duration("30s"),
        help="wait up to the top tier plus this after publishing (default 30s)",
    )
    steady_args.add_argument("--seed", type=int, default=1, help="seed of the delays")
    park_args = parser.add_argument_group("park")
    park_args.add_argument(
        "--park", type=positive_int, default=1_000_000, help="messages to park (default 1000000)"
    )
    park_args.add_argument(
        "--park-ladder",
        type=ladder,
        default=ladder("1h,3h"),
        help="long tiers to park in (default 1h,3h)",
    )
    park_args.add_argument(
        "--window",
        type=positive_int,
        default=1000,
        help="unconfirmed messages in flight (default 1000)",
    )
    park_args.add_argument(
        "--park-hold",
        type=duration,
        default=duration("30s"),
        help="how long to watch the consumers once parked (default 30s)",
    )
    park_args.add_argument(
        "--management-url",
        help="management API for broker memory with --url (default http://<host>:15672)",
    )
    parser.add_argument(
        "--prefetch", type=positive_int, default=50, help="the consumers' prefetch (default 50)"
    )
    parser.add_argument(
        "--body-bytes", type=positive_int, default=256, help="body size, at least 8 (default 256)"
    )
    args = parser.parse_args(argv)
    if args.duration <= 0:
        parser.error("--duration must be more than 0s")
    if args.rss_every <= 0:
        parser.error("--rss-every must be more than 0s")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    settings = Settings(
        mode=args.mode,
        rate=args.rate,
        duration_ms=args.duration,
        ladder_ms=args.ladder,
        distribution=args.distribution,
        rss_every_ms=args.rss_every,
        drain_margin_ms=args.drain_margin,
        prefetch=args.prefetch,
        body_bytes=max(SEQ.size, args.body_bytes),
        seed=args.seed,
        park=args.park,
        park_ladder_ms=args.park_ladder,
        window=args.window,
        park_hold_ms=args.park_hold,
        management_url=args.management_url,
    )
    command = command_line(argv)
    with broker(args.url) as (url, node):
        memory = (
            BrokerMemory.of_local_node(node)
            if node is not None
            else BrokerMemory.of_management_api(url, args.management_url)
        )
        return asyncio.run(run(Environment(url, command, memory), settings))


if __name__ == "__main__":
    sys.exit(main())
