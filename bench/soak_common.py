"""What both soak modes share: their settings, the throwaway topology, the broker's memory,
the consumer processes and their RSS, and the handled-message records."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import signal
import sys
import time
import urllib.parse
import urllib.request
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
from benchlib import log
from soak_report import (
    RECORD,
    SEQ,
    RssSample,
    broker_memory_brief,
    broker_memory_line,
    mib,
    parse_vmrss_kib,
)

from delayq import Topology
from delayq.durations import format_ms
from delayq.local.node import LocalNode
from delayq.urls import redact

CONSUMER_SCRIPT = Path(__file__).resolve().with_name("soak_consumer.py")


ROUTING_KEY = "soak.message"


BINDING = "soak.#"


BATCH_EVERY_S = 0.1
"""The steady publisher sends what is due every 100 ms, as one ``publish_many``."""


BATCHES_IN_FLIGHT = 50
"""Unconfirmed batches at most; past that the pacer waits (and the lag is reported)."""


MAX_BATCH = 1000
"""The most messages one ``publish_many`` of the steady soak carries: a pacer that fell
behind sends what is due in batches of this size, never one batch of everything."""


PROGRESS_EVERY_S = 10.0


POLL_S = 0.5


PARK_CHUNK = 10_000
"""Messages per ``publish_many`` call in park mode (a receipt each is kept per call)."""


CHILD_TIMEOUT_S = 90.0


SETTLE_S = 5.0
"""Wait after deleting a namespace before reading the broker's memory."""


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
    in_flight: int
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


@dataclass(frozen=True)
class Result:
    lines: list[str]
    verdict: str
    failed: bool

    @property
    def text(self) -> str:
        return "\n".join([*self.lines, "", "verdict: " + self.verdict])
