"""The ``delayq`` command line on click: the top level, the commands that run things.

Parsing and running are apart: a command's callback only returns an
:class:`~delayq.cli.options.Invocation` (the function to run and its
:class:`~delayq.cli._common.Args`); :func:`delayq.cli.main` runs it and maps errors to
exit codes. :func:`parse` gives the invocation alone, for tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from delayq import __version__
from delayq.cli._common import Args
from delayq.cli.bridge import bridge_commands
from delayq.cli.cancel import cancel_commands
from delayq.cli.heal import heal_options
from delayq.cli.migrate import migrate_group
from delayq.cli.options import (
    CONTEXT,
    Invocation,
    PathParam,
    PositiveInt,
    Prefetch,
    flag,
    global_options,
    json_flag,
    leaf,
    management,
    once,
)
from delayq.cli.scheduled import scheduled_group
from delayq.cli.scheduled_args import index_option
from delayq.cli.tree import parked_group, spark_group, topology_group

__all__ = ["build_cli", "parse"]


def _run_commands() -> list[click.Command]:
    return [
        leaf(
            "stats",
            "delayq.cli.run:cmd_stats",
            "messages and consumers of every tier, retry tier, destination and DLQ",
            [
                *management(),
                index_option(
                    required=False,
                    what="also the schedule index's waiting messages beside each tier",
                ),
                json_flag("print JSON instead of a table"),
            ],
            url=True,
            file=True,
        ),
        leaf(
            "publish",
            "delayq.cli.run:cmd_publish",
            "publish one delayed message",
            [
                once("--routing-key", "-k", required=True, help="where the message goes"),
                once("--delay", "-d", required=True, help='for example "90s", "15m", "1h30m"'),
                once("--body", help="the body as JSON text (default: null)"),
                once(
                    "--body-file",
                    type=PathParam(),
                    help="send this file's bytes as the body",
                ),
                once("--message-id", help="default: a new UUID"),
                json_flag("print the receipt as JSON"),
            ],
            url=True,
            file=True,
            exclusive=[("body", "body_file")],
        ),
        leaf(
            "retry-plan",
            "delayq.cli.run:cmd_retry_plan",
            "print a retry policy's effective schedule on the topology's ladder (no broker)",
            [
                once(
                    "--policy",
                    type=click.Choice(["exponential", "fixed", "schedule"]),
                    default="exponential",
                    help="default exponential",
                ),
                once("--initial", default="30s", help="exponential: first delay"),
                once("--multiplier", type=float, default=2.0, help="exponential: growth"),
                once("--max-delay", default="1h", help="exponential: cap"),
                once(
                    "--jitter",
                    type=float,
                    default=0.0,
                    help="exponential: shorten each delay by up to this fraction",
                ),
                once("--delay", default="1m", help="fixed: the delay"),
                once("--delays", help='schedule: delays, e.g. "10s 30s 1m 2m"'),
                flag("--rocketmq", help="schedule: RocketMQ's 16 delays from 10s to 2h"),
                json_flag(),
                once(
                    "--max-attempts",
                    type=int,
                    default=5,
                    help="deliveries in all, the first included (exponential, fixed)",
                ),
            ],
            url=False,
            file=True,
        ),
        leaf(
            "worker",
            "delayq.cli.run:cmd_worker",
            "run the handlers a module declares (delayq.Worker)",
            [
                click.Argument(["spec"], metavar="MODULE[:ATTR]"),
                once("--prefetch", type=Prefetch(), help="deliveries per consumer"),
                once(
                    "--concurrency",
                    type=PositiveInt(),
                    help="handlers running at once per queue, at most --prefetch (plain "
                    "handlers: threads, default 8; coroutines: default the prefetch)",
                ),
                once(
                    "--log-level",
                    type=click.Choice(["debug", "info", "warning", "error"]),
                    default="info",
                    help="default info",
                ),
                once(
                    "--log-format",
                    type=click.Choice(["text", "json"]),
                    default="text",
                    help="text (with message_id=... queue=... appended while handling a "
                    "delivery) or one JSON object per line",
                ),
                once(
                    "--metrics-port",
                    type=int,
                    metavar="N",
                    help="serve Prometheus metrics "
                    "on this port (0: any free port; needs delayq[metrics])",
                ),
                once(
                    "--metrics-addr",
                    default="127.0.0.1",
                    metavar="ADDR",
                    help="address the metrics endpoint listens on (default 127.0.0.1; "
                    "0.0.0.0 for all)",
                ),
                flag(
                    "--heal",
                    help="also run the dead-letter watchdog of `delayq topology heal --watch` "
                    "(reads the management API; see --heal-move-leaders)",
                ),
                *heal_options("heal-"),
                once(
                    "--records",
                    type=PathParam(),
                    metavar="DIR",
                    help="append one JSON line per settled delivery to rotating files in DIR "
                    "(delivery records, v1; read by `delayq spark report`)",
                ),
                once(
                    "--records-max-bytes",
                    type=int,
                    default=64 * 1024 * 1024,
                    metavar="N",
                    help="start a new records file past N bytes (default 64 MiB)",
                ),
            ],
            url=True,
            file=False,
        ),
        leaf(
            "demo",
            "delayq.cli.run:cmd_demo",
            "provision a demo ladder and watch messages arrive",
            [
                once(
                    "--messages",
                    type=PositiveInt(),
                    default=36,
                    help="how many messages (default 36)",
                ),
                flag(
                    "--local-node",
                    help="start a throwaway RabbitMQ node from the installed server for the demo",
                ),
                flag("--keep", help="keep the demo namespace afterwards"),
            ],
            url=True,
            file=False,
        ),
    ]


def _completion() -> click.Command:
    def callback(shell: str) -> Invocation:
        return Invocation(lambda _: _print_completion(shell), Args(shell=shell))

    return click.Command(
        "completion",
        callback=callback,
        params=[click.Argument(["shell"], type=click.Choice(["bash", "zsh", "fish"]))],
        help='print the shell completion script, e.g. eval "$(delayq completion bash)" '
        "in ~/.bashrc",
        short_help="print the shell completion script (bash, zsh or fish)",
        context_settings=CONTEXT,
    )


def _print_completion(shell: str) -> int:
    from click.shell_completion import get_completion_class

    completion = get_completion_class(shell)
    assert completion is not None  # the choice allows only shells click knows
    print(completion(build_cli(), {}, "delayq", "_DELAYQ_COMPLETE").source())
    return 0


def build_cli() -> click.Group:
    """The whole command tree, built fresh (a test may parse many lines)."""
    cli = click.Group(
        "delayq",
        params=global_options(where="; also accepted after the command"),
        help="Delayed delivery and retries on RabbitMQ.",
        context_settings=CONTEXT,
    )
    click.version_option(
        __version__, "--version", prog_name="delayq", message="%(prog)s %(version)s"
    )(cli)
    for command in (
        topology_group(),
        *_run_commands(),
        *cancel_commands(),
        scheduled_group(),
        *bridge_commands(),
        migrate_group(),
        parked_group("dlq", "a destination's dead-letter queue"),
        parked_group("unrouted", "<ns>.unrouted, where due messages nobody bound are parked"),
        spark_group(),
        _completion(),
    ):
        cli.add_command(command)
    return cli


def parse(argv: Sequence[str]) -> Invocation | int:
    """What ``delayq ARGV`` would run, or the exit code of ``--help``/``--version``.

    Raises click's ``UsageError`` for a line that is refused.
    """
    result = build_cli().main(list(argv), prog_name="delayq", standalone_mode=False)
    if isinstance(result, Invocation):
        return result
    return int(result or 0)
