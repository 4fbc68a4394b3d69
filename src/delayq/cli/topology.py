"""``delayq topology plan | apply | export | verify | grant``."""

from __future__ import annotations

import dataclasses
import shlex
import sys

from delayq.cli._common import (
    EXIT_BROKER,
    EXIT_OK,
    Args,
    load_cli_topology,
    management_choice,
    print_json,
    topology_and_url,
)
from delayq.cli._console import show_table
from delayq.durations import to_ms
from delayq.errors import InvalidInput
from delayq.ops.grant import grants_for
from delayq.ops.verify import checks_table, passed
from delayq.topology.declarations import build_declarations, describe
from delayq.topology.definitions import render_definitions
from delayq.topology.report import ApplyStatus
from delayq.urls import redact, resolve_url
from delayq.wording import counted


def cmd_plan(args: Args) -> int:
    topology = load_cli_topology(args)
    decls = build_declarations(topology)
    if args.json:
        print_json(
            {
                "namespace": topology.namespace,
                "vhost": topology.vhost,
                "queue_type": topology.queue_type.value,
                "strategy": topology.strategy.value,
                "ladder": [t.label for t in topology.ladder.tiers],
                "declarations": [{"kind": d.kind, **dataclasses.asdict(d)} for d in decls],
            }
        )
        return EXIT_OK
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


def cmd_apply(args: Args) -> int:
    from delayq.sync.provision import apply_topology

    topology, url = topology_and_url(args)
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


def cmd_export(args: Args) -> int:
    text = render_definitions(load_cli_topology(args))
    if args.output is None:
        sys.stdout.write(text)
    else:
        try:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(text, encoding="utf-8")
        except OSError as exc:  # a folder, a name too long, a read-only place
            raise InvalidInput(
                f"cannot write --output {str(args.output)!r}: {exc.strerror or exc}"
            ) from exc
        print(f"wrote {args.output}", file=sys.stderr)
    return EXIT_OK


def cmd_verify(args: Args) -> int:
    from delayq.sync.verify import verify_topology

    topology, url = topology_and_url(args)
    bound_ms = to_ms(args.probe_timeout, what="--probe-timeout")
    management = management_choice(args, url)
    if not args.json:
        print(f"verifying {args.file} (namespace {topology.namespace!r}) on {redact(url)}")
    checks = verify_topology(
        topology, url, management=management, probe=not args.no_probe, probe_bound_ms=bound_ms
    )
    if args.json:
        print_json(
            {
                "namespace": topology.namespace,
                "passed": passed(checks),
                "checks": [
                    {"subject": c.subject, "status": c.status.value, "detail": c.detail}
                    for c in checks
                ],
            }
        )
    else:
        show_table(checks_table(checks))
    return EXIT_OK if passed(checks) else EXIT_BROKER


def cmd_grant(args: Args) -> int:
    from delayq.ops.permissions import (
        apply_grant,
        current_permissions,
        describe_permissions,
        rabbitmqctl_command,
        replacement_refused,
    )

    # --vhost names the vhost to grant on; without it, the topology's as every command
    # that takes a URL reads it (the URL's when the file names none).
    topology = load_cli_topology(args) if args.vhost is not None else topology_and_url(args)[0]
    for option, user in (("--producer-user", args.producer_user),
                         ("--consumer-user", args.consumer_user),
                         ("--admin-user", args.admin_user), ("--bridge-user", args.bridge_user)):
        if user is not None and not user.strip():
            raise InvalidInput(f"{option} is empty: give the user's name")  # fmt: skip
    if not (args.producer_user or args.consumer_user or args.admin_user or args.bridge_user):
        raise InvalidInput(
            "give --producer-user, --consumer-user, --admin-user, --bridge-user, or several"
        )
    grants = grants_for(
        topology,
        producer=args.producer_user,
        consumer=args.consumer_user,
        admin=args.admin_user,
        vhost=args.vhost,
        bridge=args.bridge_user,
    )
    rabbitmqctl = shlex.split(args.rabbitmqctl)
    if args.json:
        print_json(
            [
                {
                    "role": grant.role.value,
                    "user": grant.user,
                    "vhost": grant.vhost,
                    "configure": grant.permissions.configure,
                    "write": grant.permissions.write,
                    "read": grant.permissions.read,
                    "reasons": list(grant.reasons),
                    "rabbitmqctl": rabbitmqctl_command(grant, rabbitmqctl),
                }
                for grant in grants
            ]
        )
    else:
        print(f"# least-privilege permissions for namespace {topology.namespace!r}")
        for grant in grants:
            print(f"# {grant.role.value} {grant.user!r} on vhost {grant.vhost!r}")
            for reason in grant.reasons:
                print(f"#   {reason}")
            print(rabbitmqctl_command(grant, rabbitmqctl))
    if not args.apply:
        if args.replace:
            raise InvalidInput("--replace is used only with --apply")
        return EXIT_OK
    api = None
    if args.via == "management":
        choice = management_choice(args, resolve_url(args.url))
        if choice is None:
            raise InvalidInput("--via management cannot be used with --no-management")
        api = choice.api
    # RabbitMQ keeps one set per user and vhost: a grant replaces what the user had there.
    # Every user is checked before anything is set, so a refusal leaves all as they were.
    out = sys.stderr if args.json else sys.stdout  # stdout stays one JSON document
    pending = []
    for grant in grants:
        current = current_permissions(grant, args.via, management=api, rabbitmqctl=rabbitmqctl)
        if current == grant.permissions:
            print(f"{grant.user!r} already has these permissions on {grant.vhost!r}", file=out)
            continue
        if current is not None and not args.replace:
            raise replacement_refused(grant, current)
        pending.append((grant, current))
    for grant, current in pending:
        apply_grant(grant, args.via, management=api, rabbitmqctl=rabbitmqctl)
        where = api.url if api is not None else "rabbitmqctl"
        replaced = "" if current is None else f" (replacing {describe_permissions(current)})"
        print(
            f"set the permissions of {grant.user!r} on vhost {grant.vhost!r} via {where}{replaced}",
            file=out,
        )
    return EXIT_OK
