"""What the benchmark scripts share: the broker they run against, small admin calls
and the pieces of their reports.

The scripts run as ``python bench/<name>.py``, so this folder is on ``sys.path``
and they ``import benchlib``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pika

from delayq.local.node import LocalNode
from delayq.local.probes import tidy_epmd
from delayq.urls import redact

__all__ = [
    "admin_channel",
    "broker",
    "broker_version",
    "command_line",
    "load_average",
    "log",
    "positive_int",
    "purge",
    "queue_depth",
]


def log(text: str) -> None:
    """Progress goes to stderr, so stdout holds only the results."""
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def broker(
    url: str | None, config: Mapping[str, str] | None = None
) -> Iterator[tuple[str, LocalNode | None]]:
    """The broker to measure: ``url``, else ``$RABBITMQ_URL``, else a throwaway local
    node (started from the installed RabbitMQ server with ``config`` added to its
    rabbitmq.conf, stopped and removed after)."""
    url = url or os.environ.get("RABBITMQ_URL")
    if url:
        if config:
            raise SystemExit("--broker-config applies to a local node only, not to --url")
        yield url, None
        return
    log(
        "no --url or RABBITMQ_URL: starting a local RabbitMQ node "
        "($DELAYQ_RABBITMQ_SERVER picks the server: installed, 4.0 or 4.3) ..."
    )
    if config:
        log("  with " + ", ".join(f"{k} = {v}" for k, v in config.items()))
    with tidy_epmd(), LocalNode(config=config) as node:
        log(f"local node {node.name} (RabbitMQ {node.version}) is up at {redact(node.url)}")
        yield node.url, node
        log("stopping the local node ...")


@contextlib.contextmanager
def admin_channel(url: str) -> Iterator[Any]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        yield connection.channel()
    finally:
        with contextlib.suppress(Exception):
            connection.close()


def broker_version(url: str) -> str:
    """The broker's product and version, as it announces them on connection."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        props = connection._impl.server_properties
        product, version = props.get("product", "?"), props.get("version", "?")
    finally:
        connection.close()
    as_text = [v.decode() if isinstance(v, bytes) else str(v) for v in (product, version)]
    return " ".join(as_text)


def queue_depth(url: str, queue: str) -> int:
    """Ready messages, from a passive declare (exact for a quorum queue on declare-ok)."""
    with admin_channel(url) as channel:
        return int(channel.queue_declare(queue, passive=True).method.message_count)


def purge(url: str, queue: str) -> None:
    with admin_channel(url) as channel:
        channel.queue_purge(queue)


def broker_cpu_s(node: LocalNode | None) -> float | None:
    """CPU seconds of the local node's processes (its session, from /proc), if it is one."""
    process = getattr(node, "_process", None)
    if process is None:
        return None
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            text = Path(entry.path, "stat").read_text()
            fields = text[text.rindex(")") + 2 :].split()
            if int(fields[3]) == process.pid:
                total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def load_average() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of at least 0, got {text}")
    return value


def command_line(argv: Sequence[str]) -> str:
    """How this run was started, with any password in a URL redacted."""
    shown = [redact(arg) if "://" in arg else arg for arg in argv]
    return shlex.join(["python", sys.argv[0], *shown])


def discarding_tracer_provider() -> Any:
    """An OpenTelemetry SDK tracer provider whose spans are built, batched and dropped:
    what tracing costs the client, without an exporter's network in the figure
    (``--tracing`` of bench/publish.py and bench/consume.py)."""
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
    except ImportError as exc:
        raise SystemExit("--tracing needs opentelemetry-sdk: pip install -e '.[test]'") from exc

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    # A queue that holds a whole measurement: a full one drops spans, which is cheaper
    # than handing them on and would flatter the figure.
    processor = BatchSpanProcessor(Discard(), max_queue_size=1 << 18, max_export_batch_size=4096)
    provider.add_span_processor(processor)
    return provider
