"""The ``delayq`` command line.

Exit codes: 0 success; 1 the broker refused or could not be reached, the
topology conflicts with what exists, or a check of ``topology verify`` failed;
2 bad input (nothing was sent); 141 the reader of the output went away
(``delayq dlq list | head``), like a command killed by SIGPIPE.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from delayq import __version__
from delayq.cli_options import (
    GlobalOptions,
    Parser,
    global_options,
    positive_float,
    positive_int,
)
from delayq.declarations import build_declarations, describe
from delayq.definitions import render_definitions
from delayq.depths import render_stats, stats_json, stats_queues, stats_rows
from delayq.durations import format_ms, to_ms
from delayq.envelope import epoch_ms
from delayq.errors import DelayqError, InvalidBody, InvalidInput, InvalidTopology
from delayq.grants import grants_for
from delayq.permissions import VIAS
from delayq.provisioning import ApplyStatus
from delayq.retry import (
    ROCKETMQ_SCHEDULE,
    ExponentialBackoff,
    FixedBackoff,
    RetryPolicy,
    ScheduleBackoff,
)
from delayq.topology import Strategy, Topology, load_topology
from delayq.urls import redact, resolve_url
from delayq.verification import passed, render_checks
from delayq.wording import counted

if TYPE_CHECKING:
    from delayq.sync._broker import ManagementChoice

__all__ = ["main"]

EXIT_OK, EXIT_BROKER, EXIT_INPUT, EXIT_PIPE = 0, 1, 2, 141


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
    topo_cmds.add_parser(
        "plan", parents=[file_only], help="print what would be declared (no broker)"
    )
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


def _topology(args: argparse.Namespace) -> Topology:
    topology = load_topology(args.file)
    # load_topology reads an empty file as every default (namespace 'delayq'): on the
    # command line that is a truncated or wrong file far more often than a choice.
    if topology == Topology() and not yaml.safe_load(Path(args.file).read_text("utf-8")):
        raise InvalidTopology(
            f"topology file {str(args.file)!r} is empty; write at least a namespace and "
            "destinations (see topology/delayq.yaml in the delayq repository)"
        )
    return topology


def cmd_plan(args: argparse.Namespace) -> int:
    topology = _topology(args)
    decls = build_declarations(topology)
    print(
        f"# namespace {topology.namespace!r}, vhost {topology.vhost!r}, "
        f"{topology.queue_type.value} queues, ladder "
        f"{' '.join(t.label for t in topology.ladder.tiers)}"
    )
    if topology.queue_type.value == "classic":
        print("# WARNING: classic queues dead-letter at-most-once; use quorum in production")
    for decl in decls:
        print(describe(decl))
    print(f"# {counted(len(decls), 'declaration')}")
    return EXIT_OK


def cmd_apply(args: argparse.Namespace) -> int:
    from delayq.sync.provision import apply_topology

    topology = _topology(args)
    url = resolve_url(args.url)
    if not args.quiet:
        print(f"applying {args.file} (namespace {topology.namespace!r}) to {redact(url)}")
    report = apply_topology(topology, url, raise_on_conflict=False)
    marks = {"created": "+", "present": "=", "bound": "~", "conflict": "!", "skipped": "-"}
    for result in report.results:
        if args.quiet and result.conflict is None:
            continue
        status = result.status.value
        print(f"{marks[status]} {status:<8} {describe(result.declaration)}")
        if result.conflict is not None:
            print(f"    {result.conflict}")
    print(report.summary())
    if not report.ok:
        count = report.count(ApplyStatus.CONFLICT)
        print(
            f"delayq: {count} conflicting {'entity was' if count == 1 else 'entities were'} "
            "left unchanged and nothing else was declared; resolve "
            f"{'it' if count == 1 else 'them'} and apply again",
            file=sys.stderr,
        )
        if report.marker_removed:
            print(
                f"delayq: publishers now refuse namespace {topology.namespace!r} "
                "(its apply marker was removed) until an apply succeeds",
                file=sys.stderr,
            )
        return EXIT_BROKER
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    text = render_definitions(_topology(args))
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    return EXIT_OK


def _management(args: argparse.Namespace, url: str) -> ManagementChoice | None:
    from delayq.management import ManagementAPI, management_url_for
    from delayq.sync._broker import ManagementChoice

    if args.no_management:
        return None
    chosen, explicit = management_url_for(url, args.management_url)
    return ManagementChoice(ManagementAPI(chosen), explicit)


def cmd_verify(args: argparse.Namespace) -> int:
    from delayq.sync.verify import verify_topology

    topology = _topology(args)
    url = resolve_url(args.url)
    bound_ms = to_ms(args.probe_timeout, what="--probe-timeout")
    management = _management(args, url)
    print(f"verifying {args.file} (namespace {topology.namespace!r}) on {redact(url)}")
    checks = verify_topology(
        topology, url, management=management, probe=not args.no_probe, probe_bound_ms=bound_ms
    )
    sys.stdout.write(render_checks(checks))
    return EXIT_OK if passed(checks) else EXIT_BROKER


def cmd_grant(args: argparse.Namespace) -> int:
    from delayq.permissions import apply_grant, rabbitmqctl_command

    topology = _topology(args)
    if not (args.producer_user or args.consumer_user or args.admin_user):
        raise InvalidInput("give --producer-user, --consumer-user, --admin-user, or several")
    grants = grants_for(
        topology,
        producer=args.producer_user,
        consumer=args.consumer_user,
        admin=args.admin_user,
        vhost=args.vhost,
    )
    rabbitmqctl = shlex.split(args.rabbitmqctl)
    print(f"# least-privilege permissions for namespace {topology.namespace!r}")
    for grant in grants:
        print(f"# {grant.role.value} {grant.user!r} on vhost {grant.vhost!r}")
        for reason in grant.reasons:
            print(f"#   {reason}")
        print(rabbitmqctl_command(grant, rabbitmqctl))
    if not args.apply:
        return EXIT_OK
    api = None
    if args.via == "management":
        choice = _management(args, resolve_url(args.url))
        if choice is None:
            raise InvalidInput("--via management cannot be used with --no-management")
        api = choice.api
    for grant in grants:
        apply_grant(grant, args.via, management=api, rabbitmqctl=rabbitmqctl)
        where = api.url if api is not None else "rabbitmqctl"
        print(f"set the permissions of {grant.user!r} on vhost {grant.vhost!r} via {where}")
    return EXIT_OK


def cmd_stats(args: argparse.Namespace) -> int:
    from delayq.sync.depths import queue_depths

    topology = _topology(args)
    url = resolve_url(args.url)
    rows = stats_rows(topology)
    depths, source = queue_depths(stats_queues(rows), url, management=_management(args, url))
    render = stats_json if args.json else render_stats
    sys.stdout.write(render(rows, depths, source))
    missing = sorted(name for name, depth in depths.items() if depth is None)
    if missing:
        print(
            f"delayq: {counted(len(missing), 'queue')} "
            f"{'does' if len(missing) == 1 else 'do'} not exist ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}): run `delayq topology apply`",
            file=sys.stderr,
        )
        return EXIT_BROKER
    return EXIT_OK


def _body(args: argparse.Namespace) -> Any:
    if args.body_file is not None:
        try:
            return args.body_file.read_bytes()
        except OSError as exc:
            raise InvalidBody(f"cannot read --body-file {str(args.body_file)!r}: {exc}") from exc
    if args.body is None:
        return None
    try:
        return json.loads(args.body)
    except json.JSONDecodeError as exc:
        raise InvalidBody(
            f"--body is not valid JSON ({exc.msg}); quote text as a JSON string, "
            "for example --body '\"hello\"', or use --body-file"
        ) from exc


def cmd_publish(args: argparse.Namespace) -> int:
    from delayq.sync.publisher import Publisher

    topology = _topology(args)
    body = _body(args)
    with Publisher(args.url, topology) as publisher:
        receipt = publisher.publish(body, args.routing_key, args.delay, message_id=args.message_id)
    fields = {
        "message_id": receipt.message_id,
        "routing_key": receipt.routing_key,
        "exchange": receipt.exchange,
        "tier": receipt.tier or "immediate",
        "delay": str(receipt.delay),
        "lateness": str(receipt.lateness),
        "published_at": receipt.published_at.isoformat(),
        "due_at": receipt.due_at.isoformat(),
    }
    if args.json:
        print(json.dumps(fields))
    else:
        for key, value in fields.items():
            print(f"{key:<13} {value}")
    return EXIT_OK


def _policy(args: argparse.Namespace) -> RetryPolicy:
    try:
        if args.policy == "fixed":
            return FixedBackoff(delay=args.delay, max_attempts=args.max_attempts)
        if args.policy == "schedule" or args.rocketmq or args.delays:
            delays = ROCKETMQ_SCHEDULE if args.rocketmq else (args.delays or "").split()
            return ScheduleBackoff.of(delays)
        return ExponentialBackoff(
            initial=args.initial,
            multiplier=args.multiplier,
            max_delay=args.max_delay,
            jitter=args.jitter,
            max_attempts=args.max_attempts,
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InvalidInput(f"invalid retry policy: {problems}") from exc


def cmd_retry_plan(args: argparse.Namespace) -> int:
    from delayq.retry import check_policy, policy_overflow
    from delayq.route import Router

    topology = _topology(args)
    policy = _policy(args)
    exact = topology.strategy is Strategy.EXACT
    # A retry longer than the ladder (or cascade) is dead-lettered as delay-too-long at
    # run time: show the plan up to it, then say so (consumers refuse such a policy).
    over = policy_overflow(policy, topology)
    fitting = None if over is None else over.retry - 1
    rows = policy.schedule(Router(topology), retries=fitting)
    settings = " ".join(f"{k}={v}" for k, v in policy.model_dump(mode="json").items())
    print(f"# policy: {settings}")
    if exact:
        print(
            f"# exact strategy: unit {format_ms(topology.exact_unit_ms)}, "
            f"{topology.exact_levels} levels (hops: the level queues a retry waits in)"
        )
    else:
        print(f"# ladder: {' '.join(t.label for t in topology.ladder.tiers)}")
    hops = f"  {'hops':>4}" if exact else ""
    print(
        f"{'attempt':>7}  {'requested':>10}  {'tier':>9}{hops}  {'late by':>8}  {'cumulative':>10}"
    )
    for row in rows:
        hops = f"  {row.hops:>4}" if exact else ""
        print(
            f"{row.attempt:>7}  {format_ms(row.requested_ms):>10}  {row.tier:>9}{hops}  "
            f"{format_ms(row.tier_ms - row.requested_ms):>8}  {format_ms(row.cumulative_ms):>10}"
        )
    if over is not None:
        print(f"{over.retry + 1:>7}  {format_ms(over.requested_ms):>10}  {'too long':>9}")
        print(f"# then the dead-letter queue (delay-too-long), after {over.retry} attempts")
    else:
        print(f"# then the dead-letter queue, after {policy.max_attempts} attempts")
    smallest = topology.ladder.tiers[0]
    short = sum(1 for row in rows if row.requested_ms < smallest.ttl_ms)
    if short and not exact:
        print(
            f"# note: {counted(short, 'retry asks', 'retries ask')} for less than the smallest "
            f"tier ({smallest.label}) and wait{'s' if short == 1 else ''} for that tier instead"
        )
    if over is not None:
        try:
            check_policy(policy, topology)
        except InvalidInput as exc:
            print(f"delayq: warning: {exc}; a Consumer or Worker refuses it", file=sys.stderr)
        return EXIT_INPUT
    return EXIT_OK


def _parking(args: argparse.Namespace) -> tuple[Topology, str, str]:
    """Topology, the parking queue, and what it is called in messages."""
    topology = _topology(args)
    if args.command == "dlq":
        try:
            topology.destination(args.queue)
        except KeyError:
            raise InvalidInput(
                f"{args.queue!r} is not a destination queue of {args.file}; "
                f"destinations: {', '.join(d.queue for d in topology.destinations) or 'none'}"
            ) from None
        return topology, f"{args.queue}.dlq", f"the DLQ of {args.queue}"
    return topology, topology.unrouted, topology.unrouted


def _print_parked(args: argparse.Namespace, queue: str, label: str) -> int:
    """``list`` and ``show`` (see delayq.parked_view)."""
    from delayq import parked_view as view
    from delayq.sync import parking

    limit = args.limit if args.parked_command == "list" else 10_000
    source = args.queue if args.command == "dlq" else None
    found = parking.browse(resolve_url(args.url), queue, limit=limit, dead_letters_of=source)
    # Everything in <ns>.unrouted is there because no destination bound its routing key.
    reason = None if args.command == "dlq" else "no binding"
    now = epoch_ms()
    if args.parked_command == "show":
        match = [p for p in found if p.message_id == args.message_id]
        if not match:
            print(
                f"delayq: error: no message {args.message_id!r} in {label} "
                f"({counted(len(found), 'message')} parked)",
                file=sys.stderr,
            )
            return EXIT_BROKER
        extra = [*os.environ.get("DELAYQ_MASK_HEADERS", "").split(","), *args.mask_header]
        detail = view.message_detail(
            match[0],
            now,
            reason=reason,
            patterns=view.sensitive_patterns(extra),
            reveal=args.reveal,
        )
        sys.stdout.write(json.dumps(detail) + "\n" if args.json else view.render_detail(detail))
        return EXIT_OK
    rows = [view.message_summary(p, now, reason) for p in found]
    if args.json:
        print(json.dumps({"queue": queue, "messages": rows, "limit": limit}))
    elif not rows:
        print(f"{label} is empty")
    else:
        sys.stdout.write(view.render_list(rows, limit))
    return EXIT_OK


def cmd_parked(args: argparse.Namespace) -> int:
    from delayq.sync import parking

    topology, queue, label = _parking(args)
    url = resolve_url(args.url)
    action = args.parked_command
    if action == "purge":
        if not args.yes:
            raise InvalidInput(f"purge deletes every message of {queue}: add --yes to confirm")
        print(f"purged {counted(parking.purge(url, queue), 'message')} from {queue}")
        return EXIT_OK
    if action in ("list", "show"):
        return _print_parked(args, queue, label)

    if args.command == "dlq":

        def target(parked: Any) -> tuple[str, str]:
            return "", args.queue  # the default exchange: this queue alone
    else:

        def target(parked: Any) -> tuple[str, str]:
            return topology.ready_exchange, parked.delivery.origin_routing_key

    def progress(done: int, total: int) -> None:
        print(f"\rreplayed {done}/{total}", end="", file=sys.stderr, flush=True)

    report = parking.replay(
        url,
        queue,
        topology,
        target=target,
        ids=None if args.all else args.ids,
        rate_per_s=args.rate,
        progress=progress,
    )
    if report.replayed:
        print(file=sys.stderr)
    if report.seen == 0:
        print(f"{label} is empty: nothing to replay")
    else:
        print(
            f"replayed {len(report.replayed)} of {counted(report.seen, 'parked message')} "
            f"from {queue}"
        )
    if report.returned:
        print(
            f"delayq: {len(report.returned)} came straight back to {label}, their routing "
            f"keys still matching no binding (e.g. {', '.join(report.returned[:5])}): bind "
            "them (topology destinations, then `delayq topology apply`) and replay again",
            file=sys.stderr,
        )
    if report.missing:
        print(f"delayq: not found in {label}: {', '.join(report.missing)}", file=sys.stderr)
    return EXIT_BROKER if report.missing or report.returned else EXIT_OK


def cmd_worker(args: argparse.Namespace) -> int:
    import os

    from delayq.logcontext import configure_logging
    from delayq.observe import DeliveryObserver
    from delayq.worker import load_worker

    configure_logging(args.log_level, args.log_format)
    if args.log_level != "debug":
        # delayq turns every client error into one message of its own; the clients' own
        # records (several lines and a traceback per failed connection) only repeat it.
        for client in ("pika", "aiormq", "aio_pika"):
            logging.getLogger(client).setLevel(logging.CRITICAL)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `celery worker`: the app is importable from here
    worker = load_worker(args.spec)
    url = resolve_url(args.url)
    observers: list[DeliveryObserver] = []
    server = None
    if args.metrics_port is not None:
        from delayq.metrics import PrometheusObserver, serve_metrics

        metrics = PrometheusObserver()
        try:
            server = serve_metrics(metrics.registry, args.metrics_port, args.metrics_addr)
        except OSError as exc:
            raise InvalidInput(
                f"cannot serve metrics on {args.metrics_addr}:{args.metrics_port}: {exc}"
            ) from exc
        observers.append(metrics)
    print(
        f"delayq worker: {counted(len(worker.registrations), 'handler')} "
        f"({', '.join(r.queue for r in worker.registrations)}) on {redact(url)}",
        flush=True,
    )
    if server is not None:
        print(f"delayq worker: metrics on {server.url}", flush=True)
    recorder = None
    if args.records is not None:
        from delayq.records import DeliveryRecorder

        recorder = DeliveryRecorder(args.records, max_bytes=args.records_max_bytes)
        observers.append(recorder)
        print(f"delivery records: {args.records}", flush=True)
    failed = False
    try:
        worker.run(url, prefetch=args.prefetch, concurrency=args.concurrency, observers=observers)
    except BaseException:
        failed = True
        raise
    finally:
        if server is not None:
            server.close()
        if recorder is not None:
            try:
                recorder.close()  # RecordsLost when records could not be written
            except DelayqError as lost:
                if not failed:
                    raise
                # The worker's own failure is what ends the run; the lost records
                # are said too, not hidden behind it, nor hiding it.
                print(f"delayq: error: {lost}", file=sys.stderr)
    return EXIT_OK


def _spark_session(args: argparse.Namespace) -> Any:
    from delayq.spark import local_session

    session = local_session(args.master, app_name=f"delayq spark {args.spark_command}")
    session.sparkContext.setLogLevel("ERROR")
    return session


def cmd_spark_schedule(args: argparse.Namespace) -> int:
    from delayq.bulk import RejectionLimit
    from delayq.errors import RowsRejected
    from delayq.spark import schedule

    max_rejected = None if args.allow_rejected else args.max_rejected
    RejectionLimit.parse(max_rejected)  # a bad value is refused before Spark starts
    topology = _topology(args)
    url = resolve_url(args.url)
    if "://" not in args.input and not Path(args.input).exists():  # before Spark starts
        raise InvalidInput(f"no input at {args.input}: no such file or directory")
    session = _spark_session(args)
    fmt = args.format or {".parquet": "parquet", ".csv": "csv"}.get(
        Path(args.input).suffix, "jsonl"
    )
    reader = session.read
    if fmt == "csv":
        reader = reader.option("header", "true")
    try:
        df = reader.format("json" if fmt == "jsonl" else fmt).load(args.input)
    except Exception as exc:  # Spark's AnalysisException: not a traceback for a bad file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidInput(f"cannot read {args.input} as {fmt}: {first}") from exc
    body_col = None if args.body_col == "none" else args.body_col
    print(
        f"scheduling {args.input} ({fmt}) into namespace {topology.namespace!r} on {redact(url)}",
        file=sys.stderr,
    )

    def progress(done: int, total: int) -> None:
        print(f"\rpublishing: {done}/{total} tasks done", end="", file=sys.stderr, flush=True)

    failure: RowsRejected | None = None
    try:
        summary = schedule(
            df,
            url=url,
            topology=topology,
            key_col=args.key_col,
            routing_key_col=args.routing_key_col,
            delay_col=args.delay_col,
            due_col=args.due_col,
            body_col=body_col,
            body_json=args.body_json,
            errors_path=args.errors,
            errors_format=args.errors_format,
            partitions=args.partitions,
            window=args.window,
            progress=progress,
            max_rejected=max_rejected,
        )
    except RowsRejected as exc:  # the summary is still the job's outcome: print it first
        failure, summary = exc, exc.summary
    print(file=sys.stderr)
    if args.json:
        print(json.dumps({k: v for k, v in summary.__dict__.items()}, default=str))
    else:
        sys.stdout.write(summary.render())
        for rejection in summary.rejections[:50]:
            print(f"rejected {rejection['key']!r}: {rejection['error']}: {rejection['reason']}")
        if len(summary.rejections) > 50:
            print(f"... and {len(summary.rejections) - 50} more (use --errors DIR)")
    if failure is not None:
        print(f"delayq: error: {failure}", file=sys.stderr)
        return EXIT_BROKER
    return EXIT_OK


def cmd_spark_report(args: argparse.Namespace) -> int:
    from delayq.ladder import Ladder
    from delayq.spark import report

    ladder = Ladder.parse(args.ladder.split()) if args.ladder else None
    bucket_ms = to_ms(args.bucket, what="--bucket") if args.bucket else None
    session = _spark_session(args)
    summary = report(
        args.records,
        args.out,
        spark=session,
        ladder=ladder,
        max_tiers=args.max_tiers,
        bucket_ms=bucket_ms,
    )
    print(
        f"{summary.records:,} records ({summary.skipped:,} skipped); wrote "
        f"{', '.join(str(args.out / f) for f in summary.files)}"
    )
    if summary.skipped:
        print(
            f"delayq: warning: {summary.skipped:,} lines of {args.records} were skipped "
            "(malformed, or another record version): the report leaves them out",
            file=sys.stderr,
        )
    for fit, label in ((summary.current, "current"), (summary.recommended, "recommended")):
        if fit is not None:
            print(
                f"{label:>12} ladder: {' '.join(format_ms(t) for t in fit.tiers_ms)} "
                f"(mean relative overshoot {fit.mean_relative_overshoot:.1%})"
            )
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from delayq.demo import run_demo

    return run_demo(
        url=args.url, messages=args.messages, local_node=args.local_node, keep=args.keep
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            code = _main(argv)
        finally:  # --help and --version exit through SystemExit: flush for them too
            sys.stdout.flush()  # so a closed pipe shows here, not at the interpreter's exit
    except BrokenPipeError:
        # `delayq dlq list | head`: the reader stopped reading. Point stdout at
        # /dev/null so the interpreter's final flush does not print a traceback.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            pass  # stdout is no real file (a test's capture): nothing will flush it
        return EXIT_PIPE
    return code


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    handlers: dict[tuple[str, str | None], Callable[[argparse.Namespace], int]] = {
        ("topology", "plan"): cmd_plan,
        ("topology", "apply"): cmd_apply,
        ("topology", "export"): cmd_export,
        ("topology", "verify"): cmd_verify,
        ("topology", "grant"): cmd_grant,
        ("stats", None): cmd_stats,
        ("publish", None): cmd_publish,
        ("demo", None): cmd_demo,
        ("retry-plan", None): cmd_retry_plan,
        ("worker", None): cmd_worker,
    }
    handler: Callable[[argparse.Namespace], int]
    if args.command in ("dlq", "unrouted"):
        handler = cmd_parked
    elif args.command == "spark":
        handler = {"schedule": cmd_spark_schedule, "report": cmd_spark_report}[args.spark_command]
    else:
        handler = handlers[(args.command, getattr(args, "topology_command", None))]
    try:
        return handler(args)
    except InvalidInput as exc:
        print(f"delayq: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except DelayqError as exc:
        print(f"delayq: error: {exc}", file=sys.stderr)
        return EXIT_BROKER
    except KeyboardInterrupt:
        print("delayq: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
