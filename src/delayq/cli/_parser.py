"""The ``delayq`` argument parser: every command, group and option."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delayq import __version__
from delayq.cli.options import (
    GlobalOptions,
    Parser,
    global_options,
    positive_float,
    positive_int,
)
from delayq.ops.permissions import VIAS

if TYPE_CHECKING:
    pass


def _management_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--management-url",
        default=None,
        help="management HTTP API, e.g. http://user:pass@host:15672/ (default: "
        "$DELAYQ_MANAGEMENT_URL, else the AMQP URL's host and user on port 15672)",
    )
    parser.add_argument(
        "--no-management", action="store_true", help="use AMQP only, even if the API answers"
    )


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def build_parser() -> argparse.ArgumentParser:
    # --url/--file may stand at every level (see delayq.cli_options): each level gets
    # parents of its own; a command that does not use one of them does not offer it.
    common = global_options()
    file_only, url_only = global_options(url=False), global_options(file=False)
    middle = global_options()
    parser = Parser(
        prog="delayq",
        description="Delayed delivery and retries on RabbitMQ.",
        parents=[global_options(where="; also accepted after the command")],
    )
    parser.add_argument("--version", action="version", version=f"delayq {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", action=GlobalOptions
    )

    topo = commands.add_parser(
        "topology", parents=[middle], help="plan, apply or export the topology"
    )
    topo_cmds = topo.add_subparsers(dest="topology_command", required=True, metavar="ACTION")
    plan_cmd = topo_cmds.add_parser(
        "plan", parents=[file_only], help="print what would be declared (no broker)"
    )
    _json_option(plan_cmd)
    apply = topo_cmds.add_parser(
        "apply", parents=[common], help="declare the topology on the broker"
    )
    apply.add_argument(
        "--quiet", "-q", action="store_true", help="print only conflicts and the summary"
    )
    export = topo_cmds.add_parser(
        "export", parents=[file_only], help="write RabbitMQ definitions JSON (no broker)"
    )
    export.add_argument("-o", "--output", type=Path, help="output file (default: stdout)")
    verify = topo_cmds.add_parser(
        "verify",
        parents=[common],
        help="check the live broker against the topology (exit 0 only if nothing failed)",
    )
    _management_options(verify)
    _json_option(verify)
    verify.add_argument(
        "--no-probe", action="store_true", help="skip the dead-lettering probe (creates nothing)"
    )
    verify.add_argument(
        "--probe-timeout",
        default="10s",
        help="how long the probe message may take to be dead-lettered (default 10s)",
    )
    grant = topo_cmds.add_parser(
        "grant",
        parents=[common],
        help="least-privilege permissions for a producer, a consumer and an admin user",
    )
    grant.add_argument("--producer-user", metavar="USER", help="the user that publishes")
    grant.add_argument("--consumer-user", metavar="USER", help="the user that runs consumers")
    grant.add_argument("--admin-user", metavar="USER", help="the user that runs topology apply")
    grant.add_argument("--vhost", help="default: the topology's vhost")
    grant.add_argument("--apply", action="store_true", help="set the permissions (else print)")
    _json_option(grant)
    grant.add_argument("--via", choices=VIAS, default="rabbitmqctl", help="how --apply sets them")
    grant.add_argument(
        "--rabbitmqctl",
        default="rabbitmqctl",
        help='the rabbitmqctl command, e.g. "rabbitmqctl -n rabbit@host" (default rabbitmqctl)',
    )
    _management_options(grant)

    stats = commands.add_parser(
        "stats",
        parents=[common],
        help="messages and consumers of every tier, retry tier, destination and DLQ",
    )
    _management_options(stats)
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")

    pub = commands.add_parser("publish", parents=[common], help="publish one delayed message")
    pub.add_argument("--routing-key", "-k", required=True)
    pub.add_argument("--delay", "-d", required=True, help='for example "90s", "15m", "1h30m"')
    body = pub.add_mutually_exclusive_group()
    body.add_argument("--body", help="the body as JSON text (default: null)")
    body.add_argument("--body-file", type=Path, help="send this file's bytes as the body")
    pub.add_argument("--message-id")
    pub.add_argument("--json", action="store_true", help="print the receipt as JSON")

    plan = commands.add_parser(
        "retry-plan",
        parents=[file_only],
        help="print a retry policy's effective schedule on the topology's ladder (no broker)",
    )
    plan.add_argument(
        "--policy", choices=["exponential", "fixed", "schedule"], default="exponential"
    )
    plan.add_argument("--initial", default="30s", help="exponential: first delay")
    plan.add_argument("--multiplier", type=float, default=2.0, help="exponential: growth")
    plan.add_argument("--max-delay", default="1h", help="exponential: cap")
    plan.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="exponential: shorten each delay by up to this fraction",
    )
    plan.add_argument("--delay", default="1m", help="fixed: the delay")
    plan.add_argument("--delays", help='schedule: delays, e.g. "10s 30s 1m 2m"')
    plan.add_argument(
        "--rocketmq", action="store_true", help="schedule: RocketMQ's 16 delays from 10s to 2h"
    )
    _json_option(plan)
    plan.add_argument(
        "--max-attempts",
        type=int,
        default=5,
        help="deliveries in all, the first included (exponential, fixed)",
    )

    for name, what in (
        ("dlq", "a destination's dead-letter queue"),
        ("unrouted", "<ns>.unrouted, where due messages nobody bound are parked"),
    ):
        parked = commands.add_parser(
            name, parents=[middle], help=f"list, show, replay or purge {what}"
        )
        actions = parked.add_subparsers(dest="parked_command", required=True, metavar="ACTION")
        takes_queue = name == "dlq"

        def with_queue(parser: argparse.ArgumentParser, takes_queue: bool = takes_queue) -> None:
            if takes_queue:
                parser.add_argument("queue", metavar="QUEUE", help="the destination queue")

        listing = actions.add_parser("list", parents=[common], help="a table of parked messages")
        with_queue(listing)
        listing.add_argument("--limit", type=positive_int, default=100)
        listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
        show = actions.add_parser("show", parents=[common], help="one message, headers and body")
        with_queue(show)
        show.add_argument("message_id", metavar="ID")
        show.add_argument("--json", action="store_true", help="print JSON")
        show.add_argument(
            "--reveal",
            action="store_true",
            help="print sensitive headers (authorization, cookie, *token*, ...) unmasked",
        )
        show.add_argument(
            "--mask-header",
            action="append",
            default=[],
            metavar="NAME",
            help="also mask headers whose name contains NAME (repeatable; "
            "$DELAYQ_MASK_HEADERS adds a comma-separated list)",
        )
        again = actions.add_parser(
            "replay",
            parents=[common],
            help="send messages again (same id, attempt counter reset) and remove them",
        )
        with_queue(again)
        pick = again.add_mutually_exclusive_group(required=True)
        pick.add_argument(
            "--id", action="append", dest="ids", metavar="ID", help="a message id (repeatable)"
        )
        pick.add_argument("--all", action="store_true", help="every parked message")
        again.add_argument(
            "--rate",
            type=positive_float,
            default=None,
            metavar="N",
            help="at most N messages per second",
        )
        drop = actions.add_parser("purge", parents=[common], help="delete every parked message")
        with_queue(drop)
        drop.add_argument("--yes", action="store_true", help="really delete them")

    work = commands.add_parser(
        "worker", parents=[url_only], help="run the handlers a module declares (delayq.Worker)"
    )
    work.add_argument(
        "spec",
        metavar="MODULE[:ATTR]",
        help="e.g. myapp.tasks or myapp.tasks:worker (default attribute: worker)",
    )
    work.add_argument("--prefetch", type=positive_int, default=None, help="deliveries per consumer")
    work.add_argument(
        "--concurrency",
        type=positive_int,
        default=None,
        help="handlers running at once per queue, at most --prefetch (plain handlers: "
        "threads, default 8; coroutines: default the prefetch)",
    )
    work.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    work.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text (with message_id=... queue=... appended while handling a delivery) or "
        "one JSON object per line",
    )
    work.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="N",
        help="serve Prometheus metrics on this port (0: any free port; needs delayq[metrics])",
    )
    work.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the metrics endpoint listens on (default 127.0.0.1; 0.0.0.0 for all)",
    )
    work.add_argument(
        "--records",
        type=Path,
        metavar="DIR",
        help="append one JSON line per settled delivery to rotating files in DIR "
        "(delivery records, v1; read by `delayq spark report`)",
    )
    work.add_argument(
        "--records-max-bytes",
        type=int,
        default=64 * 1024 * 1024,
        metavar="N",
        help="start a new records file past N bytes (default 64 MiB)",
    )

    _spark_commands(commands, common, middle)

    demo = commands.add_parser(
        "demo", parents=[url_only], help="provision a demo ladder and watch messages arrive"
    )
    demo.add_argument(
        "--messages", type=positive_int, default=36, help="how many messages (default 36)"
    )
    demo.add_argument(
        "--local-node",
        action="store_true",
        help="start a throwaway RabbitMQ node from the installed server for the demo",
    )
    demo.add_argument("--keep", action="store_true", help="keep the demo namespace afterwards")
    return parser


def _spark_commands(
    commands: Any, common: argparse.ArgumentParser, middle: argparse.ArgumentParser
) -> None:
    spark = commands.add_parser(
        "spark",
        parents=[middle],
        help="Spark jobs: bulk scheduling and delivery reports (extra delayq[spark])",
    )
    jobs = spark.add_subparsers(dest="spark_command", required=True, metavar="JOB")
    master = Parser(add_help=False)
    master.add_argument(
        "--master",
        default=None,
        help="Spark master (default: local[*], or what spark-submit set)",
    )
    sched = jobs.add_parser(
        "schedule",
        parents=[common, master],
        help="publish one delayed message per row of a Parquet, CSV or JSON-lines input",
    )
    sched.add_argument("input", metavar="INPUT", help="a file or directory (Spark reads both)")
    sched.add_argument(
        "--format", choices=["parquet", "csv", "jsonl"], help="default: from INPUT's extension"
    )
    sched.add_argument("--key-col", default="key", help="message ids derive from it (default key)")
    sched.add_argument("--routing-key-col", default="routing_key")
    when = sched.add_mutually_exclusive_group(required=True)
    when.add_argument("--delay-col", help='delays like "90s", "15m"')
    when.add_argument("--due-col", help="absolute due times (timestamps or ISO 8601)")
    sched.add_argument("--body-col", default="body", help="default body; 'none' for no body")
    sched.add_argument("--body-json", action="store_true", help="parse str bodies as JSON")
    sched.add_argument(
        "--errors", metavar="DIR", help="write rejected rows here (default: print them)"
    )
    sched.add_argument("--errors-format", choices=["json", "csv", "parquet"], default="json")
    sched.add_argument(
        "--partitions", type=positive_int, help="repartition first (a connection each)"
    )
    sched.add_argument(
        "--window", type=positive_int, default=1000, help="unconfirmed per connection"
    )
    sched.add_argument("--json", action="store_true", help="print the summary as JSON")
    tolerance = sched.add_mutually_exclusive_group()
    tolerance.add_argument(
        "--max-rejected",
        default="0",
        metavar="N|P%",
        help="rejected rows the job accepts: a count, or a percentage of the rows "
        "(default 0: any rejected row makes the job exit 1)",
    )
    tolerance.add_argument(
        "--allow-rejected",
        action="store_true",
        help="exit 0 however many rows were rejected (read the summary)",
    )
    rep = jobs.add_parser(
        "report",
        parents=[global_options(url=False, file=False), master],
        help="lateness, overshoot, retries and a recommended ladder from delivery records",
    )
    rep.add_argument("records", metavar="RECORDS", help="a records file or directory (*.jsonl)")
    rep.add_argument("--out", required=True, type=Path, metavar="DIR")
    rep.add_argument(
        "--ladder", help='the current ladder, e.g. "30s 1m 5m" (default: tiers in the records)'
    )
    rep.add_argument(
        "--max-tiers", type=positive_int, help="tiers of the recommended ladder (default: as now)"
    )
    rep.add_argument("--bucket", help='throughput bucket, e.g. "1m" (default: about 60 buckets)')
