"""``delayq scheduled export | import``: the schedule index as JSON lines
(:mod:`delayq.schedule.transfer`), and those lines published again on another broker or
namespace with their ids and due times.

Exit codes: 0 every entry exported, or every line published again; 1 the index or the
broker failed, or some lines' bodies were not kept (they are listed, not sent); 2 bad
input (a malformed line: nothing was published).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING

import click

from delayq.cli._common import EXIT_BROKER, EXIT_OK, Args, load_cli_topology, print_json
from delayq.cli.options import PathParam, json_flag, leaf, once
from delayq.cli.scheduled_args import filters, index_option, open_index, query_of
from delayq.errors import InvalidInput, StoreError
from delayq.wording import counted

if TYPE_CHECKING:
    from delayq.schedule.base import ScheduleStore
    from delayq.schedule.entry import Entry
    from delayq.topology.model import Topology

__all__ = ["check_free", "imported", "republish", "said_done", "transfer_commands"]

BATCH = 1000
"""Lines an import publishes as one pipelined batch."""


def transfer_commands() -> list[click.Command]:
    return [
        leaf(
            "export",
            cmd_export,
            "write the index's entries as JSON lines (a file, or stdout)",
            [
                *filters(),
                once(
                    "--output",
                    "-o",
                    type=PathParam(),
                    default=Path("-"),
                    help="a file, or - (stdout)",
                ),
            ],
            url=False,
            file=True,
        ),
        leaf(
            "import",
            cmd_import,
            "publish an export's messages again, keeping their ids and due times",
            [
                once(
                    "--input", "-i", type=PathParam(), required=True, help="an export's file, or -"
                ),
                index_option(required=False, what="record them in this index"),
                json_flag("print the counts as JSON"),
            ],
            url=True,
            file=True,
        ),
    ]


@contextmanager
def _opened(path: Path, mode: str) -> Iterator[IO[str]]:
    if str(path) == "-":
        yield sys.stdout if "w" in mode else sys.stdin
        return
    try:
        handle = path.open(mode, encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot open {str(path)!r}: {exc}") from exc
    with handle:
        yield handle


def cmd_export(args: Args) -> int:
    from delayq.schedule.api import Schedule
    from delayq.schedule.transfer import export_lines

    query = query_of(args, load_cli_topology(args).namespace)
    index = open_index(args.index)
    try:
        with _opened(args.output, "w") as out:
            count = export_lines(Schedule(index).iterate(query), out)
    except BrokenPipeError:
        raise  # the reader went away (`| head`): the CLI's own exit for a closed pipe
    except OSError as exc:  # a full disk
        raise StoreError(f"cannot write the export to {str(args.output)!r}: {exc}") from exc
    finally:
        index.close()
    print(f"delayq: exported {counted(count, 'entry', 'entries')}", file=sys.stderr)
    return EXIT_OK


def check_free(index: ScheduleStore, entries: list[Entry], namespace: str) -> list[str]:
    """An index holds one entry per id: one live in another namespace (the export's
    source, sharing this index) would keep its entry and the import's go unrecorded.
    Returns the ids already confirmed waiting in this namespace of the index: imported
    before (a run killed half-way, run again), not sent again."""
    from delayq.schedule.entry import FINISHED, WAITING

    done = []
    for entry in entries:
        held = index.get(entry.id)
        if held is not None and held.namespace == namespace and held.state in WAITING:
            done.append(entry.id)
        elif held is not None and held.namespace != namespace and held.state not in FINISHED:
            raise InvalidInput(
                f"message {entry.id!r} waits in namespace {held.namespace!r} of this index "
                f"({held.state.value}): an index holds one entry per id, so the import into "
                f"{namespace!r} could not be recorded; import into another --index, or "
                "purge the source first"
            )
    return done


def said_done(count: int) -> None:
    if count:
        print(
            f"delayq: skipping {counted(count, 'message')} already scheduled in the target "
            "index (imported before)",
            file=sys.stderr,
        )


def cmd_import(args: Args) -> int:
    from delayq.cli._common import topology_and_url
    from delayq.message.envelope import epoch_ms
    from delayq.schedule.transfer import Sendable, importable, read_lines

    with _opened(args.input, "r") as given:
        entries = list(read_lines(given))  # every line checked before anything is sent
    entries, skipped = importable(entries)
    if skipped:
        print(
            f"delayq: skipping {counted(len(skipped), 'line')} of messages no longer "
            f"waiting (first: {skipped[0].id}, {skipped[0].state.value})",
            file=sys.stderr,
        )
    topology, url = topology_and_url(args)
    sendable, now = Sendable(topology), epoch_ms()
    for entry in entries:
        sendable.check(entry, now)
    index = None if args.index is None else open_index(args.index, create=True)
    try:
        if index is not None:
            done = set(check_free(index, entries, topology.namespace))
            said_done(len(done))
            entries = [e for e in entries if e.id not in done]
        batches = (entries[start : start + BATCH] for start in range(0, len(entries), BATCH))
        sent, not_kept = republish(url, topology, index, batches, len(entries))
    finally:
        if index is not None:
            index.close()
    return imported(args, sent, not_kept, len(entries), len(skipped))


def republish(
    url: str,
    topology: Topology,
    index: ScheduleStore | None,
    batches: Iterable[list[Entry]],
    total: int,
) -> tuple[int, list[str]]:
    """Publish checked ``batches`` of entries again (recorded in ``index``, with their
    labels and business keys); how many were sent, and the ids whose body was not kept."""
    from delayq.schedule.record import ScheduleIndex
    from delayq.schedule.transfer import publish_again
    from delayq.sync.publisher import Publisher

    by_id: dict[str, Entry] = {}  # the batch's: the target's index keeps their labels and keys
    schedule = (
        None
        if index is None
        else ScheduleIndex(
            index,
            labels=lambda m: by_id[m.message_id].labels,
            business_key=lambda m: by_id[m.message_id].business_key,
            keep_bodies=2**31,
            requested=lambda m: by_id[m.message_id].delay_ms,
        )
    )
    sent, seen = 0, 0
    not_kept: list[str] = []
    try:
        with Publisher(url, topology, schedule=schedule) as publisher:
            for batch in batches:
                by_id.clear()
                by_id.update((e.id, e) for e in batch)
                done = publish_again(publisher, batch, publisher.factory.now_ms())
                sent += len(done.receipts)
                not_kept += done.not_kept
                seen += len(batch)
                print(f"  {seen:,} / {total:,}", file=sys.stderr)
    except Exception:
        print(f"delayq: stopped after {counted(sent, 'message')} published again", file=sys.stderr)
        raise
    return sent, not_kept


def imported(args: Args, sent: int, not_kept: list[str], total: int, skipped: int) -> int:
    """An import's last lines, and its exit code."""
    if args.json:
        print_json({"published": sent, "not_kept": not_kept, "skipped": skipped})
    else:
        print(f"published {sent:,} of {total:,} again")
    if not_kept:
        print(
            f"delayq: {counted(len(not_kept), 'message')} not sent: the exporting index did not "
            f"keep their bodies (first: {not_kept[0]}); publish them again from their source",
            file=sys.stderr,
        )
        return EXIT_BROKER
    return EXIT_OK
