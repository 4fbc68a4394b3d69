"""Broker URLs: validation, options, the environment's default, and redaction.

A password never appears in an error, a log line or a repr: every message
about a URL shows :func:`redact` of it.

The query of a URL carries delayq's connection options, the same for both
adapters: the TLS options of :mod:`delayq.tls` (``amqps://`` only) and
``heartbeat`` (seconds; 0 turns heartbeats off). Any other option is refused,
so a typo never silently means "no client certificate".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from delayq.errors import InvalidURL
from delayq.tls import (
    TLS_OPTIONS,
    TLSOptions,
    describe_tls_failure,
    describe_tls_reset,
    tls_options,
)

__all__ = [
    "CLIENT_OPTIONS",
    "DEFAULT_URL",
    "BrokerURL",
    "parse_url",
    "redact",
    "resolve_url",
    "validate_url",
]

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"

CLIENT_OPTIONS = ("heartbeat",)
"""Query options passed on to the client library (pika and aiormq read them alike)."""


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


@dataclass(frozen=True, slots=True)
class BrokerURL:
    """A checked broker URL, split into what the client library gets and what delayq uses."""

    client_url: str
    """The URL without delayq's own options: what pika and aio-pika are given."""
    host: str
    tls: TLSOptions | None
    """``None`` for ``amqp://``; for ``amqps://`` the options, defaults filled in."""

    def __repr__(self) -> str:
        return f"BrokerURL({redact(self.client_url)!r}, tls={self.tls!r})"

    def tls_failure(self, exc: BaseException) -> str | None:
        """What went wrong in TLS when ``exc`` ended a connection attempt, else ``None``
        (the same words for pika's and aiormq's errors)."""
        if self.tls is None:
            return None
        return describe_tls_failure(exc, self.tls, redact(self.client_url))

    def unreachable_hint(self, exc: BaseException | None) -> str:
        """The end of a "cannot connect" error: a TLS hint when ``exc`` suggests one."""
        if self.tls is not None and exc is not None:
            hint = describe_tls_reset(exc, self.tls)
            if hint is not None:
                return hint
        return "is RabbitMQ running and the URL right?"


def parse_url(url: object, environ: Mapping[str, str] | None = None) -> BrokerURL:
    """Check ``url`` and split off its options (``environ``: default ``os.environ``).

    Raises :class:`~delayq.errors.InvalidURL` for a malformed URL, an unknown or
    repeated option, a TLS option on ``amqp://``, or a TLS file that does not exist.
    """
    _check_syntax(url)
    assert isinstance(url, str)
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    known = (*TLS_OPTIONS, *CLIENT_OPTIONS)
    query: dict[str, str] = {}
    for key, value in pairs:
        if key not in known:
            raise InvalidURL(
                f"broker URL {redact(url)} has an unknown option {key!r}; "
                f"known options: {', '.join(known)}"
            )
        if key in query:
            raise InvalidURL(f"broker URL {redact(url)} gives option {key!r} twice")
        query[key] = value
    passed = {k: v for k, v in query.items() if k in CLIENT_OPTIONS}
    heartbeat = passed.get("heartbeat")
    if heartbeat is not None and not (heartbeat.isdigit() and int(heartbeat) <= 65535):
        raise InvalidURL(f"heartbeat={heartbeat!r} must be whole seconds from 0 to 65535")
    tls = tls_options(
        parts.scheme,
        {k: v for k, v in query.items() if k in TLS_OPTIONS},
        os.environ if environ is None else environ,
    )
    client_url = urlunsplit(
        (parts.scheme, parts.netloc, parts.path, urlencode(passed), parts.fragment)
    )
    return BrokerURL(client_url=client_url, host=parts.hostname or "", tls=tls)


def validate_url(url: object) -> str:
    """Check ``url`` and its options (see :func:`parse_url`); return it unchanged."""
    parse_url(url)
    assert isinstance(url, str)
    return url


def _check_syntax(url: object) -> str:
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
