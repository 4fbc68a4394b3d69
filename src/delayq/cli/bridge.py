"""``delayq bridge``: run the bridge of each intake of a topology (see
:mod:`delayq.sync.bridge`) until SIGTERM or SIGINT. A stop waits ``--stop-grace`` for
what is in flight; one that had to leave deliveries unconfirmed exits 1, saying so."""

from __future__ import annotations

import logging
from datetime import timedelta

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
                    "--stop-grace",
                    default="10s",
                    metavar="DURATION",
                    help="on SIGTERM/SIGINT, how long to wait for the confirms of what is in "
                    "flight; what is unconfirmed then goes back to the intake queue and the "
                    "command exits 1 (a second signal: at once; default 10s, at most 1h)",
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
    from delayq.sync._bridging import check_stop_grace
    from delayq.sync.bridge import pick_intake
    from delayq.urls import redact
    from delayq.worker import Worker

    grace_s = check_stop_grace(args.stop_grace, "--stop-grace")  # before connecting
    configure_logging(args.log_level, "text")
    if args.log_level != "debug":
        # delayq says what failed in one line of its own; pika's records (a traceback per
        # failed connection) only repeat it, as `delayq worker` does.
        logging.getLogger("pika").setLevel(logging.CRITICAL)
    topology, url = topology_and_url(args)
    names = list(dict.fromkeys(args.intakes)) or [i.exchange for i in topology.intakes]
    worker = Worker(topology)  # a worker of bridges alone: its threads, signals, failures
    for name in names or [pick_intake(topology, None).exchange]:
        worker.bridge(name, prefetch=args.prefetch, stop_grace=timedelta(seconds=grace_s))
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
