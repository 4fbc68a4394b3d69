"""The run record beside a scheduling job's errors output: which run of which input
wrote the directory, and whether that run finished, so ``resume_from`` (``--resume``)
knows what it resumes instead of trusting whatever files it finds.

A job given ``errors_path`` writes ``_delayq_run.json`` into it before it publishes
anything (state ``running``) and again once the errors output is whole (``complete``) or
what Spark left of it is salvaged (``failed``). Spark's readers skip files whose name
starts with ``_``, so the record never reads as a rejected row.

What a resume does with each state (:func:`resume_plan`):

- ``complete``: only the rows the errors output names as unconfirmed are sent; a run
  that left none is refused (nothing to resume);
- ``running`` (the run was killed: its errors output was never written) or ``failed``
  with unfinished partitions: the partitions that run got confirmed whole (marked in
  ``_delayq_done/`` as they finished: :mod:`delayq.spark._done_parts`) are skipped,
  every other row is sent again, and the summary says so (message ids derive from the
  keys: idempotent consumers skip what was delivered);
- no record, a dry run's, or another input's: refused, naming the difference.

The input's identity (files, schema, plan, or content: :mod:`delayq.spark._input_identity`)
is compared whole; a record of an older format is refused as unreadable.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from delayq.errors import InvalidInput
from delayq.spark._done_parts import rows_of
from delayq.spark._input_identity import identity_difference, input_identity

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "RECORD",
    "Resume",
    "RunRecord",
    "input_identity",
    "read_record",
    "resume_plan",
    "write_record",
]

RECORD = "_delayq_run.json"
_FORMAT = 2
"""2: identities without Spark's plan hash (issue 48), and ``_delayq_done/`` markers."""

State = Literal["running", "complete", "failed"]


@dataclass(frozen=True)
class RunRecord:
    """One run's record (``_delayq_run.json``)."""

    run: str
    state: State
    input: dict[str, Any]
    started: str
    ended: str | None = None
    dry_run: bool = False
    unconfirmed: int = 0
    unfinished: int = 0
    resumed_from: str | None = None
    errors_format: str = "json"
    format: int = _FORMAT

    @classmethod
    def start(
        cls,
        identity: dict[str, Any],
        *,
        dry_run: bool,
        resumed_from: str | None,
        errors_format: str,
    ) -> RunRecord:
        return cls(
            run=uuid.uuid4().hex[:12],
            state="running",
            input=identity,
            started=_now(),
            dry_run=dry_run,
            resumed_from=resumed_from,
            errors_format=errors_format,
        )

    def ended_as(self, state: State, *, unconfirmed: int = 0, unfinished: int = 0) -> RunRecord:
        return RunRecord(
            **{
                **asdict(self),
                "state": state,
                "ended": _now(),
                "unconfirmed": unconfirmed,
                "unfinished": unfinished,
            }
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True)
class Resume:
    """What a resumed run sends: just the unconfirmed rows, or the whole input again."""

    only_unconfirmed: bool
    said: str
    """One line for the summary: which run is resumed, and how."""
    record: RunRecord = field(repr=False)
    skip: frozenset[str] = frozenset()
    """Digests of the partitions the resumed run got confirmed whole: not sent again."""


def resume_plan(
    record: RunRecord | None,
    identity: dict[str, Any],
    path: str,
    done: frozenset[str] = frozenset(),
) -> Resume:
    """What resuming ``path`` (whose record is ``record``, its ``_delayq_done/`` markers
    ``done``) means for an input of ``identity``; :class:`~delayq.errors.InvalidInput`
    when it means nothing."""
    if record is None:
        raise InvalidInput(
            f"cannot resume from {path}: it has no {RECORD}, so it is not the errors output "
            "(--errors DIR / errors_path=) of a delayq spark schedule run; give the "
            "directory that run wrote"
        )
    if record.dry_run:
        raise InvalidInput(
            f"cannot resume from {path}: it is the output of a dry run (run {record.run}), "
            "which published nothing; run without --resume"
        )
    difference = identity_difference(record.input, identity)
    if difference:
        raise InvalidInput(
            f"cannot resume from {path}: run {record.run} (started {record.started}) read "
            f"another input ({difference}); resume with the same input, or run this one "
            "without --resume"
        )
    if record.state == "complete":
        if not record.unconfirmed:
            raise InvalidInput(
                f"nothing to resume from {path}: run {record.run} of this input finished "
                f"({record.ended}) with no row unconfirmed; its rejected rows, if any, need "
                "fixing and a new run, not a resume"
            )
        return Resume(
            True,
            f"resumed run {record.run} (finished {record.ended}): only its "
            f"{record.unconfirmed:,} unconfirmed rows were sent",
            record,
        )
    how = (
        "was interrupted before it finished (killed, or its driver lost)"
        if record.state == "running"
        else f"failed with {record.unfinished} partition(s) unfinished"
    )
    if not done:
        return Resume(
            False,
            f"resumed run {record.run} (started {record.started}), which {how}: no "
            "partition of it was confirmed whole, so every row was sent again (ids derive "
            "from the keys: idempotent consumers skip what was delivered)",
            record,
        )
    rows = sum(rows_of(digest) for digest in done)
    return Resume(
        False,
        f"resumed run {record.run} (started {record.started}), which {how}: the "
        f"{len(done):,} partition(s) it got confirmed whole ({rows:,} rows) were skipped "
        "where this run's held the same rows, and every other row was sent again (rows "
        "of partitions unfinished then may have been delivered: ids derive from the "
        "keys, idempotent consumers skip them)",
        record,
        done,
    )


def write_record(spark: SparkSession, directory: str, record: RunRecord) -> None:
    """Write ``record`` into ``directory`` (made if missing), replacing the one there."""
    fs, path = _fs(spark, directory)
    fs.mkdirs(path)
    out = fs.create(_child(spark, path, RECORD), True)
    try:
        out.write(bytearray(record.to_json().encode("utf-8")))
    finally:
        out.close()


def read_record(spark: SparkSession, directory: str) -> RunRecord | None:
    """The record in ``directory``; ``None`` when it has none. A missing directory, or a
    record delayq cannot read, is :class:`~delayq.errors.InvalidInput`."""
    fs, path = _fs(spark, directory)
    if not fs.exists(path):
        raise InvalidInput(f"cannot resume from {directory}: no such directory")
    file = _child(spark, path, RECORD)
    if not fs.exists(file):
        return None
    stream = fs.open(file)
    try:
        raw = bytes(spark._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))  # type: ignore[union-attr]
    finally:
        stream.close()
    try:
        data = json.loads(raw.decode("utf-8"))
        if data.get("format") != _FORMAT:
            raise ValueError(
                f"format {data.get('format')!r}, this delayq reads {_FORMAT} (written by "
                "another delayq version: run without --resume)"
            )
        return RunRecord(**data)
    except (ValueError, TypeError) as exc:
        raise InvalidInput(
            f"cannot resume from {directory}: its {RECORD} is unreadable: {exc}"
        ) from exc


def _fs(spark: SparkSession, name: str) -> tuple[Any, Any]:
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(name)  # type: ignore[union-attr]
    return path.getFileSystem(spark._jsc.hadoopConfiguration()), path


def _child(spark: SparkSession, parent: Any, name: str) -> Any:
    return spark._jvm.org.apache.hadoop.fs.Path(parent, name)  # type: ignore[union-attr]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
