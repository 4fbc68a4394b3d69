"""A small client of RabbitMQ's management HTTP API, on the standard library alone.

delayq reads queues, exchanges, bindings and feature flags from it when it is
reachable (``delayq topology verify``, ``delayq stats``) and can set
permissions with it (``delayq topology grant --via management``). Everything
works without it, over AMQP, with less detail.

>>> api = ManagementAPI("http://guest:guest@localhost:15672/")  # doctest: +SKIP
>>> api.queue("/", "delayq.tier.30s")["messages"]                # doctest: +SKIP
0
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from delayq.errors import AccessRefused, BrokerError, InvalidURL, ManagementUnavailable
from delayq.urls import host_urls, redact

__all__ = ["DEFAULT_MANAGEMENT_PORT", "ManagementAPI", "management_url_for"]

DEFAULT_MANAGEMENT_PORT = 15672
"""The management plugin's default HTTP port (15671 with TLS)."""


def management_url_for(amqp_url: str, explicit: str | None = None) -> tuple[str, bool]:
    """The management URL to use and whether the user chose it.

    ``explicit``, else ``$DELAYQ_MANAGEMENT_URL``, else the AMQP URL's host and
    credentials on the default management port (https for ``amqps``).
    """
    chosen = explicit or os.environ.get("DELAYQ_MANAGEMENT_URL")
    if chosen:
        return chosen, True
    # a URL of several hosts (rabbit1,rabbit2:5672): the first one's API, which answers
    # for the whole cluster
    parts = urlsplit(host_urls(amqp_url)[0])
    tls = parts.scheme == "amqps"
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    userinfo = ""
    if parts.username is not None:
        userinfo = parts.username + (f":{parts.password}" if parts.password is not None else "")
        userinfo += "@"
    port = DEFAULT_MANAGEMENT_PORT - 1 if tls else DEFAULT_MANAGEMENT_PORT
    netloc = f"{userinfo}{host}:{port}"
    return urlunsplit(("https" if tls else "http", netloc, "/", "", "")), False


class ManagementAPI:
    """JSON over HTTP(S) with basic authentication taken from the URL."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise InvalidURL(f"management URL {redact(url)} is malformed (bad port?)") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidURL(
                f"management URL {redact(url)} must look like http://user:pass@host:15672/"
            )
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        netloc = host if port is None else f"{host}:{port}"
        self._base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        user = unquote(parts.username or "guest")
        password = unquote(parts.password or "guest")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        self._auth = f"Basic {token}"
        self._timeout_s = timeout_s
        self.url = redact(url)
        """The URL with its password hidden: safe to print."""

    def __repr__(self) -> str:
        return f"ManagementAPI({self.url!r})"

    def _request(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self._base + path,
            data=data,
            method=method,
            headers={"Authorization": self._auth, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc, method, path) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            reason = getattr(reason, "strerror", None) or reason
            raise ManagementUnavailable(
                f"the management API at {self.url} cannot be reached ({reason}): is the "
                "rabbitmq_management plugin enabled, and the URL right?"
            ) from None
        return json.loads(payload) if payload else None

    def _http_error(self, exc: urllib.error.HTTPError, method: str, path: str) -> BrokerError:
        try:
            detail = json.loads(exc.read() or b"{}").get("reason", "")
        except (ValueError, AttributeError):
            detail = ""
        if exc.code == 401:
            return ManagementUnavailable(
                f"the management API at {self.url} refused the login ({detail or 'HTTP 401'}): "
                "wrong user or password, or a user without a management tag"
            )
        if exc.code == 403:
            return AccessRefused(
                f"the management API at {self.url} refused {method} {path} "
                f"({detail or 'HTTP 403'}): the user's tags or permissions do not allow it"
            )
        return _StatusError(
            exc.code,
            f"the management API at {self.url} answered {exc.code} to {method} {path}"
            f"{': ' + str(detail) if detail else ''}",
        )

    def get(self, path: str) -> Any:
        """GET ``/api`` + ``path`` as JSON."""
        return self._request("GET", "/api" + path)

    def get_or_none(self, path: str) -> Any:
        """Like :meth:`get`, but ``None`` for 404 (an entity that does not exist)."""
        try:
            return self.get(path)
        except _StatusError as exc:
            if exc.status == 404:
                return None
            raise

    # The few calls delayq makes --------------------------------------------------

    def overview(self) -> dict[str, Any]:
        return dict(self.get("/overview"))

    def node_names(self) -> list[str]:
        """The names of the cluster's nodes (``/api/nodes``)."""
        return [str(node.get("name")) for node in self.get("/nodes?columns=name") or ()]

    def feature_flags(self) -> dict[str, str]:
        """Feature flag name to state (``enabled``, ``disabled``, ...)."""
        return {flag["name"]: str(flag.get("state", "")) for flag in self.get("/feature-flags")}

    def vhost(self, name: str) -> dict[str, Any] | None:
        """The vhost, or ``None``: it does not exist, or (RabbitMQ 4.3) this user has no
        permission on it, which it cannot tell from missing."""
        return self.get_or_none(f"/vhosts/{_part(name)}")  # type: ignore[no-any-return]

    def queue(self, vhost: str, name: str) -> dict[str, Any] | None:
        return self.get_or_none(f"/queues/{_part(vhost)}/{_part(name)}")  # type: ignore[no-any-return]

    def queues(self, vhost: str, columns: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Every queue of ``vhost`` (only ``columns`` of each, when given)."""
        query = f"?columns={','.join(columns)}" if columns else ""
        return list(self.get(f"/queues/{_part(vhost)}{query}") or [])

    def exchange(self, vhost: str, name: str) -> dict[str, Any] | None:
        return self.get_or_none(f"/exchanges/{_part(vhost)}/{_part(name)}")  # type: ignore[no-any-return]

    def bindings_from(self, vhost: str, exchange: str) -> list[dict[str, Any]] | None:
        """Bindings whose source is ``exchange``; ``None`` if it does not exist."""
        path = f"/exchanges/{_part(vhost)}/{_part(exchange)}/bindings/source"
        return self.get_or_none(path)  # type: ignore[no-any-return]

    def permissions(self, vhost: str, user: str) -> dict[str, Any] | None:
        """The user's permissions on ``vhost``; ``None`` when none are set (or no user)."""
        return self.get_or_none(f"/permissions/{_part(vhost)}/{_part(user)}")  # type: ignore[no-any-return]

    def set_permissions(self, vhost: str, user: str, permissions: dict[str, str]) -> None:
        try:
            self._request("PUT", f"/api/permissions/{_part(vhost)}/{_part(user)}", permissions)
        except _StatusError as exc:
            if exc.status == 400 and "vhost_or_user_not_found" in str(exc):
                raise BrokerError(
                    f"cannot set permissions of user {user!r} on vhost {vhost!r}: the user or "
                    "the vhost does not exist (create the user first)"
                ) from None
            raise


class _StatusError(BrokerError):
    """Any other HTTP error status; ``status`` says which."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, str(self)))


def _part(value: str) -> str:
    return quote(value, safe="")
