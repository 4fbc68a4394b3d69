"""Broker URLs: validation, the environment's default, several hosts, and redaction.

A password never appears in an error, a log line or a repr: every message
about a URL shows :func:`redact` of it.

A URL may name several nodes of one cluster, separated by commas; they share
the credentials, the vhost and the query::

    amqp://app:secret@rabbit1:5672,rabbit2:5672,rabbit3:5672/orders?heartbeat=30

:func:`host_urls` splits it into one single-host URL per node, and
:func:`hosts_in_turn` orders them for one connection attempt: every host once,
starting from a random one, so that many clients spread over the cluster and
a lost node costs each of them at most one refused attempt.
"""

from __future__ import annotations

import os
import random
from urllib.parse import urlsplit, urlunsplit

from delayq.errors import InvalidURL

__all__ = [
    "DEFAULT_URL",
    "connection_plan",
    "host_label",
    "host_urls",
    "hosts_in_turn",
    "redact",
    "resolve_url",
    "tried_hosts",
    "validate_url",
]

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"

_RNG = random.Random()
"""Where each connection starts in a URL's list of hosts, unless the caller passes its own."""


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


def _split_netloc(url: str) -> tuple[str, str, list[str], str] | None:
    """``(scheme://, userinfo@, hosts, rest)`` of a URL whose host part lists several
    hosts, else None (a single host, or not a URL at all)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    userinfo, at, hostlist = netloc.rpartition("@")
    if "," not in hostlist:
        return None
    return f"{scheme}://", f"{userinfo}{at}", hostlist.split(","), tail


def host_urls(url: str) -> list[str]:
    """One single-host URL per host of ``url``, in the order written.

    >>> host_urls("amqp://u:p@h1:5672,h2:5673/vh")
    ['amqp://u:p@h1:5672/vh', 'amqp://u:p@h2:5673/vh']
    """
    split = _split_netloc(url)
    if split is None:
        return [url]
    scheme, userinfo, hosts, tail = split
    if any(not host.strip() for host in hosts):
        raise InvalidURL(f"broker URL {redact(url)} has an empty host in its list of hosts")
    return [f"{scheme}{userinfo}{host.strip()}{tail}" for host in hosts]


def hosts_in_turn(url: str, rng: random.Random | None = None) -> list[str]:
    """The single-host URLs of ``url``, each once, starting at a random one (``rng``)."""
    urls = host_urls(url)
    start = (rng or _RNG).randrange(len(urls))
    return urls[start:] + urls[:start]


def connection_plan(
    url: str, *, attempts: int, backoff_s: float, rng: random.Random | None = None
) -> list[tuple[float, str]]:
    """``(pause_s, single-host URL)`` for each connection attempt, in order.

    ``attempts`` rounds, each trying every host once from a random start (the same
    order every round); the first attempt of each later round pauses
    ``backoff_s``, then twice that, and so on.

    >>> connection_plan("amqp://h1,h2/", attempts=2, backoff_s=0.5, rng=random.Random(0))
    [(0.0, 'amqp://h2/'), (0.0, 'amqp://h1/'), (0.5, 'amqp://h2/'), (0.0, 'amqp://h1/')]
    """
    urls = hosts_in_turn(url, rng)
    return [
        (backoff_s * 2 ** (round_ - 1) if round_ and i == 0 else 0.0, one)
        for round_ in range(max(1, attempts))
        for i, one in enumerate(urls)
    ]


def host_label(url: str) -> str:
    """``host:port`` of a single-host URL, for messages (never the credentials)."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{host}:{port or (5671 if parts.scheme == 'amqps' else 5672)}"


def tried_hosts(url: str) -> str:
    """`` on each of its 3 hosts (h1:5672, ...)`` for a URL of several hosts, else ``""``."""
    urls = host_urls(url)
    if len(urls) == 1:
        return ""
    return f" on each of its {len(urls)} hosts ({', '.join(host_label(u) for u in urls)})"


def validate_url(url: object) -> str:
    """Check that ``url`` is an ``amqp://`` or ``amqps://`` URL with one host or several."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidURL("broker URL must be a non-empty str like amqp://user:pass@host:5672/vhost")
    for one in host_urls(url):
        _validate_one(one, shown=redact(url))
    return url


def _validate_one(url: str, *, shown: str) -> None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidURL(f"broker URL {shown} is malformed (bad port?)") from None
    if parts.scheme not in ("amqp", "amqps"):
        raise InvalidURL(
            f"broker URL {shown} must start with amqp:// or amqps://, "
            f"not {parts.scheme + '://' if parts.scheme else 'nothing'}"
        )
    if not parts.hostname:
        raise InvalidURL(f"broker URL {shown} has no host")
    if port == 0:
        raise InvalidURL(f"broker URL {shown} has port 0")


def resolve_url(explicit: str | None = None) -> str:
    """``explicit``, else ``DELAYQ_URL``, else ``RABBITMQ_URL``, else the local default."""
    if explicit is not None:
        return validate_url(explicit)
    url = os.environ.get("DELAYQ_URL") or os.environ.get("RABBITMQ_URL") or DEFAULT_URL
    return validate_url(url)
