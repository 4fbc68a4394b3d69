"""``delayq publish | retry-plan | stats | worker | demo``: the commands that run things."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from delayq.cli._common import (
    EXIT_BROKER,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Args,
    fail,
    load_cli_topology,
    management_choice,
    print_json,
    topology_and_url,
)
from delayq.cli._console import show_table
from delayq.consume.retry import (
    ROCKETMQ_SCHEDULE,
    ExponentialBackoff,
    FixedBackoff,
    Overflow,
    RetryPolicy,
    ScheduleBackoff,
    ScheduleRow,
    check_policy,
)
from delayq.durations import format_ms
from delayq.errors import BodyTooLarge, DelayqError, InvalidBody, InvalidInput
from delayq.message.envelope import new_message_id, parse_json_body
from delayq.message.validate import validate_message_id
from delayq.ops.depths import Unseen, stats_json, stats_queues, stats_rows, stats_table
from delayq.tables import Column, Table
from delayq.topology.model import Strategy, Topology
from delayq.urls import redact, resolve_url
from delayq.wording import counted


def cmd_stats(args: Args) -> int:
    from delayq.sync.depths import queue_depths

    topology, url = topology_and_url(args)
    rows = stats_rows(topology)
    depths, source = queue_depths(stats_queues(rows), url, management=management_choice(args, url))
    index = None if args.index is None else _index_beside(args.index, topology, depths)
    if args.json:
        found = json.loads(stats_json(rows, depths, source))
        if index is not None:
            from delayq.schedule.beside import beside_json

            found["index"] = beside_json(index)
        print_json(found)
    else:
        show_table(stats_table(rows, depths, source))
        if index is not None:
            from delayq.schedule.beside import beside_table

            print("\nthe schedule index beside the tiers:")
            show_table(beside_table(index))
    missing = sorted(name for name, depth in depths.items() if depth is None)
    hidden = sorted(name for name, depth in depths.items() if isinstance(depth, Unseen))
    if missing:
        print(
            f"delayq: {counted(len(missing), 'queue')} "
            f"{'does' if len(missing) == 1 else 'do'} not exist ({_some(missing)}): run "
            "`delayq topology apply`",
            file=sys.stderr,
        )
    if hidden:
        print(
            f"delayq: {counted(len(hidden), 'queue')} not counted: this user may not look at "
            f"{'it' if len(hidden) == 1 else 'them'} ({_some(hidden)}); run stats as a user "
            "with a permission on them (the admin) or through the management API",
            file=sys.stderr,
        )
    return EXIT_BROKER if missing or hidden else EXIT_OK


def _index_beside(url: str, topology: Topology, depths: Any) -> Any:
    """Each tier's waiting entries in the index at ``url`` beside its queues' depths."""
    from delayq.cli.scheduled_args import open_index
    from delayq.schedule.beside import beside
    from delayq.schedule.query import Query

    store = open_index(url)
    try:
        tiers = store.tiers(Query(namespace=topology.namespace))
    finally:
        store.close()
    return beside(topology, tiers, depths)


def _some(names: list[str]) -> str:
    return f"{', '.join(names[:5])}{', ...' if len(names) > 5 else ''}"


def _read_body_file(path: Path, limit: int) -> bytes:
    """``path``'s bytes, measured before they are read: a regular file over ``limit`` is
    refused by its size, and anything else (a pipe, ``/dev/stdin``) read no further than
    one byte past it."""

    def too_large(is_: str) -> BodyTooLarge:
        return BodyTooLarge(
            f"--body-file {str(path)!r} {is_} the body limit of {limit} bytes "
            f"({limit / 2**20:g} MiB: limits.max_body_bytes of the topology); put large "
            "data in a blob store and send its address"
        )

    try:
        found = os.stat(path)
        if stat.S_ISREG(found.st_mode) and found.st_size > limit:
            size = found.st_size
            raise too_large(f"is {size} bytes ({size / 2**20:.1f} MiB), more than")
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise InvalidBody(f"cannot read --body-file {str(path)!r}: {exc}") from exc
    if len(data) > limit:
        raise too_large("holds more than")
    return data


def _body(args: Args, limit: int) -> Any:
    """The body of ``publish`` or ``reschedule``: ``--body-file``'s bytes (at most
    ``limit``), or ``--body`` read as JSON."""
    if args.body_file is not None:
        return _read_body_file(args.body_file, limit)
    if args.body is None:
        return None
    try:
        return parse_json_body(args.body, "--body")
    except json.JSONDecodeError as exc:
        raise InvalidBody(
            f"--body is not valid JSON ({exc.msg}); quote text as a JSON string, "
            "for example --body '\"hello\"', or use --body-file"
        ) from exc


def cmd_publish(args: Args) -> int:
    from delayq.sync.publisher import Publisher

    topology, url = topology_and_url(args)
    body = _body(args, topology.limits.max_body_bytes)
    # Chosen before anything is sent: a run interrupted between the broker's taking the
    # message and its receipt's printing can still name it (to cancel, or to re-run).
    # `--message-id ''` is an id given, and refused as the API refuses it, not "none
    # given" (which published under a fresh random id, exit 0).
    if args.message_id is None:
        message_id = new_message_id()
    else:
        message_id = validate_message_id(args.message_id)
    receipt = None
    held: Callable[[], None] | None = None
    try:
        with Publisher(url, topology) as publisher:
            receipt = publisher.publish(body, args.routing_key, args.delay, message_id=message_id)
            held = _hold_interrupts()  # it is published: a Ctrl-C now cuts the receipt short
    except KeyboardInterrupt:
        if receipt is None:
            return fail(
                f"interrupted: message {message_id} may or may not have been published. Run "
                f"the command again with --message-id {message_id} (consumers skip an id they "
                f"have handled), or withdraw it: delayq cancel --message-id {message_id} "
                "--store URL (the consumers' idempotency store)",
                EXIT_INTERRUPTED,
                "Interrupted",
                as_json=args.json,
            )
        held = held or _hold_interrupts()  # while the publisher closed: the receipt stands
    try:
        _print_receipt(args, receipt)
    finally:
        if held is not None:
            held()
    return EXIT_OK


def _hold_interrupts() -> Callable[[], None]:
    """Ignore SIGINT until the returned function is called (in the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)

    def restore() -> None:
        signal.signal(signal.SIGINT, previous)

    return restore


def _print_receipt(args: Args, receipt: Any) -> None:
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


def _policy(args: Args) -> RetryPolicy:
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


def cmd_retry_plan(args: Args) -> int:
    from delayq.consume.retry import policy_overflow
    from delayq.topology.route import Router

    topology = load_cli_topology(args)
    policy = _policy(args)
    exact = topology.strategy is Strategy.EXACT
    # A retry longer than the ladder (or cascade) is dead-lettered as delay-too-long at
    # run time: show the plan up to it, then say so (consumers refuse such a policy).
    over = policy_overflow(policy, topology)
    fitting = None if over is None else over.retry - 1
    rows = policy.schedule(Router(topology), retries=fitting)
    if args.json:
        return _retry_plan_json(policy, topology, rows, over)
    settings = " ".join(f"{k}={v}" for k, v in policy.model_dump(mode="json").items())
    print(f"# policy: {settings}")
    if exact:
        print(
            f"# exact strategy: unit {format_ms(topology.exact_unit_ms)}, "
            f"{topology.exact_levels} levels (hops: the level queues a retry waits in)"
        )
    else:
        print(f"# ladder: {' '.join(t.label for t in topology.ladder.tiers)}")
    headers = ["attempt", "requested", "tier", *(["hops"] if exact else []), "late by"]
    table = Table([Column(h, right=True) for h in (*headers, "cumulative")])
    for row in rows:
        table.add(
            str(row.attempt),
            format_ms(row.requested_ms),
            row.tier,
            *([str(row.hops)] if exact else []),
            format_ms(row.tier_ms - row.requested_ms),
            format_ms(row.cumulative_ms),
        )
    if over is not None:
        blanks = [""] * (3 if exact else 2)
        table.add(str(over.retry + 1), format_ms(over.requested_ms), "too long", *blanks)
        table.after.append(
            f"then the dead-letter queue (delay-too-long), after {over.retry} attempts"
        )
    else:
        table.after.append(f"then the dead-letter queue, after {policy.max_attempts} attempts")
    show_table(table)
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


def _retry_plan_json(
    policy: RetryPolicy, topology: Topology, rows: list[ScheduleRow], over: Overflow | None
) -> int:
    print_json(
        {
            "policy": policy.model_dump(mode="json"),
            "strategy": topology.strategy.value,
            "retries": [
                {
                    "attempt": row.attempt,
                    "requested_ms": row.requested_ms,
                    "tier": row.tier,
                    "tier_ms": row.tier_ms,
                    "late_by_ms": row.tier_ms - row.requested_ms,
                    "cumulative_ms": row.cumulative_ms,
                    "hops": row.hops,
                }
                for row in rows
            ],
            "dead_letter": {
                "after_attempts": policy.max_attempts if over is None else over.retry,
                "reason": "exhausted" if over is None else "delay-too-long",
            },
            "too_long": None
            if over is None
            else {"attempt": over.retry + 1, "requested_ms": over.requested_ms},
        }
    )
    if over is None:
        return EXIT_OK
    try:
        check_policy(policy, topology)
    except InvalidInput as exc:
        print(f"delayq: warning: {exc}; a Consumer or Worker refuses it", file=sys.stderr)
    return EXIT_INPUT


def cmd_worker(args: Args) -> int:

    from delayq.cli._process import ends_process
    from delayq.cli.heal import build_watchdog, check_worker_heal
    from delayq.observe.deliveries import DeliveryObserver
    from delayq.observe.logs import configure_logging
    from delayq.sync._signals import ignore_late_signals
    from delayq.worker import load_worker

    configure_logging(args.log_level, args.log_format)
    if args.log_level != "debug":
        # delayq turns every client error into one message of its own; the clients' own
        # records (several lines and a traceback per failed connection) only repeat it.
        for client in ("pika", "aiormq", "aio_pika"):
            logging.getLogger(client).setLevel(logging.CRITICAL)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `celery worker`: the app is importable from here
    check_worker_heal(args)
    worker = load_worker(args.spec)
    url = resolve_url(args.url)
    observers: list[DeliveryObserver] = []
    server = None
    metrics = None
    if args.metrics_port is not None:
        from delayq.observe.metrics import PrometheusObserver, serve_metrics

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
        from delayq.observe.records import DeliveryRecorder

        recorder = DeliveryRecorder(args.records, max_bytes=args.records_max_bytes)
        observers.append(recorder)
        print(f"delivery records: {args.records}", flush=True)
    watchdog = None
    if args.heal:
        watchdog = build_watchdog(
            args, worker.topology, url, prefix="heal_", observers=[metrics] if metrics else ()
        )
        print(f"delayq worker: {watchdog!r}", flush=True)
    failed = False
    try:
        worker.run(
            url,
            prefetch=args.prefetch,
            concurrency=args.concurrency,
            observers=observers,
            watchdog=watchdog,
        )
    except BaseException:
        failed = True
        raise
    finally:
        if ends_process():  # stopped: a signal now would only end it by that signal
            ignore_late_signals()
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


def cmd_demo(args: Args) -> int:
    from delayq.demo import run_demo

    return run_demo(
        url=args.url, messages=args.messages, local_node=args.local_node, keep=args.keep
    )
