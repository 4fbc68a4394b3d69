"""A schedule index named by a URL (``--index``, ``schedule_index=``): a SQLite file,
PostgreSQL or Redis, opened as its store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from delayq.errors import InvalidInput, StoreError

if TYPE_CHECKING:
    from delayq.schedule.base import ScheduleStore

__all__ = ["INDEX_FORMS", "open_index", "sqlite_path"]

INDEX_FORMS = (
    "a SQLite file: sqlite:///PATH or a PATH; postgresql://user:pass@host/db; or "
    "redis://host:6379/0 (rediss://, unix://)"
)


def open_index(
    url: str, *, create: bool = False, made: bool = False, what: str = "--index"
) -> ScheduleStore:
    """The store ``url`` names (``what``: the option or argument that gave it, in errors;
    ``create``: a new SQLite file where there is none, in a folder that is there, for a
    writer; a reader never makes an empty index; ``made``: a SQLite file must hold an
    index already, not be an empty file the open would make one of)."""
    from delayq.schedule.sqlite import SQLiteSchedule

    if not isinstance(url, str) or not url.strip():
        raise InvalidInput(f"{what} names {INDEX_FORMS}")
    if url.startswith(("postgresql://", "postgres://")):
        from delayq.schedule.postgres import PostgresSchedule

        return PostgresSchedule(url)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from delayq.schedule.redis import RedisSchedule

        return RedisSchedule(url)
    path = sqlite_path(url)
    if path is None or "://" in path:
        raise InvalidInput(f"{what} {url!r}: {INDEX_FORMS}")
    try:
        there = Path(path).is_file()  # a reader never makes an empty index where none was
    except (OSError, ValueError) as exc:  # a name too long, a NUL
        raise StoreError(f"cannot read the schedule index at {path!r} ({what}): {exc}") from exc
    if not there and not create:
        found = "a directory" if Path(path).is_dir() else "no such file"
        raise StoreError(f"no schedule index at {path!r} ({what}): {found}")
    if not there and not Path(path).parent.is_dir():
        raise InvalidInput(
            f"no folder {str(Path(path).parent)!r} for a new schedule index at {path!r} "
            f"({what}): make it first"
        )
    if there:
        _check_is_index(path, what, made=made)
    return SQLiteSchedule(path)


def sqlite_path(url: str) -> str | None:
    """The file a SQLite index's URL names (``sqlite:///PATH`` or a PATH); ``None`` for a
    server's (PostgreSQL, Redis). Another scheme is left in the path, for the caller to
    refuse."""
    if url.startswith(("postgresql://", "postgres://", "redis://", "rediss://", "unix://")):
        return None
    return url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url


def _check_is_index(path: str, what: str, *, made: bool = False) -> None:
    """A SQLite file given as ``--index`` is a schedule index (or empty, as a new one):
    never the consumers' store or another database, which opening would write a table
    into."""
    import sqlite3
    from urllib.parse import quote

    try:
        db = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        finally:
            db.close()
    except sqlite3.Error:
        return  # not readable this way: opening it says what is wrong
    if made and not tables:
        raise StoreError(f"no schedule index at {path!r} ({what}): an empty file")
    if tables and "delayq_schedule" not in tables:
        shown = ", ".join(sorted(tables)[:5])
        raise InvalidInput(
            f"{what} {path!r} is a SQLite database of other tables ({shown}), not a "
            "schedule index: is it the consumers' store (--store)?"
        )
