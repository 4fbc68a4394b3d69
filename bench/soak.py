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
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Sequence
from importlib.metadata import version as package_version
from pathlib import Path

from benchlib import broker, command_line, load_average, log, positive_int
from soak_common import BrokerMemory, Environment, Settings, broker_version
from soak_park import park
from soak_report import (
    SEQ,
    parse_ladder,
)
from soak_steady import steady

from delayq.durations import to_ms
from delayq.errors import InvalidDelay
from delayq.urls import redact


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
    steady_args.add_argument(
        "--in-flight",
        type=positive_int,
        default=10_000,
        help="the publisher's in-flight bound in messages (InFlightLimit; default 10000)",
    )
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
        "--broker-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a rabbitmq.conf line for the local node (repeatable), e.g. "
        "raft.wal_max_size_bytes=67108864",
    )
    parser.add_argument(
        "--prefetch", type=positive_int, default=50, help="the consumers' prefetch (default 50)"
    )
    parser.add_argument(
        "--body-bytes", type=positive_int, default=256, help="body size, at least 8 (default 256)"
    )
    args = parser.parse_args(argv)
    for line in args.broker_config:
        key, equals, value = line.partition("=")
        if not equals or not key.strip() or not value.strip():
            parser.error(f"--broker-config takes KEY=VALUE, got {line!r}")
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
        in_flight=args.in_flight,
        park_hold_ms=args.park_hold,
        management_url=args.management_url,
    )
    command = command_line(argv)
    config = {k.strip(): v.strip() for k, _, v in (c.partition("=") for c in args.broker_config)}
    with broker(args.url, config) as (url, node):
        memory = (
            BrokerMemory.of_local_node(node)
            if node is not None
            else BrokerMemory.of_management_api(url, args.management_url)
        )
        return asyncio.run(run(Environment(url, command, memory), settings))


if __name__ == "__main__":
    sys.exit(main())
