"""``delayq stats`` with pika: queue depths from the management API, else AMQP.

The management API reports ready and unacknowledged messages and consumers
(its figures are sampled every few seconds). Over AMQP a passive declare
returns the ready count and the consumer count only; a quorum queue's count
can lag a little behind. RabbitMQ 4.2.6 and later refuse a passive declare to a
user with no permission on the queue: that queue is :class:`~delayq.ops.depths.Unseen`.
"""

from __future__ import annotations

from delayq.errors import AccessRefused, ConnectionFailed, DelayqError, ManagementUnavailable
from delayq.ops.depths import Counted, Depth, Unseen
from delayq.ops.management import ManagementAPI
from delayq.sync._broker import ManagementChoice, Reach, reach_management
from delayq.sync._connection import close_quietly, connect
from delayq.sync._errors import CHANNEL_CLOSED, CONNECTION_ERRORS, channel_error, is_missing
from delayq.sync.provision import Channels
from delayq.urls import redact, resolve_url, url_vhost

__all__ = ["queue_depths"]


def _by_api(
    api: ManagementAPI, vhost: str, queues: list[str], channels: Channels
) -> dict[str, Counted]:
    depths: dict[str, Counted] = {}
    unsampled: list[str] = []
    for name in queues:
        found = api.queue(vhost, name)
        if found is not None and "messages_ready" not in found:
            # Declared since the last statistics sample: the API has no counts for it yet,
            # which is not 0. A passive declare counts its ready messages now.
            unsampled.append(name)
            continue
        depths[name] = None if found is None else _api_depth(found)
    depths.update(_by_amqp(channels, unsampled))
    return {name: depths[name] for name in queues}


def _api_depth(found: dict[str, object]) -> Depth:
    ready = _count(found.get("messages_ready"))
    unacked = _count(found.get("messages_unacknowledged"))
    held = _count(found.get("messages"))
    # A quorum queue counts the dead letters it keeps until their target confirms them
    # in ``messages`` but neither in ready nor in unacknowledged.
    forwarding = max(0, held - ready - unacked) if found.get("type") == "quorum" else None
    return Depth(
        ready=ready,
        unacked=unacked,
        consumers=_count(found.get("consumers")),
        forwarding=forwarding,
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _by_amqp(channels: Channels, queues: list[str]) -> dict[str, Counted]:
    depths: dict[str, Counted] = {}
    for name in queues:
        try:
            ok = channels.channel.queue_declare(name, passive=True).method
        except CHANNEL_CLOSED as exc:
            if is_missing(exc):
                depths[name] = None
                continue
            error = channel_error(exc)
            if not isinstance(error, AccessRefused):
                raise error from exc
            depths[name] = Unseen(str(error))
            continue
        depths[name] = Depth(
            ready=int(ok.message_count), unacked=None, consumers=int(ok.consumer_count)
        )
    return depths


def queue_depths(
    queues: list[str],
    url: str | None = None,
    *,
    management: ManagementChoice | ManagementAPI | None = None,
) -> tuple[dict[str, Counted], str]:
    """Each queue's depth (``None``: it does not exist; :class:`~delayq.ops.depths.Unseen`:
    this user may not look at it) and the source used, to print."""
    resolved = resolve_url(url)
    vhost = url_vhost(resolved)
    connection = connect(resolved, name="delayq-stats")
    channels = Channels(connection)
    try:
        reach = reach_management(management, connection, vhost)
        if reach.failed:
            # Asked for by name: counting some other way would pass off other figures
            # (ready only, no unacked) as the ones asked for.
            raise ManagementUnavailable(
                f"the management API asked for cannot be used: {reach.detail}; drop "
                "--management-url (or give --no-management) to count over AMQP"
            )
        if reach.api is not None:
            try:
                depths = _by_api(reach.api, vhost, queues, channels)
                return depths, f"management API {reach.api.url} (vhost {vhost!r})"
            except DelayqError as exc:
                if isinstance(management, ManagementAPI) or (
                    isinstance(management, ManagementChoice) and management.explicit
                ):
                    raise
                reach = Reach(None, str(exc))
        source = f"AMQP passive declares on {redact(resolved)} (management API: {reach.detail})"
        return _by_amqp(channels, queues), source
    except CONNECTION_ERRORS as exc:
        raise ConnectionFailed(
            f"lost the connection to {redact(resolved)} while counting messages"
        ) from exc
    finally:
        channels.close()
        close_quietly(connection)
