"""What a Spark scheduling job checks on the driver, and how its task failures surface.

A wrong URL or an unapplied topology would otherwise be found by every task on the
executors, and reach the caller as a Spark ``PythonException`` wrapping pages of Java
and Python stack: the driver checks first, and a task's delayq error is raised again
as itself.
"""

from __future__ import annotations

import re

from delayq import errors
from delayq.errors import BrokerError, DelayqError, TopologyMissing
from delayq.sync._connection import close_quietly, connect
from delayq.sync._errors import CHANNEL_CLOSED, channel_error, is_missing
from delayq.sync.publisher import Publisher
from delayq.topology.model import Topology
from delayq.urls import redact

__all__ = ["preflight", "task_error"]


def preflight(url: str, topology: Topology) -> None:
    """Raise what a task would meet at its first publish: the broker cannot be reached
    (:class:`~delayq.errors.ConnectionFailed`), an exchange a row may be published to is
    missing (:class:`~delayq.errors.TopologyMissing`), or the user may not use it."""
    with Publisher(url, topology) as publisher:
        publisher.connect()  # the publisher's own checks of the namespace, if any
    tiers = [name for tier in topology.ladder.tiers for name in topology.tier_shards(tier)]
    exchanges = [topology.ready_exchange, *tiers]
    if topology.exact_enabled:
        exchanges += [topology.level_name(k) for k in range(topology.exact_levels)]
    connection = connect(url, name="delayq-spark-check")
    try:
        channel = connection.channel()
        for name in exchanges:
            try:
                channel.exchange_declare(name, passive=True)
            except CHANNEL_CLOSED as exc:
                if is_missing(exc):
                    raise TopologyMissing(
                        f"exchange {name!r} does not exist on {redact(url)}: apply the "
                        f"topology (delayq topology apply) before scheduling; nothing was sent"
                    ) from exc
                raise channel_error(exc) from exc
    finally:
        close_quietly(connection)


_RAISED = re.compile(r"^delayq\.(?:errors\.)?(\w+): (.*)$", re.MULTILINE)
"""A delayq error in a traceback (shown as ``delayq.X``, see ``delayq.__init__``)."""


def task_error(
    exc: BaseException,
    note: str = " (raised in a Spark task; messages confirmed before it stay published)",
) -> DelayqError | None:
    """The delayq error a failed Spark job's task raised (the last one in its text), as a
    delayq error the caller can catch, its message ending in ``note`` (what the job did
    before); ``None`` when the job failed for another reason."""
    found = _RAISED.findall(str(exc))
    if not found:
        return None
    name, message = found[-1]
    kind = getattr(errors, name, None)
    if isinstance(kind, type) and issubclass(kind, DelayqError):
        try:
            return kind(message + note)
        except TypeError:  # an error built from fields, not a message
            pass
    return BrokerError(f"{name}: {message}{note}")
