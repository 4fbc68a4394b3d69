"""``delayq topology heal`` and the watchdog options of ``delayq worker``."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from delayq.cli._common import (
    EXIT_BROKER,
    EXIT_OK,
    Args,
    on_url_vhost,
    print_json,
    topology_and_url,
)
from delayq.cli.options import PathParam, flag, once
from delayq.errors import InvalidInput
from delayq.ops.heal import DEFAULT_INTERVAL, DEFAULT_THRESHOLD
from delayq.wording import counted

if TYPE_CHECKING:  # heal_options is read by every --help: the watchdog loads to run
    from delayq.ops.management import ManagementAPI
    from delayq.ops.watchdog import HealObserver, Watchdog
    from delayq.topology.model import Topology

__all__ = ["build_watchdog", "check_worker_heal", "cmd_heal", "heal_options"]


def heal_options(prefix: str = "") -> list[click.Option]:
    """The watchdog's options; ``prefix`` (``heal-``) names them inside ``delayq worker``
    (there they have no defaults, so that one given without ``--heal`` is refused)."""
    return [
        once(
            f"--{prefix}threshold",
            default=None if prefix else str(DEFAULT_THRESHOLD),
            metavar="DURATION",
            help=f"dead letters held this long without any going out count as stalled "
            f"(default {DEFAULT_THRESHOLD})",
        ),
        once(
            f"--{prefix}interval",
            default=None if prefix else str(DEFAULT_INTERVAL),
            metavar="DURATION",
            help=f"how often to look (default {DEFAULT_INTERVAL})",
        ),
        flag(
            f"--{prefix}move-leaders",
            help="heal a stalled queue by moving its leader to another online member "
            "(runs rabbitmqctl eval: needs the CLI tools and the Erlang cookie); "
            "without it stalls are only reported",
        ),
        once(
            "--rabbitmqctl",
            default=None if prefix else "rabbitmqctl",
            help='the rabbitmqctl command, e.g. "kubectl exec rabbitmq-0 -- rabbitmqctl" '
            "(default rabbitmqctl; -n <node> is added unless given)",
        ),
        once(
            "--erlang-cookie-file",
            type=PathParam(),
            metavar="FILE",
            help="the cluster's Erlang cookie (default: the CLI's own, $HOME/.erlang.cookie)",
        ),
        once(
            "--management-url",
            help="management HTTP API URLs, comma-separated, tried in turn (default: "
            "$DELAYQ_MANAGEMENT_URL, else each AMQP host on port 15672)",
        ),
    ]


def _management(url: str, explicit: str | None) -> list[ManagementAPI]:
    from delayq.ops.management import ManagementAPI, management_url_for
    from delayq.urls import host_urls

    if explicit or os.environ.get("DELAYQ_MANAGEMENT_URL"):
        chosen, _ = management_url_for(url, explicit)
        urls = [part.strip() for part in chosen.split(",") if part.strip()]
    else:
        urls = [management_url_for(host, None)[0] for host in host_urls(url)]
    if not urls:
        raise InvalidInput("--management-url names no URL")
    return [ManagementAPI(u) for u in dict.fromkeys(urls)]


def _cookie(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        cookie = path.read_text().strip()
    except OSError as exc:
        raise InvalidInput(f"cannot read --erlang-cookie-file {str(path)!r}: {exc}") from None
    if not cookie:
        raise InvalidInput(f"--erlang-cookie-file {str(path)!r} is empty")
    return cookie


def build_watchdog(
    args: Args,
    topology: Topology,
    url: str,
    *,
    prefix: str = "",
    observers: Iterable[HealObserver] = (),
) -> Watchdog:
    """The watchdog the options describe (``prefix``: ``heal_`` for ``delayq worker``),
    watching ``topology`` in the vhost of ``url`` (:func:`on_url_vhost`)."""
    from delayq.ops.watchdog import TransferLeadership, Watchdog

    topology = on_url_vhost(topology, url)
    remedy = None
    if getattr(args, f"{prefix}move_leaders"):
        command = shlex.split("rabbitmqctl" if args.rabbitmqctl is None else args.rabbitmqctl)
        if not command:
            raise InvalidInput("--rabbitmqctl is empty")
        remedy = TransferLeadership(tuple(command), _cookie(args.erlang_cookie_file))
    return Watchdog(
        topology,
        _management(url, args.management_url),
        threshold=getattr(args, f"{prefix}threshold") or DEFAULT_THRESHOLD,
        interval=getattr(args, f"{prefix}interval") or DEFAULT_INTERVAL,
        remedy=remedy,
        observers=observers,
    )


WORKER_HEAL_OPTIONS = (
    "heal_threshold",
    "heal_interval",
    "heal_move_leaders",
    "rabbitmqctl",
    "erlang_cookie_file",
    "management_url",
)


def check_worker_heal(args: Args) -> None:
    """Refuse a watchdog option of ``delayq worker`` given without ``--heal``: it would
    be ignored, and a watchdog the user thinks runs is worse than none."""
    if args.heal:
        if args.rabbitmqctl is not None or args.erlang_cookie_file is not None:
            if not args.heal_move_leaders:
                raise InvalidInput(
                    "--rabbitmqctl and --erlang-cookie-file are used only with --heal-move-leaders"
                )
        return
    given = [name for name in WORKER_HEAL_OPTIONS if getattr(args, name) not in (None, False)]
    if given:
        option = "--" + given[0].replace("_", "-")
        raise InvalidInput(f"{option} is a watchdog option: add --heal to run the watchdog")


def cmd_heal(args: Args) -> int:
    topology, url = topology_and_url(args)
    dog = build_watchdog(args, topology, url)
    if args.watch:
        return _watch(dog)
    return _once(dog, args.json)


def _watch(dog: Watchdog) -> int:
    """Until SIGTERM/SIGINT; exit 0 (what was found went to the log as it happened)."""
    import logging

    from delayq.observe.logs import configure_logging

    if not logging.getLogger().handlers:
        configure_logging("info", "text")
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM,)}
    try:
        dog.run(stop)
    except KeyboardInterrupt:
        pass
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    return EXIT_OK


def _once(dog: Watchdog, as_json: bool) -> int:
    """Look until ``threshold`` has passed (less if nothing holds dead letters); exit 0 if
    nothing stalled or every stall was healed, 1 otherwise."""
    import logging

    from delayq.ops.watchdog import HealOutcome

    # This pass prints each stall itself; the watchdog's log lines would only repeat them.
    logging.getLogger("delayq.watchdog").setLevel(logging.CRITICAL)
    threshold_s = dog.detector.threshold_s
    started = time.monotonic()

    def say(text: str) -> None:
        if not as_json:
            print(text, flush=True)

    say(
        f"watching {counted(len(dog.watched), 'queue')} of {dog.topology.namespace} for up "
        f"to {threshold_s:g} s (a look every {dog.interval_s:g} s)"
    )
    while True:
        events = dog.look()
        for event in events:
            say(event.describe())
        waiting = dog.detector.waiting()
        elapsed = time.monotonic() - started
        if not waiting or elapsed >= threshold_s + dog.interval_s:
            break
        say(
            f"{elapsed:4.0f} s: {counted(len(waiting), 'queue')} "
            f"{'holds' if len(waiting) == 1 else 'hold'} dead letters ("
            + ", ".join(f"{q}: {n:,}" for q, n in sorted(waiting.items())[:5])
            + ")"
        )
        time.sleep(dog.interval_s)
    unhealed = [e for e in dog.events if e.outcome is not HealOutcome.HEALED]
    if as_json:
        print_json(
            {
                "namespace": dog.topology.namespace,
                "stalls": [
                    {
                        "queue": e.stall.queue,
                        "waiting": e.stall.waiting,
                        "stalled_s": round(e.stall.stalled_s, 1),
                        "leader": e.stall.sample.leader,
                        "outcome": e.outcome.value,
                        "new_leader": e.target if e.outcome is HealOutcome.HEALED else None,
                        "detail": e.detail,
                    }
                    for e in dog.events
                ],
            }
        )
    elif not dog.events:
        say("no dead letters stalled")
    if unhealed:
        print(
            f"delayq: {counted(len(unhealed), 'queue')} with stalled dead letters not healed"
            + ("" if dog.remedy else "; run again with --move-leaders to move their leaders"),
            file=sys.stderr,
        )
        return EXIT_BROKER
    return EXIT_OK
