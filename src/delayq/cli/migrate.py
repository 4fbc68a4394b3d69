"""``delayq migrate plan | check``: off the delayed-message-exchange plugin
(:mod:`delayq.ops.migrate`; the guide: docs/guides/plugin-migration.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from delayq.cli._common import (
    EXIT_BROKER,
    EXIT_OK,
    Args,
    management_choice,
    print_json,
    topology_and_url,
)
from delayq.cli.options import PathParam, group, json_flag, leaf, management, once
from delayq.errors import InvalidInput

if TYPE_CHECKING:
    from delayq.ops.migrate import PlannedExchange

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
                    click.Argument(["definitions"], type=PathParam(), required=False),
                    once(
                        "--management-url",
                        help="read the definitions from this management API "
                        "(http://user:pass@host:15672/) instead of a file",
                    ),
                    once("--vhost", default="/", help="the vhost to migrate (default /)"),
                    once(
                        "--out",
                        type=PathParam(),
                        default=Path("topology"),
                        metavar="DIR",
                        help="where the topology files go (default topology/)",
                    ),
                    once(
                        "--delays",
                        type=PathParam(),
                        metavar="FILE",
                        help="observed x-delay values (ms, one a line): the ladder fitted "
                        "to them instead of the default",
                    ),
                    once(
                        "--intake-name",
                        default="{exchange}.intake",
                        help="the intake exchange's name, from {exchange}, the plugin "
                        "exchange's (default {exchange}.intake)",
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
                [*management(), json_flag()],
                url=True,
                file=True,
            ),
        ],
    )


def cmd_migrate_plan(args: Args) -> int:
    from delayq.ops.migrate import (
        check_intake_name,
        load_definitions,
        plan_migration,
        read_delays,
        topology_file,
    )

    check_intake_name(args.intake_name)  # before a management API is asked anything
    if args.management_url is not None:
        from delayq.ops.management import ManagementAPI

        definitions = ManagementAPI(args.management_url).get("/definitions")
    else:
        definitions = load_definitions(args.definitions)
    delays = read_delays(args.delays) if args.delays is not None else None
    planned = plan_migration(
        definitions,
        vhost=args.vhost,
        delays=delays,
        intake_name=args.intake_name,
        folder=args.out,
    )
    files = {p.exchange: (topology_file(args.out, p.topology.namespace), _yaml(p)) for p in planned}
    written = _write(args.out, files)
    for plan in planned:
        for warning in plan.warnings:
            print(f"delayq: warning: {warning}", file=sys.stderr)
    complete = all(p.complete for p in planned)
    if args.json:
        print_json(
            {
                "complete": complete,
                "exchanges": [
                    {
                        "exchange": p.exchange,
                        "topology_file": str(written[p.exchange]),
                        "intake": p.intake,
                        "ladder": [t.label for t in p.topology.ladder.tiers],
                        "ladder_note": p.ladder_note,
                        "warnings": list(p.warnings),
                        "left_out": list(p.left_out),
                        "steps": list(p.steps),
                    }
                    for p in planned
                ],
            }
        )
        return EXIT_OK if complete else EXIT_BROKER
    for plan in planned:
        path = written[plan.exchange]
        print(f"exchange {plan.exchange!r} -> {path} (namespace {plan.topology.namespace!r})")
        print(f"  ladder: {plan.ladder_note}")
        for number, step in enumerate(plan.steps, 1):
            print(f"  {number}. {step}")
    if not complete:
        print(
            "delayq: the plan is not complete: the bindings warned about are left out (exit 1)",
            file=sys.stderr,
        )
    return EXIT_OK if complete else EXIT_BROKER


def _yaml(plan: PlannedExchange) -> str:
    import yaml

    topology = plan.topology
    rest = topology.model_dump(mode="json", exclude_defaults=True)
    rest = {k: v for k, v in rest.items() if k not in ("namespace", "ladder", "intakes")}
    # the intake's type said even when it is the default
    rest["intakes"] = [{"exchange": i.exchange, "type": i.type} for i in topology.intakes]
    # the ladder said even when it is the default: the plan's note says to edit it here
    head = {"namespace": topology.namespace, "ladder": [t.label for t in topology.ladder.tiers]}
    return (
        f"# delayq migrate plan: exchange {plan.exchange!r} (x-delayed-message)\n"
        + yaml.safe_dump(head, sort_keys=False, default_flow_style=None)
        + yaml.safe_dump(rest, sort_keys=False)
    )


def _write(out: Path, files: dict[str, tuple[str, str]]) -> dict[str, Path]:
    """Each exchange's topology file (its path in ``out``, its text), all or none: each is
    written beside its place and renamed into it once every one is written, so a full
    disk or a refused folder leaves no half-written plan."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InvalidInput(f"--out {str(out)!r} is a file, not a folder") from None
    except OSError as exc:
        raise InvalidInput(f"--out {str(out)!r}: cannot make the folder: {exc.strerror}") from None
    paths = {exchange: Path(name) for exchange, (name, _) in files.items()}
    staged: list[tuple[Path, Path]] = []
    try:
        for exchange, (_, text) in files.items():
            path = paths[exchange]
            temporary = path.with_name(f".{path.name}.partial")
            staged.append((temporary, path))
            temporary.write_text(text, encoding="utf-8")
        for temporary, path in staged:
            os.replace(temporary, path)
    except OSError as exc:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        where = exc.filename or out
        raise InvalidInput(f"--out {str(out)!r}: cannot write {where}: {exc.strerror}") from None
    return paths


def cmd_migrate_check(args: Args) -> int:
    from delayq.ops.depths import Unseen
    from delayq.ops.verify import Status, passed
    from delayq.sync.depths import queue_depths
    from delayq.sync.verify import verify_topology
    from delayq.urls import redact

    topology, url = topology_and_url(args)
    if not topology.intakes:
        raise InvalidInput(f"{args.file} declares no intakes: not a migration topology")
    checks = verify_topology(topology, url, management=management_choice(args, url), probe=False)
    problems = [f"{c.subject}: {c.detail}" for c in checks if not passed([c])]
    # Without the management API the bindings are not seen: a binding added to the file
    # and never applied would pass, its messages going to <ns>.unrouted (outside tester).
    unchecked = [c.subject for c in checks if (c.subject, c.status) == ("bindings", Status.SKIPPED)]
    queues = [i.queue_name(topology.namespace) for i in topology.intakes]
    depths, _source = queue_depths(queues, url)
    for intake, queue in zip(topology.intakes, queues, strict=True):
        got = depths.get(queue)
        if got is None:
            problems.append(f"intake queue {queue} is missing: delayq topology apply")
        elif isinstance(got, Unseen):
            problems.append(
                f"cannot tell whether a bridge consumes {queue}: this user may not look at "
                f"it ({got.refusal}); check as the bridge's user or the admin"
            )
        elif got.consumers == 0:
            problems.append(
                f"no bridge consumes {queue} (intake {intake.exchange!r}): run delayq bridge "
                f"-f {args.file}; publishers' messages wait there meanwhile"
            )
    if args.json:
        print_json({"namespace": topology.namespace, "passed": not problems, "problems": problems,
                    "not_checked": unchecked})  # fmt: skip
    elif problems:
        print(f"{args.file} on {redact(url)}: {len(problems)} problem(s)")
        for problem in problems:
            print(f"  - {problem}")
    else:
        print(
            f"{args.file} on {redact(url)}: applied, and every intake bridged "
            f"({', '.join(i.exchange for i in topology.intakes)})"
            + ("; its bindings not compared: AMQP cannot list them (pass --management-url)"
               if unchecked else "")
        )  # fmt: skip
    return EXIT_BROKER if problems else EXIT_OK
