"""A store named by a URL: ``delayq cancel --store URL`` and the Spark cancel job, whose
executors each open the store from its URL (a store object cannot be sent to them).

* ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db`` (SQLAlchemy's
  spelling): a :class:`~delayq.stores.sqlite.SQLiteStore`; the file must exist (a
  mistyped path would otherwise be a new, empty store, and every cancel ``unknown``);
* ``redis://``, ``rediss://``, ``unix://``: a :class:`~delayq.stores.redis.RedisStore`;
* ``postgresql://``, ``postgres://``: a :class:`~delayq.stores.postgres.PostgresStore`.

Anything else is refused with the accepted forms. A server that cannot be reached is a
:class:`~delayq.errors.StoreError` (never the client library's own exception).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from delayq.errors import DelayqError, InvalidInput, StoreError
from delayq.scrub import scrub

if TYPE_CHECKING:  # the CLI's help reads STORE_FORMS: no store, no ssl (delayq.urls) for it
    from delayq.stores.base import IdempotencyStore

__all__ = ["STORE_FORMS", "absolute_store_url", "open_store"]

STORE_FORMS = (
    "sqlite:///relative.db, sqlite:////absolute/path.db, redis://host:6379/0, "
    "rediss://..., unix:///path/redis.sock, postgresql://user:pass@host/db"
)


def _scheme(text: str) -> str:
    return text.partition("://")[0].lower() if "://" in text else ""


def _sqlite_path(url: str, text: str, what: str) -> str:
    path = text[len("sqlite:///") :] if text.lower().startswith("sqlite:///") else ""
    if not path:
        raise InvalidInput(f"{what} {url!r} names no file; write {STORE_FORMS}")
    if not Path(path).is_file():
        raise InvalidInput(
            f"{what} {url!r}: no SQLite file at {path!r} (the consumers' store must "
            "exist; a new, empty one would know no message)"
        )
    return path


def open_store(url: str, *, what: str = "--store") -> IdempotencyStore:
    """The store ``url`` names, opened (a server store is reached now); ``what`` names
    the URL in errors."""
    from delayq.urls import redact

    text = url.strip() if isinstance(url, str) else ""
    scheme = _scheme(text)
    try:
        if scheme == "sqlite":
            from delayq.stores.sqlite import SQLiteStore

            return SQLiteStore(_sqlite_path(url, text, what))
        if scheme in ("redis", "rediss", "unix"):
            from delayq.stores.redis import RedisStore

            return RedisStore(text)
        if scheme in ("postgresql", "postgres"):
            from delayq.stores.postgres import PostgresStore

            return PostgresStore(text)
    except DelayqError:
        raise
    except ValueError as exc:  # the client's word for a malformed URL
        raise InvalidInput(scrub(f"{what}: {exc}; write one of {STORE_FORMS}")) from None
    except Exception as exc:  # the client's own error (server down, refused login)
        raise StoreError(
            scrub(f"cannot open the store at {redact(text)}: {type(exc).__name__}: {exc}")
        ) from exc
    raise InvalidInput(
        f"{what} {redact(text) if '://' in text else text!r} is not a store URL; "
        f"write one of {STORE_FORMS}"
    )


def absolute_store_url(url: str, *, what: str = "--store") -> str:
    """``url`` with a relative SQLite path made absolute (a process started elsewhere, a
    Spark executor, finds the same file); other URLs unchanged. Checks what
    :func:`open_store` checks without opening anything."""
    text = url.strip() if isinstance(url, str) else ""
    if _scheme(text) != "sqlite":
        return text
    return "sqlite:///" + str(Path(_sqlite_path(url, text, what)).resolve())
