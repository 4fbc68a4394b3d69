"""A PostgreSQL DSN's password kept out of what :class:`~delayq.stores.postgres.PostgresStore`
shows: its ``repr`` and the errors of a failed connect."""

from __future__ import annotations

import re

from psycopg.conninfo import conninfo_to_dict

from delayq.urls import redact

__all__ = ["redact_dsn", "scrub_dsn"]

_PASSWORD_PARAM = re.compile(r"(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&#]*)")


def redact_dsn(dsn: str) -> str:
    """``dsn`` (a ``postgresql://`` URL or a ``key=value`` string) with any password
    (and ``sslpassword``) replaced by ``***``."""
    if "://" in dsn:
        dsn = redact(dsn)
    return _PASSWORD_PARAM.sub(lambda m: m.group(1) + "***", dsn)


def _secrets(dsn: str) -> list[str]:
    found = [m.group(2).strip("'") for m in _PASSWORD_PARAM.finditer(dsn)]
    try:
        password = conninfo_to_dict(dsn).get("password")
    except Exception:
        password = None
    if isinstance(password, str):
        found.append(password)
    return sorted({s for s in found if s}, key=len, reverse=True)


def scrub_dsn(message: str, dsn: str) -> str:
    """``message`` (a client's error) with every password ``dsn`` holds replaced by
    ``***``: psycopg may quote the DSN back. Where it shows as a DSN's (``:pw@``,
    ``password=pw``) it always goes; bare, only a password of 6 characters or more
    (a short one, "p" say, would turn every "p" of the text into ``***``)."""
    message = message.replace(dsn, redact_dsn(dsn))
    message = _PASSWORD_PARAM.sub(lambda m: m.group(1) + "***", message)
    for secret in _secrets(dsn):
        message = message.replace(f":{secret}@", ":***@")
        if len(secret) >= 6:
            message = message.replace(secret, "***")
    return message
