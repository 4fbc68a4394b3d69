"""The SQLite store's grouped batches: a batch of claims, completions and releases as a
few statements of many rows each (the async consumer's batches, where a statement per
call costs more than the rest of the store), answering as the calls one by one would.
Run inside :class:`~delayq.stores.sqlite.SQLiteStore`'s write transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import TypeVar

from delayq.stores.base import Claim, ClaimStatus, Complete, Release, StoreOp

__all__ = ["RETURNING", "ROWS", "STATEMENTS", "chunks", "grouped", "padded"]

_T = TypeVar("_T")

RETURNING = sqlite3.sqlite_version_info >= (3, 35)
"""Whether this SQLite has ``RETURNING`` (the grouped batch needs it)."""
ROWS = 300
"""Rows per grouped statement: under the 999 variables of SQLite before 3.32."""
STATEMENTS = 256
"""Prepared statements a connection keeps: the 4 grouped kinds in each of their 29
sizes (see :func:`padded`), the rest, and room to spare (the default is 128)."""


def grouped(db: sqlite3.Connection, ops: Sequence[StoreOp]) -> list[ClaimStatus | None] | None:
    """``ops`` as a few statements of many rows each; ``None`` when they cannot be: two
    on one key (their order then matters), claims with different leases or rescheduled
    copies. Each operation's result is what the store's one-by-one path would give."""
    keys = {op.key for op in ops}
    claims = [op for op in ops if type(op) is Claim]
    if len(keys) != len(ops) or len({op.lease_ms for op in claims}) > 1:
        return None
    if any(op.generation for op in claims):  # rescheduled copies: one by one
        return None
    completes = [op for op in ops if type(op) is Complete]
    releases = [op.key for op in ops if type(op) is Release]
    won: set[str] = set()
    for chunk in chunks(claims):
        # Claimed unless done, or leased beyond the claim's now (lease_until - lease).
        rows = db.execute(
            "INSERT INTO delayq_idempotency (key, done_at, lease_until) VALUES "
            + ",".join(["(?, NULL, ?)"] * len(chunk))
            + " ON CONFLICT(key) DO UPDATE SET done_at = NULL, lease_until = "
            "excluded.lease_until WHERE delayq_idempotency.done_at IS NULL AND "
            "delayq_idempotency.lease_until <= excluded.lease_until - ? AND "
            "delayq_idempotency.generation = 0 RETURNING key",
            [v for op in chunk for v in (op.key, op.lease_until_ms)] + [chunk[0].lease_ms],
        ).fetchall()
        won.update(row[0] for row in rows)
    lost = [op.key for op in claims if op.key not in won]
    done: set[str] = set()
    cancelled: set[str] = set()
    for lost_keys in chunks(lost):
        rows = db.execute(
            "SELECT key, generation > 0 FROM delayq_idempotency WHERE "
            "(done_at IS NOT NULL OR generation > 0) AND key IN ("
            + ",".join(["?"] * len(lost_keys))
            + ")",
            lost_keys,
        ).fetchall()
        done.update(row[0] for row in rows if not row[1])
        cancelled.update(row[0] for row in rows if row[1])
    for finished in chunks(completes):
        db.execute(
            "INSERT INTO delayq_idempotency (key, done_at, lease_until) VALUES "
            + ",".join(["(?, ?, ?)"] * len(finished))
            + " ON CONFLICT(key) DO UPDATE SET done_at = excluded.done_at",
            [v for op in finished for v in (op.key, op.now_ms, op.now_ms)],
        )
    for released in chunks(releases):
        marks = ",".join(["?"] * len(released))
        db.execute(  # a cancelled or rescheduled key keeps its mark
            "UPDATE delayq_idempotency SET lease_until = 0 WHERE done_at IS NULL AND "
            f"marked_at IS NOT NULL AND key IN ({marks})",
            released,
        )
        db.execute(
            "DELETE FROM delayq_idempotency WHERE done_at IS NULL AND marked_at IS NULL "
            "AND key IN (" + ",".join(["?"] * len(released)) + ")",
            released,
        )
    results: list[ClaimStatus | None] = []
    for op in ops:
        if type(op) is not Claim:
            results.append(None)
        elif op.key in won:
            results.append(ClaimStatus.CLAIMED)
        elif op.key in cancelled:
            results.append(ClaimStatus.CANCELLED)
        else:
            results.append(ClaimStatus.DONE if op.key in done else ClaimStatus.BUSY)
    return results


def chunks(items: list[_T]) -> Iterator[list[_T]]:
    """``items`` by :data:`ROWS`, each chunk padded to a size of :func:`padded` with
    copies of its last item: a statement's text depends on its number of rows, and the
    module's statement cache (by text) then holds every size there is. A repeated row
    changes nothing: a claim's copy finds the row its original just leased (a lease
    of 0 leases it again, to the same values), a completion's sets the same time, and
    ``IN`` takes a key once."""
    for start in range(0, len(items), ROWS):
        chunk = items[start : start + ROWS]
        yield chunk + chunk[-1:] * (padded(len(chunk)) - len(chunk))


def padded(rows: int) -> int:
    """The statement size for ``rows`` rows: exact to 8, then in steps of an eighth of
    the next power of two (at most a quarter more rows; 29 sizes up to 300)."""
    if rows <= 8:
        return rows
    step = 1 << (rows - 1).bit_length() - 3
    return min(-(-rows // step) * step, ROWS)
