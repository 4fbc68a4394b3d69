"""``delayq bridge``: run the bridge of each intake of a topology (see
:mod:`delayq.sync.bridge`) until SIGTERM or SIGINT."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any

import click

from delayq.cli._common import EXIT_OK, Args, load_cli_topology
from delayq.cli.options import PositiveInt, leaf, once
from delayq.urls import redact, resolve_url

__all__ = ["bridge_commands"]


def bridge_commands() -> list[click.Command]:
    return [
        leaf(
            "bridge",
            cmd_bridge,
            "schedule what plugin-style publishers send to the topology's intakes "
            "(exchange + x-delay), until SIGTERM/SIGINT",
            [
                click.Option(
                    ["--intake", "intakes"],
                    multiple=True,
                    metavar="EXCHANGE",
                    help="bridge this intake only; repeatable (default: every intake)",
                ),
                once(
                    "--prefetch",
                    type=PositiveInt(),
                    default=1000,
                    help="deliveries in hand per intake (default 1000)",
                ),
                once(
                    "--log-level",
                    type=click.Choice(["debug", "info", "warning", "error"]),
                    default="info",
                    help="default info",
                ),
            ],
            url=True,
            file=True,
        )
    ]


def cmd_bridge(args: Args) -> int:
    from delayq.observe.logs import configure_logging
    from delayq.sync.bridge import Bridge, pick_intake

    configure_logging(args.log_level, "text")
    if args.log_level != "debug":
        # delayq says what failed in one line of its own; pika's records (a traceback per
        # failed connection) only repeat it, as `delayq worker` does.
        logging.getLogger("pika").setLevel(logging.CRITICAL)
    topology = load_cli_topology(args)
    url = resolve_url(args.url)
    names = list(dict.fromkeys(args.intakes)) or [i.exchange for i in topology.intakes]
    intakes = [pick_intake(topology, name) for name in names] or [pick_intake(topology, None)]
    bridges = [Bridge(url, topology, intake.exchange, prefetch=args.prefetch) for intake in intakes]
    print(
        f"delayq bridge: {', '.join(b.intake.exchange + ' -> ' + b.queue for b in bridges)} "
        f"on {redact(url)}",
        flush=True,
    )
    stop = threading.Event()
    failures: list[BaseException] = []

    def run(bridge: Bridge) -> None:
        try:
            bridge.run(install_signal_handlers=False)
        except BaseException as exc:  # the first failure stops every bridge
            failures.append(exc)
            stop.set()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[int, Any] = {
        sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    threads = [
        threading.Thread(target=run, args=(b,), name=f"delayq bridge {b.queue}") for b in bridges
    ]
    try:
        for thread in threads:
            thread.start()
        while not stop.wait(0.2):
            if not any(thread.is_alive() for thread in threads):
                break
    finally:
        for bridge in bridges:
            bridge.request_stop()
        for thread in threads:
            thread.join(60)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for bridge in bridges:
        stats = bridge.stats
        print(
            f"delayq bridge: {bridge.intake.exchange}: {stats.forwarded:,} forwarded, "
            f"{stats.parked:,} parked in {bridge.relay.dlq}, {stats.returned:,} returned, "
            f"{stats.reconnects} reconnects",
            file=sys.stderr,
        )
    if failures:
        raise failures[0]
    logging.getLogger("delayq.bridge").info("bridge stopped")
    return EXIT_OK
