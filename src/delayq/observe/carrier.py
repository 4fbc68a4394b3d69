"""What a message carries for its traces: its context, and the history of its replays.

The context: W3C ``traceparent``/``tracestate`` (the global propagator's fields) in the
AMQP headers, read from headers of any origin (str values, or UTF-8 bytes as some
clients send them) by :func:`extract`, replaced by :func:`replace_context`.

The replay history: a DLQ replay sends a message again with its attempt counter reset
to 1, so the retry budget starts over (``docs/guides/dead-letters.md``). So that the
attempts after it are not taken for a message never handled, the replayed copy says:

- ``delayq-replays`` (:data:`H_REPLAYS`): how often the message has been replayed, this
  replay included;
- ``delayq-previous-attempts`` (:data:`H_PREVIOUS_ATTEMPTS`): the attempts it used up
  before this replay: the parked copy's attempt counter (``dlq list``'s attempts), plus
  those before earlier replays.

A ``process`` span shows them as ``delayq.replayed``, ``delayq.replay_count`` and
``delayq.previous_attempts`` (:func:`replay_attributes`); every consumer's retries and
dead letters keep them (the planner's carried headers; :func:`carry_history` for a
traced hop), so a second replay counts on. Nothing here imports opentelemetry until a
context is read or written.

>>> from delayq.consume.delivery import Delivery
>>> parked = Delivery(queue="orders.dlq", body=b"{}", routing_key="orders", message_id="m-1",
...                   content_type=None, headers={"delayq-attempt": 3})
>>> replay_history(parked)
{'delayq-replays': 1, 'delayq-previous-attempts': 3}
>>> replay_attributes({"delayq-replays": 1, "delayq-previous-attempts": 3})
{'delayq.replayed': True, 'delayq.replay_count': 1, 'delayq.previous_attempts': 3}
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, cast

from delayq.consume.delivery import H_PREVIOUS_ATTEMPTS, H_REPLAYS, Delivery

if TYPE_CHECKING:
    from opentelemetry.context import Context

__all__ = [
    "HISTORY",
    "H_PREVIOUS_ATTEMPTS",
    "H_REPLAYS",
    "TRACEPARENT",
    "carry_history",
    "extract",
    "replace_context",
    "replay_attributes",
    "replay_history",
]

log = logging.getLogger("delayq.tracing")

TRACEPARENT = "traceparent"

HISTORY = (H_REPLAYS, H_PREVIOUS_ATTEMPTS)


def _count(value: object) -> int:
    """A count header's value: a positive int (pika's 64-bit ``long`` included), else 0."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return int(value)
    return 0


def replay_history(parked: Delivery) -> dict[str, int]:
    """The history headers of ``parked``'s replayed copy (its own history counted on)."""
    headers = parked.headers
    return {
        H_REPLAYS: _count(headers.get(H_REPLAYS)) + 1,
        H_PREVIOUS_ATTEMPTS: _count(headers.get(H_PREVIOUS_ATTEMPTS)) + parked.attempt,
    }


def replay_attributes(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The span attributes of a replayed message's history (none: never replayed)."""
    replays = _count(headers.get(H_REPLAYS))
    if not replays:
        return {}
    return {
        "delayq.replayed": True,
        "delayq.replay_count": replays,
        "delayq.previous_attempts": _count(headers.get(H_PREVIOUS_ATTEMPTS)),
    }


def carry_history(delivered: Mapping[str, Any], onward: MutableMapping[str, Any]) -> None:
    """Copy the replay history of a delivery's headers into its retry or dead letter's."""
    for key in HISTORY:
        if key in delivered and key not in onward:
            onward[key] = delivered[key]


class _HeaderGetter:
    """Reads a context from AMQP headers of any origin: str values, or UTF-8 bytes
    (a ``Getter`` by duck typing: opentelemetry is imported only when used)."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get(key)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return list(carrier)


_GETTER = _HeaderGetter()


def extract(delivery: Delivery) -> Context | None:
    """The context ``delivery`` carries, or ``None`` (none, or malformed)."""
    if TRACEPARENT not in delivery.headers:
        return None
    from opentelemetry import propagate

    try:
        return propagate.extract(delivery.headers, getter=cast(Any, _GETTER))
    except Exception as exc:  # a propagator must never fail a delivery
        log.debug("no trace context in %s: %r", delivery.message_id, exc)
        return None


def replace_context(headers: dict[str, Any], context: Context) -> None:
    """Put ``context`` into ``headers`` in place of the one they carried (every field
    of the global propagator's removed first, so no stale ``tracestate`` is left)."""
    from opentelemetry import propagate

    fresh: dict[str, Any] = {}
    propagate.inject(fresh, context=context)  # first: a failure leaves ``headers`` as they were
    for name in propagate.get_global_textmap().fields:
        headers.pop(name, None)
    headers.update(fresh)
