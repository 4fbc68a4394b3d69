"""Partitions a scheduling job got confirmed whole, kept beside its errors output as the
job runs, so that resuming a run that was killed (``--resume``) skips them.

A killed run writes no errors output: which of its rows reached the broker is lost with
its driver, except what the driver wrote down while it ran. The tasks cannot write
anything durable themselves (a Python worker has no Hadoop file system), but each
finished task's accumulator update reaches the driver: a task whose every row was
confirmed (none rejected, none unconfirmed) adds the **digest** of its rows, and a
thread on the driver writes an empty file named after it into ``_delayq_done/`` of the
errors output (:class:`DoneMarks`), within :data:`_POLL_S` of the task's end. Spark's
readers skip names starting with ``_``: the markers never read as rejected rows.

A digest is the count of the partition's rows and the sum (modulo 2**128) of a hash of
each row: the same rows in any order give the same digest, and any other row set gives
another. A resumed run's task computes the digest of its own rows before it sends any
(it holds them: at most :data:`RESUMABLE_ROWS` with the default partitions) and skips
the partition only when that digest is among the killed run's markers. Nothing is thus
skipped on trust in the partitioning: a resumed run that partitions the input otherwise
(another ``--partitions``, another number of cores) matches fewer partitions, and
sends more again, never less.

What is sent again after a kill: every row of the partitions not confirmed whole, i.e.
those running at the kill (some of their rows may have been confirmed: duplicates,
skipped by idempotent consumers since message ids derive from the keys), those not
started, those that finished with a rejected or unconfirmed row (their errors output
was never written), and those whose marker the driver had not written yet when killed.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import SparkSession

__all__ = [
    "DONE",
    "DONE_DIR",
    "RESUMABLE_ROWS",
    "SKIPPED",
    "DoneMarks",
    "PartDigest",
    "done_in",
    "done_tuple",
    "read_done",
    "rows_of",
]

DONE, SKIPPED = "done", "skipped"
"""Result kinds: a partition confirmed whole (its digest in the ``tier`` slot, its rows
as ``n``), and the rows of a partition a resumed run skipped."""
DONE_DIR = "_delayq_done"
RESUMABLE_ROWS = 10_000
"""The most rows a partition holds, without ``partitions``, in a run that can be
resumed (one with an errors output, or a resume): what a kill can leave unknown is at
most this many rows per running task."""
_POLL_S = 0.2
"""How often the driver looks for newly finished partitions (seconds)."""
_MODULUS = 1 << 128


class PartDigest:
    """The digest of a partition's rows, whatever their order."""

    def __init__(self) -> None:
        self.rows = 0
        self._sum = 0

    def add(self, values: Any) -> None:
        # repr: the row's columns as Spark handed them (nested rows, maps, bytes alike)
        raw = hashlib.blake2b(repr(values).encode(), digest_size=16).digest()
        self._sum = (self._sum + int.from_bytes(raw, "big")) % _MODULUS
        self.rows += 1

    def reading(self, rows: Iterable[Any]) -> Iterator[Any]:
        """``rows``, each added as it is read."""
        for values in rows:
            self.add(values)
            yield values

    @property
    def value(self) -> str:
        return f"{self.rows}-{self._sum:032x}"


def done_tuple(digest: PartDigest) -> tuple[Any, ...]:
    """A task's result tuple saying its partition was confirmed whole."""
    return (DONE, None, None, None, digest.value, None, None, digest.rows, None)


def done_in(counts: Any) -> set[str]:
    """The digests of the partitions confirmed whole, in a job's tally."""
    return {key[1] for key in list(counts) if key[0] == DONE}


def rows_of(digest: str) -> int:
    """The rows of the partition a digest (``rows-sum``) is of."""
    return int(digest.split("-", 1)[0])


def read_done(spark: SparkSession, directory: str) -> frozenset[str]:
    """The digests of the partitions the run that wrote ``directory`` got confirmed whole."""
    fs, path = _fs(spark, f"{directory.rstrip('/')}/{DONE_DIR}")
    if not fs.exists(path):
        return frozenset()
    names = (str(status.getPath().getName()) for status in fs.listStatus(path))
    return frozenset(n for n in names if not n.startswith((".", "_")))  # checksums aside


class DoneMarks:
    """The driver's writer of ``_delayq_done/`` markers into one errors output; an
    earlier run's markers there are deleted first (they are not this run's)."""

    def __init__(self, spark: SparkSession, directory: str) -> None:
        self._spark = spark
        self._fs, self._dir = _fs(spark, f"{directory.rstrip('/')}/{DONE_DIR}")
        self._fs.delete(self._dir, True)
        self.written: set[str] = set()

    def write(self, digests: Iterable[str]) -> None:
        for digest in sorted(set(digests) - self.written):
            path = self._spark._jvm.org.apache.hadoop.fs.Path(self._dir, digest)  # type: ignore[union-attr]
            self._fs.create(path, True).close()
            self.written.add(digest)

    def restore(self) -> None:
        """Write every known marker again (an errors output written over them)."""
        known, self.written = self.written, set()
        self.write(known)

    @contextlib.contextmanager
    def watching(self, tallies: Accumulator[Any]) -> Iterator[None]:
        """Write the markers of partitions as they finish while the block runs, and of
        all that finished once it ends."""
        stop = threading.Event()

        def seen() -> set[str]:
            try:
                return done_in(tallies.value)
            except RuntimeError:  # changed while read (an update merged): next time
                return set()

        def watch() -> None:
            while not stop.wait(_POLL_S):
                with contextlib.suppress(Exception):  # a marker less: only resent
                    self.write(seen())

        watcher = threading.Thread(target=watch, name="delayq-done", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()
            with contextlib.suppress(Exception):
                self.write(done_in(tallies.value))


def _fs(spark: SparkSession, name: str) -> tuple[Any, Any]:
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(name)  # type: ignore[union-attr]
    return path.getFileSystem(spark._jsc.hadoopConfiguration()), path
