"""The ``delayq`` command groups: ``topology``, ``dlq``/``unrouted`` and ``spark``."""

from __future__ import annotations

from typing import Any

import click

from delayq.cli.heal import heal_options
from delayq.cli.options import (
    Command,
    PathParam,
    PositiveInt,
    Rate,
    errors_options,
    flag,
    format_option,
    group,
    json_flag,
    key_scope_option,
    leaf,
    management,
    once,
    partitions_option,
    queue_option,
    rejected_options,
    store_option,
)
from delayq.cli.spark_cluster import cluster_commands, session_options
from delayq.cli.spark_index import index_commands
from delayq.cli.spark_inputs import schedule_input_options
from delayq.cli.spark_stream import stream_command
from delayq.ops.permissions import VIAS
from delayq.stores.url import STORE_FORMS

__all__ = ["parked_group", "spark_group", "topology_group"]


def topology_group() -> click.Group:
    return group(
        "topology",
        "plan, apply, export, verify, grant or heal the topology",
        [
            leaf(
                "plan",
                "delayq.cli.topology:cmd_plan",
                "print what would be declared (no broker)",
                [json_flag()],
                url=False,
                file=True,
            ),
            leaf(
                "apply",
                "delayq.cli.topology:cmd_apply",
                "declare the topology on the broker",
                [flag("--quiet", "-q", help="print only conflicts and the summary")],
                url=True,
                file=True,
            ),
            leaf(
                "export",
                "delayq.cli.topology:cmd_export",
                "write RabbitMQ definitions JSON (no broker)",
                [
                    once(
                        "--output",
                        "-o",
                        type=PathParam(),
                        help="output file (default: stdout)",
                    )
                ],
                url=False,
                file=True,
            ),
            leaf(
                "verify",
                "delayq.cli.topology:cmd_verify",
                "check the live broker against the topology (exit 0 only if nothing failed)",
                [
                    *management(),
                    json_flag(),
                    flag("--no-probe", help="skip the dead-lettering probe (creates nothing)"),
                    once(
                        "--probe-timeout",
                        default="10s",
                        help="how long the probe message "
                        "may take to be dead-lettered (default 10s)",
                    ),
                ],
                url=True,
                file=True,
            ),
            leaf(
                "grant",
                "delayq.cli.topology:cmd_grant",
                "least-privilege permissions for producer, consumer, admin and bridge users",
                [
                    once("--producer-user", metavar="USER", help="the user that publishes"),
                    once("--consumer-user", metavar="USER", help="the user that runs consumers"),
                    once("--admin-user", metavar="USER", help="the user that runs topology apply"),
                    once(
                        "--bridge-user",
                        metavar="USER",
                        help="the user that runs delayq bridge (with intakes; without it, "
                        "the producer may)",
                    ),
                    once(
                        "--vhost", help="default: the topology's vhost (the URL's if it names none)"
                    ),
                    flag("--apply", help="set the permissions (else print)"),
                    flag(
                        "--replace",
                        help="with --apply: replace what a user already has on the vhost "
                        "(refused without it)",
                    ),
                    json_flag(),
                    once(
                        "--via",
                        type=click.Choice(VIAS),
                        default="rabbitmqctl",
                        help="how --apply sets them",
                    ),
                    once(
                        "--rabbitmqctl",
                        default="rabbitmqctl",
                        help="the rabbitmqctl command, "
                        'e.g. "rabbitmqctl -n rabbit@host" (default rabbitmqctl)',
                    ),
                    *management(),
                ],
                url=True,
                file=True,
            ),
            leaf(
                "heal",
                "delayq.cli.heal:cmd_heal",
                "find tier queues whose dead letters stopped moving (a node loss on RabbitMQ "
                "3.10) and, with --move-leaders, give them a new leader; exit 0 only if none "
                "is left stalled",
                [
                    *heal_options(),
                    flag("--watch", help="keep watching (until SIGTERM) instead of one pass"),
                    json_flag(),
                ],
                url=True,
                file=True,
                exclusive=[("watch", "json")],
            ),
        ],
    )


def replay_store_options() -> list[click.Parameter]:
    """``dlq replay``'s cancel options (see docs/concepts/cancel.md)."""
    return [
        store_option(
            required=False,
            help="the queue's consumers' idempotency store: each message's cancel is looked "
            f"up first and the copies that will be skipped are named; {STORE_FORMS}",
        ),
        flag(
            "--uncancel",
            help="clear each replayed message's cancel first (needs --store), so its copy is "
            "handled: the operator's override of a cancel",
        ),
        key_scope_option(),
    ]


def parked_group(name: str, what: str) -> click.Group:
    takes_queue = name == "dlq"

    def queue() -> list[click.Parameter]:
        return [click.Argument(["queue"], metavar="QUEUE")] if takes_queue else []

    def action_leaf(action: str, help: str, params: list[click.Parameter], **kw: Any) -> Command:
        return leaf(
            action,
            "delayq.cli.parked:cmd_parked",
            help,
            [*queue(), *params],
            url=True,
            file=True,
            names={"command": name, "parked_command": action},
            **kw,
        )

    return group(
        name,
        f"list, show, replay or purge {what}",
        [
            action_leaf(
                "list",
                "a table of parked messages",
                [
                    once(
                        "--limit",
                        type=PositiveInt(),
                        default=100,
                        help="rows at most (default 100)",
                    ),
                    json_flag("print JSON instead of a table"),
                ],
            ),
            action_leaf(
                "show",
                "one message, headers and body",
                [
                    click.Argument(["message_id"], metavar="ID"),
                    json_flag("print JSON"),
                    flag(
                        "--reveal",
                        help="print sensitive headers (authorization, cookie, "
                        "*token*, ...) unmasked",
                    ),
                    click.Option(
                        ["--mask-header"],
                        multiple=True,
                        metavar="NAME",
                        help="also mask headers whose name contains NAME (repeatable; "
                        "$DELAYQ_MASK_HEADERS adds a comma-separated list)",
                    ),
                ],
            ),
            action_leaf(
                "replay",
                "send messages again (same id, attempt counter reset) and remove them",
                [
                    click.Option(
                        ["--id", "ids"],
                        multiple=True,
                        metavar="ID",
                        help="a message id (repeatable)",
                    ),
                    flag("--all", help="every parked message"),
                    once(
                        "--rate",
                        type=Rate(),
                        metavar="N",
                        help="at most N messages per second",
                    ),
                    *(replay_store_options() if takes_queue else []),
                    once(
                        "--schedule-index",
                        metavar="URL",
                        help="write each replayed message into this schedule index (an "
                        "existing SQLite file, postgresql://, redis://): due now, shown until "
                        "a consumer takes it (an intake's replays are recorded by its bridge)",
                    ),
                ],
                one_of=[("ids", "all")],
            ),
            action_leaf(
                "purge", "delete every parked message", [flag("--yes", help="really delete them")]
            ),
        ],
    )


def spark_group() -> click.Group:
    names = {"spark_command": "schedule"}
    schedule = leaf(
        "schedule",
        "delayq.cli.spark:cmd_spark_schedule",
        "publish one delayed message per row of a Parquet, CSV or JSON-lines input "
        "(or of a --table)",
        [
            click.Argument(["input"], metavar="[INPUT]", required=False),
            *session_options(),
            format_option(),
            once("--key-col", default="key", help="message ids derive from it (default key)"),
            once("--routing-key-col", default="routing_key", help="default routing_key"),
            once("--delay-col", help='delays like "90s", "15m"'),
            once("--due-col", help="absolute due times (timestamps or ISO 8601)"),
            once("--body-col", default="body", help="default body; 'none' for no body"),
            flag("--body-json", help="parse str bodies as JSON"),
            *errors_options(),
            partitions_option(
                "a connection each (default: the input's, at least its session's "
                "defaultParallelism)"
            ),
            once("--window", type=PositiveInt(), default=1000, help="unconfirmed per connection"),
            json_flag("print the summary as JSON"),
            *rejected_options(),
            *schedule_input_options(),
        ],
        url=True,
        file=True,
        names=names,
        one_of=[("delay_col", "due_col")],
        exclusive=[("max_rejected", "allow_rejected")],
    )
    cancel = leaf(
        "cancel",
        "delayq.cli.spark:cmd_spark_cancel",
        "cancel the scheduled message of every row (message ids or business keys) of a "
        "Parquet, CSV or JSON-lines input",
        [
            click.Argument(["input"], metavar="INPUT"),
            *session_options(),
            format_option(),
            store_option(where=" (SQLite: executors on this machine only)"),
            once("--id-col", "--id-column", "id_col", help="a column of message ids"),
            once(
                "--key-col",
                "--key-column",
                "key_col",
                help="a column of business keys (consumers with key=, and the key column "
                "of delayq spark schedule)",
            ),
            once(
                "--routing-key-col",
                "--routing-key-column",
                "routing_key_col",
                help="mark only the queues each row's routing key reaches (default: every "
                "destination of the topology)",
            ),
            queue_option(),
            key_scope_option(),
            *errors_options(),
            partitions_option("repartition first (a store each)"),
            json_flag("print the summary as JSON"),
            *rejected_options(),
        ],
        url=False,
        file=True,
        names={"spark_command": "cancel"},
        one_of=[("id_col", "key_col")],
        exclusive=[("id_col", "key_col"), ("max_rejected", "allow_rejected")],
    )
    report = leaf(
        "report",
        "delayq.cli.spark:cmd_spark_report",
        "lateness, overshoot, retries and a recommended ladder from delivery records",
        [
            click.Argument(["records"], metavar="RECORDS"),
            *session_options(),
            once(
                "--out",
                required=True,
                type=PathParam(),
                metavar="DIR",
                help="where the report goes",
            ),
            once(
                "--ladder",
                help='the current ladder, e.g. "30s 1m 5m" (default: the topology file\'s, '
                "if there is one; else the tiers seen in the records)",
            ),
            once(
                "--max-tiers",
                type=PositiveInt(),
                help="tiers of the recommended ladder (default: as now)",
            ),
            once(
                "--grid",
                help="round values the recommended tiers are taken from "
                '(default "15s 30s 1m 2m 5m 10m 15m 30m 1h 2h 3h 6h 12h 24h")',
            ),
            once(
                "--objective",
                type=click.Choice(["mean", "p99"]),
                default="mean",
                help="what the recommendation minimises: mean relative overshoot, or the p99 "
                "of tier / delay (default mean)",
            ),
            once("--bucket", help='throughput bucket, e.g. "1m" (default: about 60 buckets)'),
        ],
        url=False,
        file=True,
        names={"spark_command": "report"},
    )
    return group(
        "spark",
        "Spark jobs: bulk scheduling, bulk cancel and delivery reports (extra delayq[spark])",
        [
            schedule,
            cancel,
            report,
            stream_command(schedule, session_options()),
            *index_commands(),
            *cluster_commands(),
        ],
    )
