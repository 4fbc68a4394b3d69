"""What a scheduling job says when Spark itself fails it: the figures of the partitions
that finished, and the cause in one line instead of pages of Java and Python stack.

A Spark job can fail for reasons no task's delayq code sees: an unreadable input
file, a Python worker that died, an executor lost more often than
``spark.task.maxFailures`` allows. The results of the finished partitions are then
out of reach of that action, so each partition adds its counts and its index to an
accumulator as its last step: Spark merges the updates of finished tasks only, once
each. Their rejected and unconfirmed rows are then read back from Spark's cache
(:mod:`delayq.spark._salvage`). A partition that did not finish may have published
part of its rows; those are counted nowhere, and running the same input again sends
them as duplicates only (the message ids derive from the key), which idempotent
consumers skip.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from delayq.errors import SparkJobFailed

if TYPE_CHECKING:
    from pyspark import Accumulator, SparkContext

__all__ = ["Tally", "cause_line", "failed_job", "finished_partitions", "tallied", "tally"]

Tally = Counter[tuple[Any, ...]]
"""``(kind, tier, error) -> n`` summed over the finished partitions, and
``(PARTITION, index, None) -> 1`` for each finished partition."""

PARTITION = "partition"


def finished_partitions(counts: Tally) -> list[int]:
    """The indexes of the partitions whose counts are in ``counts``, in order."""
    return sorted(key[1] for key in counts if key[0] == PARTITION)


def tally(sc: SparkContext) -> Accumulator[Tally]:
    """A new accumulator the partitions of one job add their counts to."""
    from pyspark.accumulators import AccumulatorParam

    class _Param(AccumulatorParam[Tally]):
        def zero(self, value: Tally) -> Tally:
            return Counter()

        def addInPlace(self, value1: Tally, value2: Tally) -> Tally:
            value1.update(value2)
            return value1

    return sc.accumulator(Counter(), _Param())


def tallied(
    accumulator: Accumulator[Tally],
) -> Callable[[int, Iterable[tuple[Any, ...]]], Iterator[tuple[Any, ...]]]:
    """A function for ``mapPartitionsWithIndex`` passing a task's result tuples ``(kind,
    key, routing_key, delay, tier, error, reason, n, id)`` through, and adding their
    counts and the partition's index to ``accumulator`` once the partition is done."""

    def run(index: int, results: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
        counts: Tally = Counter()
        for result in results:
            counts[(result[0], result[4], result[5])] += result[7]
            yield result
        counts[(PARTITION, index, None)] = 1
        accumulator.add(counts)

    return run


_PYTHON = re.compile(
    r"^(?!py4j|org\.|java\.|scala\.)([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$", re.M
)
"""A Python error line of a task's traceback (Java's and py4j's are left out)."""
_RECENT = re.compile(r"most recent failure: (.+)$", re.M)
_LOST_TASK = re.compile(r"^Lost task [\d.]+ in stage [\d.]+ \(TID \d+\)(?: \([^)]*\))?: ")
_JAVA_CLASS = re.compile(r"^(?:[\w$]+\.)+[\w$]*(?:Exception|Error): ")
_STAGE = re.compile(r"Job aborted due to stage failure: (.+)$", re.M)
_ANY = re.compile(r"(?:Exception|Error): (.+)$", re.M)


def cause_line(exc: BaseException, limit: int = 400) -> str:
    """What failed the job, in one line: the last Python error of a task's traceback,
    else the task failure Spark names ("Python worker exited unexpectedly (crashed)"),
    else its "stage failure" line, else the first error line that is not py4j's."""
    text = str(exc)
    python = _PYTHON.findall(text)
    if python:
        name, message = python[-1]
        line = f"{name}: {message}"
    elif recent := _RECENT.search(text):
        line = _JAVA_CLASS.sub("", _LOST_TASK.sub("", recent.group(1)))
    elif stage := _STAGE.search(text):
        line = stage.group(1)
    else:
        said = [m for m in _ANY.findall(text) if not m.startswith("An error occurred while")]
        line = said[0] if said else (text.strip().splitlines() or [type(exc).__name__])[0]
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def failed_job(
    exc: BaseException, summary: Any, finished: int, partitions: int, errors_said: str = ""
) -> SparkJobFailed:
    """The error of a run Spark failed once ``finished`` of its ``partitions`` were in
    (``partitions`` 0: while reading the input, before any publishing); ``summary``
    counts what the finished ones did, ``errors_said`` where their rejections are."""
    if partitions == 0:
        return SparkJobFailed(
            f"the Spark job failed while reading the input, before publishing: "
            f"{cause_line(exc).rstrip('.')}. Nothing was published: fix the cause and run again",
            summary,
        )
    unfinished = max(partitions - finished, 1)
    published = getattr(summary, "total_published", 0)
    return SparkJobFailed(
        f"the Spark job failed: {cause_line(exc).rstrip('.')}. {finished} of {partitions} "
        f"partitions finished and published {published:,} messages (counted in the summary); the "
        f"other {unfinished} may have published part of their rows, counted nowhere. "
        f"{errors_said + ' ' if errors_said else ''}Fix the cause and run the same input "
        "again: what was already published is sent as duplicates only (the message ids "
        "derive from the key), which idempotent consumers skip",
        summary,
    )
