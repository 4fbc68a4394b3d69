"""``delayq bridge``: run the bridge of each intake of a topology (see
:mod:`delayq.sync.bridge`) until SIGTERM or SIGINT."""

from __future__ import annotations

import logging

import click

from delayq.cli._common import EXIT_OK, Args, topology_and_url
from delayq.cli.options import Prefetch, leaf, once

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
                    type=Prefetch(),
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
    from delayq.sync.bridge import pick_intake
    from delayq.urls import redact
    from delayq.worker import Worker

    configure_logging(args.log_level, "text")
    if args.log_level != "debug":
        # delayq says what failed in one line of its own; pika's records (a traceback per
        # failed connection) only repeat it, as `delayq worker` does.
        logging.getLogger("pika").setLevel(logging.CRITICAL)
    topology, url = topology_and_url(args)
    names = list(dict.fromkeys(args.intakes)) or [i.exchange for i in topology.intakes]
    worker = Worker(topology)  # a worker of bridges alone: its threads, signals, failures
    for name in names or [pick_intake(topology, None).exchange]:
        worker.bridge(name, prefetch=args.prefetch)
    ns = topology.namespace
    print(
        "delayq bridge: "
        + ", ".join(
            f"{name} -> {pick_intake(topology, name).queue_name(ns)}" for name, _ in worker.bridges
        )
        + f" on {redact(url)}",
        flush=True,
    )
    worker.run(url)  # each bridge logs what it did when it stops
    return EXIT_OK
