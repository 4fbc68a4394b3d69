"""Bulk scheduling, the pure part: one input row in, a message or a rejection out.

``delayq.spark.schedule`` runs this on every row of a DataFrame (and anyone can
run it on any table-like source). Nothing here does I/O:

* the message id is derived from the row's key (:func:`key_message_id`), so a
  row scheduled twice (a retried Spark task, a re-run job) is sent with the same
  id and idempotent consumers skip the duplicate;
* an absolute due time becomes a delay at build time (publish time); a due time
  in the past means immediate;
* a row that cannot be sent (no key, bad delay, longer than the ladder, body
  that cannot be encoded or is too large, a routing key that is malformed or
  that no binding of the topology matches) becomes a
  :class:`Rejection` naming the reason. It is reported, never dropped.

>>> from delayq import Topology
>>> jobs = [{"queue": "jobs", "bindings": ["job.*"]}]
>>> planner = BulkPlanner(Topology(ladder=["1s", "2s"], destinations=jobs), clock_ms=lambda: 0)
>>> planner.plan(Row(key="a", routing_key="job.a", delay="2s", body={"n": 1})).receipt.tier
'2s'
>>> planner.plan(Row(key="b", routing_key="job.a", delay="3s", body=None)).error
'DelayTooLong'
>>> planner.plan(Row(key="c", routing_key="jbo.a", delay="1s", body=None)).error
'UnboundRoutingKey'
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from delayq.durations import to_ms
from delayq.errors import InvalidBody, InvalidDelay, InvalidInput, InvalidMessageId
from delayq.message.envelope import OutgoingMessage, epoch_ms, parse_json_body
from delayq.message.factory import MessageFactory
from delayq.topology.model import Topology

__all__ = [
    "KEY_NAMESPACE",
    "NO_TIER",
    "BulkPlanner",
    "Rejection",
    "RejectionLimit",
    "Row",
    "describe_rejection",
    "key_message_id",
    "plain_body",
    "tier_of",
]

KEY_NAMESPACE = uuid.UUID("6f0e7c55-3c1a-5b8e-9d2e-64656c617971")
"""The UUID namespace of key-derived message ids (fixed: changing it would turn
every re-run into new messages)."""

NO_TIER = "-"
"""The tier of a rejection that never got one (bad delay, too long for the ladder)."""


def key_message_id(namespace: str, key: str) -> str:
    """The message id of ``key`` in a topology ``namespace``: uuid5, 32 hex digits.

    The same key always gives the same id, so scheduling a row again sends a
    duplicate that an idempotent consumer skips.

    >>> key_message_id("shop", "order-42") == key_message_id("shop", "order-42")
    True
    """
    return uuid.uuid5(KEY_NAMESPACE, f"{namespace}\x00{key}").hex


@dataclass(frozen=True, slots=True)
class Row:
    """One row to schedule. Exactly one of ``delay`` and ``due_at_ms`` is used.

    ``delay`` is a ``timedelta`` or a ``"15m"``-style string (a bare number has
    no unit and is rejected); ``due_at_ms`` an absolute time in epoch ms;
    ``due_text`` the due time as the input had it, for rejections.
    """

    key: object
    routing_key: object
    body: object = None
    delay: object = None
    due_at_ms: int | None = None
    due_text: str | None = None


@dataclass(frozen=True, slots=True)
class Rejection:
    """A row that was not published, and why."""

    key: str | None
    routing_key: str | None
    delay: str | None
    """The delay or due time as the input had it."""
    tier: str
    """The tier it would have waited in, or :data:`NO_TIER`."""
    error: str
    """The exception's class name (``InvalidDelay``, ``DelayTooLong``, ``PublishRejected``...)."""
    reason: str


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    return str(value)


def plain_body(value: object, *, json_text: bool = False) -> object:
    """A body from a table cell: mappings and rows as dicts, ``bytearray`` as bytes.

    With ``json_text`` a str cell is parsed as JSON (CSV files carry JSON bodies
    as text); invalid JSON raises :class:`~delayq.errors.InvalidBody`.
    """
    if json_text and isinstance(value, str):
        try:
            return parse_json_body(value)
        except json.JSONDecodeError as exc:
            hint = (
                "; its quotes are doubled, as in a CSV cell written the RFC 4180 way "
                "(Python's csv module, pandas, Excel) and read with Spark's default "
                "escape (a backslash): read the CSV with --option escape='\"' "
                "(spark.read.option(\"escape\", '\"'))"
                if '""' in value
                else ""
            )
            raise InvalidBody(f"body is not valid JSON ({exc.msg} at {exc.pos}){hint}") from exc
    if isinstance(value, bytearray):
        return bytes(value)
    as_dict = getattr(value, "asDict", None)  # a Spark Row (a struct column)
    if callable(as_dict):
        return as_dict(recursive=True)
    if isinstance(value, Mapping):
        return {k: plain_body(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_body(v) for v in value]
    return value


class BulkPlanner:
    """Builds each row's message (or rejection) against a topology; no I/O."""

    def __init__(
        self,
        topology: Topology,
        *,
        factory: MessageFactory | None = None,
        body_json: bool = False,
        clock_ms: Callable[[], int] = epoch_ms,
    ) -> None:
        self.topology = topology
        self._factory = factory or MessageFactory(topology, clock_ms=clock_ms)
        self._clock_ms = clock_ms
        self._body_json = body_json

    def plan(self, row: Row) -> OutgoingMessage | Rejection:
        """The message to send for ``row``, or why it cannot be sent."""
        given = row.due_text if row.due_text is not None else _text(row.delay)
        key = None if row.key is None else str(row.key)
        routing_key = None if row.routing_key is None else str(row.routing_key)
        try:
            if key is None or not key:
                raise InvalidMessageId("the row has no key (the message id is derived from it)")
            delay = self._delay(row)
            return self._factory.build(
                plain_body(row.body, json_text=self._body_json),
                routing_key if routing_key is not None else "",
                delay,
                message_id=key_message_id(self.topology.namespace, key),
            )
        except InvalidInput as exc:
            tier = NO_TIER
            try:
                tier = self._factory.router.wait(self._delay_ms(row)).shown
            except (InvalidInput, TypeError):
                pass
            return Rejection(key, routing_key, given, tier, type(exc).__name__, str(exc))

    def _delay(self, row: Row) -> object:
        if row.due_at_ms is not None:
            return timedelta(milliseconds=max(0, row.due_at_ms - self._clock_ms()))
        if row.due_text is not None:
            raise InvalidDelay(f"due time {row.due_text!r} is not a timestamp")
        if row.delay is None:
            raise InvalidDelay("the row has no delay")
        return row.delay

    def _delay_ms(self, row: Row) -> int:
        return to_ms(self._delay(row))

    def rejected(self, msg: OutgoingMessage, error: Exception, key: str | None) -> Rejection:
        """A message the broker did not take (nacked, unroutable), as a rejection."""
        receipt = msg.receipt
        return Rejection(
            key,
            receipt.routing_key,
            f"{receipt.delay_ms}ms",
            receipt.tier or "immediate",
            type(error).__name__,
            str(error),
        )


def tier_of(msg: OutgoingMessage) -> str:
    """A sent message's tier label (``"exact"`` through the cascade), ``"immediate"``
    for no delay."""
    return msg.receipt.tier or "immediate"


def describe_rejection(rejection: Rejection) -> dict[str, Any]:
    """A rejection as a flat dict (one line of the errors output)."""
    return {
        "key": rejection.key,
        "routing_key": rejection.routing_key,
        "delay": rejection.delay,
        "tier": rejection.tier,
        "error": rejection.error,
        "reason": rejection.reason,
    }


@dataclass(frozen=True, slots=True)
class RejectionLimit:
    """How many rejected rows a bulk job accepts before it counts as failed.

    ``count`` rows, or ``percent`` of the rows read, or any number when both
    are ``None`` (:meth:`parse` of ``None``). The default, 0, fails a job with
    any rejection: a job that reports success after rejecting every row is a
    silent failure.

    >>> RejectionLimit.parse(0).exceeded(rejected=1, rows=10)
    True
    >>> RejectionLimit.parse("10%").exceeded(rejected=1, rows=10)
    False
    >>> RejectionLimit.parse(None).exceeded(rejected=10, rows=10)
    False
    """

    count: int | None = 0
    percent: float | None = None

    @classmethod
    def parse(cls, value: object) -> RejectionLimit:
        """``None`` (any), a whole number of rows (``5``, ``"5"``), or a percentage (``"0.5%"``).

        A bare fraction (``0.01``) is refused: is it 1 % or 0.01 rows? Write ``"1%"``.
        """
        if value is None:
            return cls(count=None)
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise InvalidInput(f"max_rejected must not be negative, got {value}")
            return cls(count=value)
        if isinstance(value, str):
            text = value.strip()
            if text.endswith("%"):
                try:
                    percent = float(text[:-1])
                except ValueError:
                    percent = math.nan
                if not 0 <= percent <= 100:  # NaN fails too
                    raise InvalidInput(
                        f"max_rejected {value!r} is not a percentage from 0% to 100%"
                    )
                return cls(count=None, percent=percent)
            if text.isdigit():
                return cls(count=int(text))
        raise InvalidInput(
            f"max_rejected {value!r} is neither a whole number of rows (5) nor a "
            'percentage of the rows ("0.5%"); a bare fraction is ambiguous'
        )

    def exceeded(self, *, rejected: int, rows: int) -> bool:
        """Whether ``rejected`` of ``rows`` is more than this limit allows."""
        if self.count is not None:
            return rejected > self.count
        if self.percent is not None:
            return rejected * 100 > self.percent * rows
        return False

    def __str__(self) -> str:
        if self.count is not None:
            return str(self.count)
        return "any" if self.percent is None else f"{self.percent:g}%"
