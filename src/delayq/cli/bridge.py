"""``delayq bridge``: run the bridge of each intake of a topology (see
:mod:`delayq.sync.bridge`) until SIGTERM or SIGINT. A stop waits ``--stop-grace`` for
what is in flight; one that had to leave deliveries unconfirmed exits 1, saying so.
SIGHUP stops the bridges the same way and starts them again with the topology file read
anew (a binding added and applied: a running bridge would park its key as unbound)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from datetime import timedelta
from typing import TYPE_CHECKING

import click

from delayq.cli._common import EXIT_OK, Args, topology_and_url
from delayq.cli._process import ends_process
from delayq.cli.options import Prefetch, leaf, once
from delayq.errors import ConnectionFailed, DelayqError

if TYPE_CHECKING:
    from delayq.schedule.record import ScheduleIndex
    from delayq.topology.model import Topology
    from delayq.worker import Worker

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
                    "--schedule-index",
                    metavar="URL",
                    help="record each message scheduled in this schedule index (a SQLite "
                    "file, postgresql://, redis://), as delayq scheduled reads it",
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

    grace_s = check_stop_grace(args.stop_grace, "--stop-grace")  # before connecting
    configure_logging(args.log_level, "text")
    if args.log_level != "debug":
        # delayq says what failed in one line of its own; pika's records (a traceback per
        # failed connection) only repeat it, as `delayq worker` does.
        logging.getLogger("pika").setLevel(logging.CRITICAL)
    topology, url = topology_and_url(args)
    checked = _index(args)  # refused before connecting; each run opens its own
    if checked is not None:
        checked.store.close()
    return _bridge(args, topology, url, grace_s)


def _index(args: Args) -> ScheduleIndex | None:
    """``--schedule-index`` opened (a new SQLite file made): before connecting, and for
    each run (a SIGHUP opens it again: a file replaced meanwhile is the one written)."""
    if args.schedule_index is None:
        return None
    from delayq.schedule.record import ScheduleIndex
    from delayq.schedule.url import open_index

    return ScheduleIndex(open_index(args.schedule_index, create=True, what="--schedule-index"))


def _bridge(args: Args, topology: Topology, url: str, grace_s: float) -> int:
    """The command's run, reloads included (see :func:`cmd_bridge`)."""
    from delayq.sync._signals import stopping_on_signals

    # The signals are this command's for its whole run, reloads included: SIGHUP stops the
    # bridges to start them again; SIGTERM/SIGINT stop them for good (a reload asked for
    # or under way is dropped), a second one at once, whenever each comes.
    reload, quit_ = threading.Event(), threading.Event()
    running: list[tuple[threading.Event, Worker | None]] = [(threading.Event(), None)]

    def hangup() -> None:
        if not quit_.is_set():
            reload.set()
            running[0][0].set()

    def terminate() -> None:
        again = quit_.is_set()
        quit_.set()
        reload.clear()
        stop, worker = running[0]
        stop.set()
        if worker is not None:
            worker.request_stop(now=again)

    ran: Topology | None = None  # the topology the bridges last ran with, before a reload
    pause_s = RELOAD_RETRY_MIN_S
    hangups = (signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()
    last = ends_process()  # the program's own run: a late signal is ignored
    with (
        stopping_on_signals(hangup, signals=hangups, last=last),
        stopping_on_signals(terminate, last=last),
    ):
        while not quit_.is_set():
            reload.clear()
            stop = threading.Event()
            running[0] = (stop, None)  # a signal from here on stops this run
            if quit_.is_set():
                break
            try:
                _run(args, topology, url, grace_s, stop, running)
            except DelayqError as exc:
                if quit_.is_set():
                    raise
                if reload.is_set():  # the stop a SIGHUP asked for ended badly (a broker
                    # that did not confirm in time: those deliveries are back in the intake
                    # queue); the reload goes on all the same
                    print(f"delayq bridge: SIGHUP: the bridges stopped with an error ({exc}); "
                          "starting them again", file=sys.stderr, flush=True)  # fmt: skip
                elif ran is None:
                    raise  # no reload to undo: as before SIGHUP existed
                elif isinstance(exc, ConnectionFailed):  # the broker away: wait for it
                    print(f"delayq bridge: after SIGHUP: {exc}; trying again in {pause_s:g} s",
                          file=sys.stderr, flush=True)  # fmt: skip
                    if quit_.wait(pause_s):
                        raise
                    pause_s = min(pause_s * 2, RELOAD_RETRY_MAX_S)
                    continue
                elif topology is ran:
                    raise
                else:
                    print(f"delayq bridge: after SIGHUP: {args.file} cannot be bridged "
                          f"({exc}); the bridges go on as they were", file=sys.stderr,
                          flush=True)  # fmt: skip
                    topology = ran
                    continue
            pause_s = RELOAD_RETRY_MIN_S
            if not reload.is_set() or quit_.is_set():
                return EXIT_OK
            ran, topology = topology, _reread(args, topology)
    return EXIT_OK  # stopped between two runs: nothing was in flight


RELOAD_RETRY_MIN_S, RELOAD_RETRY_MAX_S = 1.0, 30.0
"""How long a reload that found no broker waits before trying again (doubling)."""


def _run(
    args: Args,
    topology: Topology,
    url: str,
    grace_s: float,
    stop: threading.Event,
    running: list[tuple[threading.Event, Worker | None]],
) -> None:
    """The bridges of ``topology``'s intakes (or ``--intake``'s) until ``stop``; the worker
    that runs them is ``running[0]`` meanwhile, for the signal handlers."""
    from delayq.sync.bridge import pick_intake
    from delayq.urls import redact
    from delayq.worker import Worker

    names = list(dict.fromkeys(args.intakes)) or [i.exchange for i in topology.intakes]
    index = _index(args)
    worker = Worker(topology)  # a worker of bridges alone: threads, failures
    for name in names or [pick_intake(topology, None).exchange]:
        worker.bridge(
            name, prefetch=args.prefetch, stop_grace=timedelta(seconds=grace_s), schedule=index
        )
    running[0] = (stop, worker)
    ns = topology.namespace
    print(
        "delayq bridge: "
        + ", ".join(
            f"{name} -> {pick_intake(topology, name).queue_name(ns)}" for name, _ in worker.bridges
        )
        + f" on {redact(url)} (SIGHUP: read {args.file} again)",
        flush=True,
    )
    try:
        worker.run(url, stop=stop, install_signal_handlers=False)  # each bridge logs its stop
    finally:
        running[0] = (stop, None)
        if index is not None:
            index.store.close()


def _reread(args: Args, current: Topology) -> Topology:
    """The topology file read again; the one running when it is refused (said why)."""
    try:
        topology, _url = topology_and_url(args)
    except DelayqError as exc:
        print(f"delayq bridge: SIGHUP: {args.file} refused, the bridges go on as they were: "
              f"{exc}", file=sys.stderr, flush=True)  # fmt: skip
        return current
    if topology.namespace != current.namespace:
        print(f"delayq bridge: SIGHUP: {args.file} now names namespace {topology.namespace!r}, "
              f"not {current.namespace!r}: the bridges go on as they were", file=sys.stderr,
              flush=True)  # fmt: skip
        return current
    print(f"delayq bridge: SIGHUP: {args.file} read again", flush=True)
    return topology
