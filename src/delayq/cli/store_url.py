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

from delayq.errors import DelayqError, InvalidInput, StoreError
from delayq.scrub import scrub
from delayq.stores.base import IdempotencyStore
from delayq.urls import redact

__all__ = ["STORE_FORMS", "open_store"]

STORE_FORMS = (
    "sqlite:///relative.db, sqlite:////absolute/path.db, redis://host:6379/0, "
    "rediss://..., unix:///path/redis.sock, postgresql://user:pass@host/db"
)


def open_store(url: str) -> IdempotencyStore:
    """The store ``url`` names, opened (a server store is reached now).

    A malformed URL is :class:`~delayq.errors.InvalidInput`; a store that cannot be
    opened (server unreachable, no such database, refused credentials) is
    :class:`~delayq.errors.StoreError`, with the password scrubbed, never the client's
    own exception."""
    try:
        return _open(url)
    except DelayqError:
        raise
    except ValueError as exc:  # redis-py's word for a malformed URL
        raise InvalidInput(scrub(f"--store: {exc}; write one of {STORE_FORMS}")) from None
    except Exception as exc:
        where = redact(url) if isinstance(url, str) and "://" in url else "the store"
        raise StoreError(
            scrub(f"cannot open the store at {where}: {type(exc).__name__}: {exc}")
        ) from None


def _open(url: str) -> IdempotencyStore:
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

        return RedisStore(text)
    if scheme in ("postgresql", "postgres"):
        from delayq.stores.postgres import PostgresStore

        return PostgresStore(text)
    raise InvalidInput(
        f"--store {redact(text) if '://' in text else text!r} is not a store URL; "
        f"write one of {STORE_FORMS}"
    )
