"""A store named on the command line: ``--store URL`` for ``delayq cancel`` and
``delayq reschedule``.

* ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db`` (SQLAlchemy's
  spelling): a :class:`~delayq.stores.sqlite.SQLiteStore`; the file must exist (a
  mistyped path would otherwise be a new, empty store, and every cancel ``unknown``);
* ``redis://``, ``rediss://``, ``unix://``: a :class:`~delayq.stores.redis.RedisStore`;
* ``postgresql://``, ``postgres://``: a :class:`~delayq.stores.postgres.PostgresStore`.

Anything else is refused with the accepted forms.
"""

from __future__ import annotations

from pathlib import Path

from delayq.errors import InvalidInput
from delayq.stores.base import IdempotencyStore
from delayq.urls import redact

__all__ = ["STORE_FORMS", "open_store"]

STORE_FORMS = (
    "sqlite:///relative.db, sqlite:////absolute/path.db, redis://host:6379/0, "
    "rediss://..., unix:///path/redis.sock, postgresql://user:pass@host/db"
)


def open_store(url: str) -> IdempotencyStore:
    """The store ``url`` names, opened (a server store is reached now)."""
    text = url.strip() if isinstance(url, str) else ""
    scheme = text.partition("://")[0].lower() if "://" in text else ""
    if scheme == "sqlite":
        from delayq.stores.sqlite import SQLiteStore

        path = text[len("sqlite:///") :] if text.lower().startswith("sqlite:///") else ""
        if not path:
            raise InvalidInput(f"--store {url!r} names no file; write {STORE_FORMS}")
        if not Path(path).is_file():
            raise InvalidInput(
                f"--store {url!r}: no SQLite file at {path!r} (the consumers' store must "
                "exist; a new, empty one would know no message)"
            )
        return SQLiteStore(path)
    if scheme in ("redis", "rediss", "unix"):
        from delayq.stores.redis import RedisStore

        try:
            return RedisStore(text)
        except ValueError as exc:
            raise InvalidInput(f"--store: {exc}") from None
    if scheme in ("postgresql", "postgres"):
        from delayq.stores.postgres import PostgresStore

        return PostgresStore(text)
    raise InvalidInput(
        f"--store {redact(text) if '://' in text else text!r} is not a store URL; "
        f"write one of {STORE_FORMS}"
    )
