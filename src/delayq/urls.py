"""Broker URLs: validation, options, the environment's default, and redaction.

A password never appears in an error, a log line or a repr: every message
about a URL shows :func:`redact` of it.

The query of a URL carries delayq's connection options, the same for both
adapters: the TLS options of :mod:`delayq.tls` (``amqps://`` only) and
``heartbeat`` (seconds; 0 turns heartbeats off). Any other option is refused,
so a typo never silently means "no client certificate".

A URL may name several nodes of one cluster, separated by commas; they share
the credentials, the vhost and the query::

    amqp://app:secret@rabbit1:5672,rabbit2:5672,rabbit3:5672/orders?heartbeat=30

:func:`host_urls` splits it into one single-host URL per node, and
:func:`connection_plan` orders them for connecting: every host once, starting
from a random one, so that many clients spread over the cluster and a lost
node costs each of them at most one refused attempt.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from delayq.errors import InvalidInput, InvalidURL
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
    "MEMORY_SCHEME",
    "BrokerURL",
    "check_vhost",
    "connection_plan",
    "host_label",
    "host_urls",
    "hosts_in_turn",
    "memory_broker_name",
    "parse_url",
    "redact",
    "resolve_url",
    "resolved_memory_name",
    "tried_hosts",
    "url_vhost",
    "validate_url",
]

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"

_RNG = random.Random()
"""Where each connection starts in a URL's list of hosts, unless the caller passes its own."""

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
    # isascii: str.isdigit() also takes "²", which int() refuses, and other scripts' digits.
    if heartbeat is not None and not (
        heartbeat.isascii() and heartbeat.isdigit() and int(heartbeat) <= 65535
    ):
        raise InvalidURL(
            f"broker URL {redact(url)}: heartbeat={heartbeat!r} must be whole seconds from 0 "
            "to 65535 (0 turns heartbeats off)"
        )
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
    """Check that ``url`` is an ``amqp://`` or ``amqps://`` URL with one host or several."""
    if not isinstance(url, str) or not url.strip():
        name = type(url).__name__
        got = repr(url) if isinstance(url, str) else f"a{'n' * (name[0] in 'aeiouAEIOU')} {name}"
        hint = (
            " (check the order: apply_topology(topology, url), but Publisher(url, topology))"
            if type(url).__name__ == "Topology"
            else ""
        )
        raise InvalidURL(
            f"broker URL must be a non-empty str like amqp://user:pass@host:5672/vhost, "
            f"not {got}{hint}"
        )
    for one in host_urls(url):
        _check_one(one, shown=redact(url))
    return url


def _check_one(url: str, *, shown: str) -> None:
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


def resolve_url(explicit: str | None = None) -> str:
    """``explicit``, else ``DELAYQ_URL``, else ``RABBITMQ_URL``, else the local default.

    A ``memory://NAME`` URL (a :class:`delayq.testing.MemoryBroker`) is returned as
    it is: publishers and consumers given one work against that broker.
    """
    url, source = explicit, None
    if url is None:
        source = next((n for n in ("DELAYQ_URL", "RABBITMQ_URL") if os.environ.get(n)), None)
        # A value read from a file or pasted keeps its newline: no URL ends in one, and
        # left in, it split every error line that shows the URL.
        url = os.environ[source].strip() if source else DEFAULT_URL
    if memory_broker_name(url) is not None:
        return url
    try:
        return validate_url(url)
    except InvalidURL as exc:
        if source is None:
            raise
        # Say where it came from: the command line may not mention a URL at all.
        raise InvalidURL(f"${source}: {exc}") from exc


def url_vhost(url: str) -> str:
    """The vhost an AMQP URL connects to, read as pika reads it: ``/`` when the path
    names none, else the path without its first ``/``, percent-decoded (``/%2Fshop`` is
    the vhost ``/shop``)."""
    path = urlsplit(host_urls(url)[0]).path
    return "/" if path in ("", "/") else unquote(path[1:])


def check_vhost(declared: str | None, url: str) -> None:
    """Refuse a URL on another vhost than the one a topology file names (``declared``;
    ``None``: the topology names none, and the URL's vhost is the topology's).

    :raises InvalidInput: the two differ: nothing is declared, sent or consumed in a
        vhost the topology does not name.
    """
    if declared is None or memory_broker_name(url) is not None:
        return
    actual = url_vhost(url)
    if actual != declared:
        quoted = "/" + declared.replace("%", "%25").replace("/", "%2F")
        raise InvalidInput(
            f"the topology names vhost {declared!r}, the URL connects to vhost {actual!r} "
            f"({redact(url)}): put the topology's vhost in the URL (path {quoted}), or "
            "change the topology's vhost"
        )


MEMORY_SCHEME = "memory"
"""The scheme of :class:`delayq.testing.MemoryBroker` URLs: ``memory://NAME``."""


def memory_broker_name(url: object) -> str | None:
    """``NAME`` for a ``memory://NAME`` URL, else ``None`` (no environment lookup)."""
    prefix = f"{MEMORY_SCHEME}://"
    if isinstance(url, str) and url.startswith(prefix):
        return url[len(prefix) :].rstrip("/")
    return None


def resolved_memory_name(explicit: str | None) -> str | None:
    """The memory broker ``explicit`` (or, when ``None``, the environment) names, if any."""
    if explicit is None:
        explicit = os.environ.get("DELAYQ_URL") or os.environ.get("RABBITMQ_URL")
    return memory_broker_name(explicit)
