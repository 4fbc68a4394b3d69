"""What a pika connection says about its broker, and the management API that goes with it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pika

from delayq.errors import DelayqError
from delayq.ops.management import ManagementAPI

__all__ = ["ManagementChoice", "Reach", "reach_management", "server_property"]


@dataclass(frozen=True)
class ManagementChoice:
    """The management API to try, and whether the user asked for it (then it must answer)."""

    api: ManagementAPI
    explicit: bool


@dataclass(frozen=True)
class Reach:
    """The outcome of trying the management API: the API to use, or why not."""

    api: ManagementAPI | None
    detail: str
    failed: bool = False
    """True when the user asked for this API and it did not answer (or is another broker's)."""


def server_property(connection: pika.BlockingConnection, name: str) -> str | None:
    """One of the server properties the broker sent when the connection opened."""
    # pika keeps the server properties on the underlying connection only.
    properties = getattr(connection._impl, "server_properties", None) or {}
    value = properties.get(name)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def reach_management(
    choice: ManagementChoice | ManagementAPI | None,
    connection: pika.BlockingConnection,
    vhost: str | None = None,
) -> Reach:
    """The management API if it answers for the broker ``connection`` reaches (and its
    user may see ``vhost``: RabbitMQ 4.3 answers 404 for every queue of a vhost it may not
    see, which would read as all of them missing).

    A bare :class:`ManagementAPI` counts as asked for: if it does not answer, say so.
    """
    if isinstance(choice, ManagementAPI):
        choice = ManagementChoice(choice, explicit=True)
    if choice is None:
        return Reach(None, "not asked for (--no-management)")
    try:
        overview = choice.api.overview()
    except DelayqError as exc:
        hint = "" if choice.explicit else " (pass --management-url)"
        return Reach(None, f"{exc}{hint}", failed=choice.explicit)
    theirs = overview.get("cluster_name")
    ours = server_property(connection, "cluster_name")
    if theirs and ours and theirs != ours and not _same_cluster(choice.api, overview, ours):
        # A derived URL (same host, port 15672) may reach another broker.
        return Reach(
            None,
            f"{choice.api.url} answers for cluster {theirs!r}, but the AMQP URL reaches "
            f"{ours!r}: not used",
            failed=choice.explicit,
        )
    if vhost is not None:
        try:
            seen = choice.api.vhost(vhost) is not None
            why = "its user may not see it (or it does not exist)"
        except DelayqError as exc:
            seen, why = False, str(exc)
        if not seen:
            return Reach(
                None,
                f"{choice.api.url} cannot show vhost {vhost!r}: {why}; give --management-url "
                "a user with a permission on it",
                failed=choice.explicit,
            )
    version = overview.get("rabbitmq_version") or "?"
    return Reach(choice.api, f"{choice.api.url} (RabbitMQ {version}, cluster {theirs!r})")


def _same_cluster(api: ManagementAPI, overview: dict[str, Any], ours: str) -> bool:
    """Whether the node an AMQP connection reached, reporting ``ours`` as its cluster name,
    is one of the nodes ``api`` answers for.

    A cluster whose ``cluster_name`` was never set has none: each node reports its own
    default, ``<its name>@<the host's FQDN>`` (``rabbit@h2.example.com`` for the node
    ``rabbit@h2``, ``delayq-1@vm`` for ``delayq-1@localhost``), so through a URL of several
    hosts the two sides meet different nodes in most calls. Such a name is taken as a
    member's when its name part is one of the cluster's nodes'; two brokers that keep the
    default names could never be told apart by them anyway."""
    try:
        nodes = api.node_names()
    except DelayqError:
        return False
    if ours in nodes:
        return True
    theirs = str(overview.get("cluster_name") or "")
    api_node = str(overview.get("node") or "")
    default_named = theirs.partition("@")[0] == api_node.partition("@")[0] != ""
    ours_id, at, _ = ours.partition("@")
    return default_named and bool(at) and ours_id in {n.partition("@")[0] for n in nodes}
