"""The errors output of a scheduling job Spark failed: the rejected and unconfirmed rows
of the partitions that finished, read back from their cached results.

When Spark fails the publishing action (a Python worker or an executor lost too often,
an input file that cannot be read half-way), the finished partitions' results are
still in Spark's cache (``MEMORY_AND_DISK``). :func:`salvage` reads them back with one
small job per group of finished partitions, and only those: the partitions that did not
finish are never asked for, so nothing runs their publishing again.

A cached block can still be gone (its executor was lost with it). Spark would then
compute the partition again, which would publish its rows again; so the salvage jobs
run with the local property ``delayq.salvaging`` set, and a publishing task that sees it
(:func:`~delayq.spark._plan_task.salvaging`) sends nothing and yields one ``lost``
line instead. Those partitions are counted in the summary (their accumulator update
came in when they finished) but their rows cannot be named: the error says how many.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from delayq.spark._failure import cause_line
from delayq.spark._plan_task import LOST, REJECTED, SALVAGING
from delayq.spark._schedule_results import column_names, error_row, errors_schema, write_errors
from delayq.spark._schedule_task import UNCONFIRMED

__all__ = ["Salvaged", "salvage"]

_CHUNK = 16
"""Partitions read back per job: the driver holds one group's rejected rows at a time."""


@dataclass
class Salvaged:
    """What :func:`salvage` could read back."""

    written: bool = False
    """The errors output was written to ``errors_path``."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """The rows themselves, when there was no ``errors_path``."""
    lost: int = 0
    """Finished partitions whose cached results were gone: counted, not named."""
    failed: str | None = None
    """Why nothing could be read back (the cause in one line), if so."""

    def said(self, errors_path: str | None) -> str:
        """The sentence of the job's error about its errors output."""
        if self.failed is not None:
            return f"The errors output could not be written ({self.failed})."
        where = (
            f"The errors output ({errors_path}) names"
            if self.written
            else "The summary's rejections name"
        )
        text = f"{where} the rejected and unconfirmed rows of the finished partitions"
        if self.lost:
            text += (
                f", but for {self.lost} whose cached results were lost with their executor "
                "(counted in the summary, not named)"
            )
        return text + "."


def _errors_only(results: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    return (r for r in results if r[0] in (REJECTED, UNCONFIRMED, LOST))


def salvage(
    spark: Any,
    results: Any,
    finished: Sequence[int],
    *,
    errors_path: str | None,
    errors_format: str,
    id_col: str | None,
) -> Salvaged:
    """Read the rejected and unconfirmed rows of the ``finished`` partitions of the
    persisted ``results`` (:mod:`delayq.spark._run`'s) and write them to ``errors_path``
    (overwritten), else keep them. Never raises: a failure is :attr:`Salvaged.failed`."""
    sc = spark.sparkContext
    schema = errors_schema(id_col)
    out = Salvaged()
    mode = "overwrite"  # written even when empty, as a finished job's: none of an earlier run
    sc.setLocalProperty(SALVAGING, "1")
    try:
        groups = [finished[i : i + _CHUNK] for i in range(0, len(finished), _CHUNK)] or [[]]
        for group in groups:
            got = sc.runJob(results, _errors_only, list(group)) if group else []
            out.lost += sum(1 for r in got if r[0] == LOST)
            rows = [error_row(r, id_col) for r in got if r[0] != LOST]
            if errors_path is None:
                out.rows.extend(column_names(schema, row) for row in rows)
            elif rows or mode == "overwrite":
                write_errors(spark, rows, schema, errors_path, errors_format, mode)
                mode = "append"
        out.written = errors_path is not None
    except Exception as exc:  # the session itself may be gone with the job
        return Salvaged(failed=cause_line(exc))
    finally:
        sc.setLocalProperty(SALVAGING, None)
    return out
