"""How ``delayq dlq|unrouted list|show`` print parked messages: tables, details, JSON.

Pure code over :class:`~delayq.ops.parked.ParkedMessage`. Header values are shown
decoded (pika's ``1795460784958L`` longs as numbers, UTF-8 bytes as text,
``datetime`` as ISO 8601), and headers whose name looks sensitive are masked
unless the caller reveals them: a parked message keeps every header its
publisher set, an ``authorization`` or ``cookie`` header included.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

from delayq.consume.delivery import H_ERROR_TRACE
from delayq.durations import format_ms
from delayq.ops.parked import ParkedMessage
from delayq.tables import Column, Table
from delayq.wording import counted

__all__ = [
    "MASK",
    "SENSITIVE_HEADERS",
    "is_sensitive",
    "list_table",
    "message_detail",
    "message_summary",
    "plain",
    "render_detail",
    "render_list",
    "sensitive_patterns",
]

SENSITIVE_HEADERS = (
    "authorization",
    "cookie",
    "api-key",
    "apikey",
    "password",
    "passwd",
    "secret",
    "token",
    "credential",
    "private-key",
    "session",
)
"""Header names containing one of these (case-insensitive, ``_`` read as ``-``) are
masked: ``Authorization``, ``Set-Cookie``, ``X-Api-Key``, ``db_password``,
``x-auth-token``, ``client-secret`` all are. A substring rule, not an exact list,
because sensitive headers come with every prefix and spelling; masking one too many
costs a ``--reveal``."""

MASK = "***"
BODY_SHOWN_BYTES = 4096


def _normal(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def sensitive_patterns(extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The default patterns and ``extra`` ones (``--mask-header``, ``$DELAYQ_MASK_HEADERS``)."""
    return (*SENSITIVE_HEADERS, *(_normal(p) for p in extra if p.strip()))


def is_sensitive(name: str, patterns: Iterable[str] = SENSITIVE_HEADERS) -> bool:
    normal = _normal(name)
    return any(pattern in normal for pattern in patterns)


def plain(value: Any) -> Any:
    """``value`` as plain JSON data: numbers, text, lists, objects.

    Bytes become text when they are UTF-8, else ``"base64:..."``.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)  # pika's long prints as 123L
    if isinstance(value, float):
        return value
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw).decode("ascii")
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(plain(k)): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return str(value)


def _iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


def message_summary(
    parked: ParkedMessage, now_ms: int, reason: str | None = None
) -> dict[str, Any]:
    """One row of ``list``: id, the original routing key, attempts, age, reason, error."""
    age = parked.age_ms(now_ms)
    at = parked.parked_at_ms()
    return {
        "message_id": parked.message_id,
        "routing_key": parked.delivery.origin_routing_key,
        "attempts": parked.attempts,
        "parked_at": None if at is None else _iso_ms(at),
        "age_ms": age,
        "reason": reason or parked.reason,
        "error": parked.error,
    }


def message_detail(
    parked: ParkedMessage,
    now_ms: int,
    *,
    reason: str | None = None,
    patterns: Iterable[str] = SENSITIVE_HEADERS,
    reveal: bool = False,
) -> dict[str, Any]:
    """Everything ``show`` prints, sensitive header values masked unless ``reveal``."""
    delivery = parked.delivery
    patterns = tuple(patterns)
    headers: dict[str, Any] = {}
    masked: list[str] = []
    for name, value in sorted(delivery.headers.items()):
        if not reveal and is_sensitive(name, patterns):
            headers[name] = MASK
            masked.append(name)
        else:
            headers[name] = plain(value)
    body: dict[str, Any]
    try:
        body = {"body": delivery.body.decode("utf-8"), "body_base64": None}
    except UnicodeDecodeError:
        body = {"body": None, "body_base64": base64.b64encode(delivery.body).decode("ascii")}
    return {
        **message_summary(parked, now_ms, reason),
        "queue": delivery.queue,
        "parked_routing_key": delivery.routing_key,
        "content_type": delivery.content_type,
        "headers": headers,
        "masked_headers": masked,
        "body_bytes": len(delivery.body),
        **body,
    }


def list_table(rows: list[dict[str, Any]], limit: int) -> Table:
    """The ``list`` table (rows from :func:`message_summary`)."""
    table = Table(
        [
            Column("message id", max_width=34),
            Column("routing key", max_width=30),
            Column("attempts", right=True),
            Column("age", right=True),
            Column("reason", max_width=40),
            Column("error", max_width=80),
        ],
        after=[f"{len(rows)} shown (at most {limit})"],
    )
    for r in rows:
        age = r["age_ms"]
        shown_age = format_ms(age // 1000 * 1000) if age is not None else "?"
        table.add(
            r["message_id"],
            r["routing_key"],
            str(r["attempts"]),
            shown_age,
            r["reason"],
            r["error"],
        )
    return table


def render_list(rows: list[dict[str, Any]], limit: int) -> str:
    """:func:`list_table` as plain text."""
    return list_table(rows, limit).plain()


def _printable(line: str) -> str:
    """``line``, or its JSON string form if it holds control characters (a NUL, an
    escape sequence) that would garble the terminal."""
    return line if line.isprintable() else json.dumps(line, ensure_ascii=False)


def _header_value(name: str, value: Any) -> str:
    if isinstance(value, str):
        if "\n" in value:
            lines = value.expandtabs(4).splitlines()
            return "\n" + "\n".join(f"                {_printable(line)}" for line in lines)
        return _printable(value)
    if isinstance(value, int) and not isinstance(value, bool) and name.endswith("-at"):
        return f"{value} ({_iso_ms(value)})"
    return json.dumps(value, ensure_ascii=False)


def render_detail(detail: dict[str, Any]) -> str:
    """``show`` as text (``detail`` from :func:`message_detail`)."""
    out = [
        f"message_id    {detail['message_id']}",
        f"routing_key   {detail['routing_key']}",
        f"parked in     {detail['queue']} (routing key {detail['parked_routing_key']})",
        f"reason        {detail['reason']}",
        f"error         {detail['error']}",
        f"attempts      {detail['attempts']}",
        f"parked_at     {detail['parked_at'] or '?'}",
        f"content_type  {detail['content_type'] or '-'}",
    ]
    for name, value in detail["headers"].items():
        if name in detail["masked_headers"]:
            out.append(f"header        {name} = {MASK} (masked; --reveal shows it)")
        elif name != H_ERROR_TRACE:
            out.append(f"header        {name} = {_header_value(name, value)}")
    body, size = detail["body"], detail["body_bytes"]
    if body is None:
        shown = detail["body_base64"][: BODY_SHOWN_BYTES * 4 // 3]
        out.append(f"body          ({counted(size, 'byte')}, not UTF-8; base64) {shown}")
    else:
        cut = body[:BODY_SHOWN_BYTES]
        whole = f" ... ({counted(size, 'byte')} in all; --json prints it whole)"
        more = whole if cut != body else ""
        out.append(f"body          {_header_value('body', cut).lstrip()}{more}")
    trace = detail["headers"].get(H_ERROR_TRACE)
    if isinstance(trace, str) and H_ERROR_TRACE not in detail["masked_headers"]:
        out.append(f"trace         {_header_value(H_ERROR_TRACE, trace).lstrip()}")
    return "\n".join(out) + "\n"
