"""What a scheduling job read, recorded in its run record so that ``--resume`` knows the
same input again (:mod:`delayq.spark._run_record`), and knows another one as another.

The identity is made of what stays the same when the same input is read twice, in
another session or on another day, and changes when the input does:

- the input's files (``DataFrame.inputFiles()``): path, size and modification time of
  each, read through Hadoop's file system API (a local path, HDFS or an object store
  alike), and a digest of them all (a rewritten file past the first
  :data:`_MAX_FILES` is a change too);
- the input's schema (a column added or retyped);
- the job's plan as text, expression ids left out, and each file source's format and
  reader options: the columns the job reads of it, filters and projections made
  before ``schedule``, ``--option``\\ s (a CSV's delimiter, a JSON's ``multiLine``).

Spark's own ``semanticHash()`` of the plan is not used: for a Parquet source it differs
between two sessions reading the same file (issue 48), so a resume was always refused.

An input of no files (rows made in Python, ``spark.range``, a JDBC table), or whose plan
holds rows Spark keeps as an RDD, is identified by its content instead: the count of the
job's rows and two sums of hashes of their columns, one more pass over them. A resume
is then accepted only for the same rows; rows that changed are another input, refused.
A source that changes while a run reads it is not the same input twice: resume such a
source only from a snapshot of it (write it to files first).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from delayq.spark._inputs import ROW

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["identity_difference", "input_identity"]

_MAX_FILES = 1000
"""Input files listed one by one in the identity (all of them are in its digest)."""
_EXPR_ID = re.compile(r"#\d+L?")
"""Spark's expression ids (``key#12``): numbered afresh in each session."""


def input_identity(df: DataFrame, selected: DataFrame) -> dict[str, Any]:
    """The identity of ``df``'s input as the job reads it (``selected``: its columns)."""
    try:
        names = sorted(df.inputFiles())
    except Exception:  # a source of no files (a table of rows built in memory)
        names = []
    spark = df.sparkSession
    files: list[dict[str, Any]] = []
    digest = hashlib.sha256()
    for name, status in _statuses(spark, names):
        entry = {
            "path": name,
            "size": int(status.getLen()),
            "modified": int(status.getModificationTime()),
        }
        digest.update(json.dumps(entry, sort_keys=True).encode())
        if len(files) < _MAX_FILES:
            files.append(entry)
    plan = _plan_text(selected)
    identity: dict[str, Any] = {
        "files": files,
        "file_count": len(names),
        "files_digest": digest.hexdigest(),
        "schema": df.schema.simpleString(),
        "plan": "text:" + hashlib.sha256(plan.encode()).hexdigest(),
    }
    if not names or "LogicalRDD" in plan or "ExistingRDD" in plan:
        identity["content"] = _content(selected)
    return identity


def _statuses(spark: SparkSession, names: list[str]) -> Iterator[tuple[str, Any]]:
    """Each file's Hadoop ``FileStatus``, one listing per directory (on an object store
    one request per directory, not one per file)."""
    jvm = spark._jvm
    listed: dict[str, dict[str, Any]] = {}
    for name in names:
        path = jvm.org.apache.hadoop.fs.Path(name)  # type: ignore[union-attr]
        fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
        parent = str(path.getParent())
        if parent not in listed:
            listed[parent] = {
                str(status.getPath().getName()): status
                for status in fs.listStatus(path.getParent())
            }
        status = listed[parent].get(str(path.getName()))
        yield name, status if status is not None else fs.getFileStatus(path)


def identity_difference(before: dict[str, Any], now: dict[str, Any]) -> str:
    """How input ``now`` differs from ``before`` in words (``""``: the same input)."""
    if before.get("files") != now.get("files") or before.get("files_digest") != now.get(
        "files_digest"
    ):
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
        return (
            f"{before.get('file_count')} input files then, {now.get('file_count')} now, "
            "or one past the first ones changed"
        )
    if before.get("schema") != now.get("schema"):
        return f"its schema changed: {before.get('schema')} then, {now.get('schema')} now"
    if before.get("plan") != now.get("plan"):
        return "another source, reader options or columns (the Spark plan differs)"
    if before.get("content") != now.get("content"):
        return "other rows: their count or content differs"
    return ""


def _plan_text(selected: DataFrame) -> str:
    """The job's analyzed plan as text without expression ids, then each file source's
    format and reader options (not in the plan's text)."""
    plan = selected._jdf.queryExecution().analyzed()
    lines = [_EXPR_ID.sub("", str(plan.toString()))]
    leaves = plan.collectLeaves().iterator()
    while leaves.hasNext():
        leaf = leaves.next()
        if not leaf.getClass().getName().endswith(".LogicalRelation"):
            continue
        relation = leaf.relation()
        if not relation.getClass().getName().endswith(".HadoopFsRelation"):
            continue
        options = relation.options()
        pairs = sorted(
            (str(k), str(options.apply(k))) for k in _scala_list(options.keys().toList())
        )
        lines.append(f"{relation.fileFormat().toString()} {json.dumps(pairs)}")
    return "\n".join(lines)


def _scala_list(items: Any) -> list[Any]:
    out = []
    iterator = items.iterator()
    while iterator.hasNext():
        out.append(iterator.next())
    return out


def _content(selected: DataFrame) -> str:
    """The count of ``selected``'s rows and two sums of hashes of their columns (one pass)."""
    from pyspark.sql import functions as F

    columns = [c for c in selected.columns if c != ROW]  # its position: not content
    row = selected.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.xxhash64(*columns).cast("decimal(38,0)")).alias("xx"),
        F.sum(F.hash(*columns).cast("decimal(38,0)")).alias("murmur"),
    ).collect()[0]
    return f"rows:{row['rows']}:{row['xx']}:{row['murmur']}"
