"""``delayq migrate plan | check``: off the delayed-message-exchange plugin
(:mod:`delayq.ops.migrate`; the guide: docs/guides/plugin-migration.md)."""

from __future__ import annotations

from pathlib import Path

import click

from delayq.cli._common import (
    EXIT_BROKER,
    EXIT_OK,
    Args,
    print_json,
    topology_and_url,
)
from delayq.cli.options import group, json_flag, leaf, once
from delayq.errors import InvalidInput

__all__ = ["migrate_group"]


def migrate_group() -> click.Group:
    return group(
        "migrate",
        "move off the delayed-message-exchange plugin: plan a topology, check a broker",
        [
            leaf(
                "plan",
                cmd_migrate_plan,
                "write a topology per x-delayed-message exchange of a definitions file, and "
                "print the cut-over steps (no broker)",
                [
                    click.Argument(
                        ["definitions"], type=click.Path(path_type=Path), required=False
                    ),
                    once(
                        "--management-url",
                        help="read the definitions from this management API "
                        "(http://user:pass@host:15672/) instead of a file",
                    ),
                    once("--vhost", default="/", help="the vhost to migrate (default /)"),
                    once(
                        "--out",
                        type=click.Path(path_type=Path),
                        default=Path("topology"),
                        metavar="DIR",
                        help="where the topology files go (default topology/)",
                    ),
                    once(
                        "--delays",
                        type=click.Path(path_type=Path),
                        metavar="FILE",
                        help="observed x-delay values (ms, one a line): the ladder fitted "
                        "to them instead of the default",
                    ),
                    once(
                        "--intake-name",
                        default="{exchange}.intake",
                        help="the intake exchange's name (default {exchange}.intake)",
                    ),
                    json_flag(),
                ],
                url=False,
                file=False,
                one_of=[("definitions", "management_url")],
            ),
            leaf(
                "check",
                cmd_migrate_check,
                "check a broker against a migration topology: applied, and its intakes bridged",
                [json_flag()],
                url=True,
                file=True,
            ),
        ],
    )


def cmd_migrate_plan(args: Args) -> int:
    import yaml

    from delayq.ops.migrate import load_definitions, plan_migration, read_delays

    if args.management_url is not None:
        from delayq.ops.management import ManagementAPI

        definitions = ManagementAPI(args.management_url).get("/definitions")
    else:
        definitions = load_definitions(args.definitions)
    delays = read_delays(args.delays) if args.delays is not None else None
    if "{exchange}" not in args.intake_name:
        raise InvalidInput("--intake-name must contain {exchange}, e.g. {exchange}.intake")
    planned = plan_migration(
        definitions, vhost=args.vhost, delays=delays, intake_name=args.intake_name
    )
    args.out.mkdir(parents=True, exist_ok=True)
    written = {}
    for plan in planned:
        path = args.out / f"{plan.topology.namespace}.yaml"
        data = plan.topology.model_dump(mode="json", exclude_defaults=True)
        data["namespace"] = plan.topology.namespace
        data["intakes"] = [
            {"exchange": i.exchange, "type": i.type} for i in plan.topology.intakes
        ]  # the type said even when it is the default
        path.write_text(
            f"# delayq migrate plan: exchange {plan.exchange!r} (x-delayed-message)\n"
            + yaml.safe_dump(data, sort_keys=False)
        )
        written[plan.exchange] = path
    if args.json:
        print_json(
            {
                "exchanges": [
                    {
                        "exchange": p.exchange,
                        "topology_file": str(written[p.exchange]),
                        "intake": p.intake,
                        "steps": list(p.steps),
                    }
                    for p in planned
                ]
            }
        )
        return EXIT_OK
    for plan in planned:
        path = written[plan.exchange]
        print(f"exchange {plan.exchange!r} -> {path} (namespace {plan.topology.namespace!r})")
        for number, step in enumerate(plan.steps, 1):
            shown = step.replace(f"topology/{plan.topology.namespace}.yaml", str(path))
            print(f"  {number}. {shown}")
    return EXIT_OK


def cmd_migrate_check(args: Args) -> int:
    from delayq.ops.verify import passed
    from delayq.sync.depths import queue_depths
    from delayq.sync.verify import verify_topology
    from delayq.urls import redact

    topology, url = topology_and_url(args)
    if not topology.intakes:
        raise InvalidInput(f"{args.file} declares no intakes: not a migration topology")
    checks = verify_topology(topology, url, management=None, probe=False)
    problems = [f"{c.subject}: {c.detail}" for c in checks if not passed([c])]
    queues = [i.queue_name(topology.namespace) for i in topology.intakes]
    depths, _source = queue_depths(queues, url)
    for intake, queue in zip(topology.intakes, queues, strict=True):
        got = depths.get(queue)
        if got is None:
            problems.append(f"intake queue {queue} is missing: delayq topology apply")
        elif got.consumers == 0:
            problems.append(
                f"no bridge consumes {queue} (intake {intake.exchange!r}): run delayq bridge "
                f"-f {args.file}; publishers' messages wait there meanwhile"
            )
    if args.json:
        print_json({"namespace": topology.namespace, "passed": not problems, "problems": problems})
    elif problems:
        print(f"{args.file} on {redact(url)}: {len(problems)} problem(s)")
        for problem in problems:
            print(f"  - {problem}")
    else:
        print(
            f"{args.file} on {redact(url)}: applied, and every intake bridged "
            f"({', '.join(i.exchange for i in topology.intakes)})"
        )
    return EXIT_BROKER if problems else EXIT_OK
