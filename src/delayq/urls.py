"""Broker URLs: validation, the environment's default, and redaction.

A password never appears in an error, a log line or a repr: every message
about a URL shows :func:`redact` of it.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

from delayq.errors import InvalidURL

__all__ = ["DEFAULT_URL", "redact", "resolve_url", "validate_url"]

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"


def redact(url: str) -> str:
    """The URL with its password replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        userinfo, _, hostpart = rest.rpartition("@")
        if ":" in userinfo:
            user = userinfo.split(":", 1)[0]
            return f"{scheme}://{user}:***@{hostpart}"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def validate_url(url: object) -> str:
    """Check that ``url`` is an ``amqp://`` or ``amqps://`` URL with a host."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidURL("broker URL must be a non-empty str like amqp://user:pass@host:5672/vhost")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidURL(f"broker URL {redact(url)} is malformed (bad port?)") from None
    if parts.scheme not in ("amqp", "amqps"):
        raise InvalidURL(
            f"broker URL {redact(url)} must start with amqp:// or amqps://, "
            f"not {parts.scheme + '://' if parts.scheme else 'nothing'}"
        )
    if not parts.hostname:
        raise InvalidURL(f"broker URL {redact(url)} has no host")
    if port == 0:
        raise InvalidURL(f"broker URL {redact(url)} has port 0")
    return url


def resolve_url(explicit: str | None = None) -> str:
    """``explicit``, else ``DELAYQ_URL``, else ``RABBITMQ_URL``, else the local default."""
    if explicit is not None:
        return validate_url(explicit)
    url = os.environ.get("DELAYQ_URL") or os.environ.get("RABBITMQ_URL") or DEFAULT_URL
    return validate_url(url)
