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
  with unfinished partitions: which rows reached the broker is unknown, so every row of
  the input is sent again, and the summary says so (message ids derive from the keys:
  idempotent consumers skip the copies already delivered);
- no record, a dry run's, or another input's: refused, naming the difference.

The input's identity is Spark's semantic hash of the job's plan (stable across sessions
for the same source, reader options and columns; for rows made in Python, whose plan
differs each time, their count and content hash) and the size and modification time of
each input file, read through Hadoop's file system API (a local path, HDFS or an object
store alike).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from delayq.errors import InvalidInput

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

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
_FORMAT = 1
_MAX_FILES = 1000
"""Input files whose size and time the identity records (the rest: their count)."""

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


def resume_plan(record: RunRecord | None, identity: dict[str, Any], path: str) -> Resume:
    """What resuming ``path`` (whose record is ``record``) means for an input of
    ``identity``; :class:`~delayq.errors.InvalidInput` when it means nothing."""
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
    difference = _difference(record.input, identity)
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
    return Resume(
        False,
        f"resumed run {record.run} (started {record.started}), which {how}: which of its "
        "rows reached the broker is not known, so every row was sent again (ids derive "
        "from the keys: idempotent consumers skip what was delivered)",
        record,
    )


def _difference(before: dict[str, Any], now: dict[str, Any]) -> str:
    if before.get("files") != now.get("files"):
        old = {f["path"]: f for f in before.get("files") or []}
        new = {f["path"]: f for f in now.get("files") or []}
        for name in sorted(set(old) | set(new)):
            if name not in new:
                return f"{name} is no longer read"
            if name not in old:
                return f"{name} was not read then"
            if old[name] != new[name]:
                return (
                    f"{name} changed: {old[name]['size']:,} bytes modified at "
                    f"{old[name]['modified']} then, {new[name]['size']:,} at "
                    f"{new[name]['modified']} now"
                )
        return f"{before.get('file_count')} input files then, {now.get('file_count')} now"
    if before.get("plan") != now.get("plan"):
        return "another source, reader options or columns (the Spark plan differs)"
    return ""


def input_identity(df: DataFrame, selected: DataFrame) -> dict[str, Any]:
    """The identity of ``df``'s input: its files, and the semantic hash of the plan that
    ``selected`` (the job's columns of it) computes."""
    try:
        names = sorted(df.inputFiles())
    except Exception:  # a source of no files (a table of rows built in memory)
        names = []
    files = []
    spark = df.sparkSession
    for name in names[:_MAX_FILES]:
        fs, path = _fs(spark, name)
        status = fs.getFileStatus(path)
        files.append(
            {
                "path": name,
                "size": int(status.getLen()),
                "modified": int(status.getModificationTime()),
            }
        )
    return {"plan": _plan_identity(selected), "files": files, "file_count": len(names)}


def _plan_identity(selected: DataFrame) -> str:
    """The plan's semantic hash; for rows Spark holds as an RDD (``createDataFrame`` of
    Python rows), whose plan differs each time it is built, their count and content hash
    (one pass over them)."""
    from pyspark.sql import functions as F

    plan = str(selected._jdf.queryExecution().analyzed().toString())
    if "LogicalRDD" not in plan and "ExistingRDD" not in plan:
        return f"plan:{int(selected.semanticHash())}"
    row = selected.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.xxhash64(*selected.columns).cast("decimal(38,0)")).alias("hash"),
    ).collect()[0]
    return f"rows:{row['rows']}:{row['hash']}"


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
            raise ValueError(f"format {data.get('format')!r}, this delayq reads {_FORMAT}")
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
