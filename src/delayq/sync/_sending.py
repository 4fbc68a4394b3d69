"""What a pipelined round sends: its source (first what a lost round left unconfirmed,
then the stream), a message's pika properties, and the check of each content header
against the connection's negotiated ``frame_max``."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pika

from delayq.message import outcomes
from delayq.message.envelope import OutgoingMessage

__all__ = [
    "CONTENT_HEADER_FIXED_BYTES",
    "Source",
    "check_header_frame",
    "pika_properties",
    "unwritable",
]

CONTENT_HEADER_FIXED_BYTES = 20
"""A content header frame's bytes besides the encoded properties: the frame's type,
channel, size and end (8), class, weight and body size (12)."""


def pika_properties(msg: OutgoingMessage) -> pika.BasicProperties:
    """``msg``'s AMQP properties for pika (those an intake's message carries too)."""
    if msg.properties:
        return pika.BasicProperties(
            **{
                "content_type": msg.content_type,
                "delivery_mode": 2,
                "message_id": msg.message_id,
                "timestamp": msg.timestamp_s,
                **msg.properties,
                "headers": msg.headers,
            }
        )
    return pika.BasicProperties(
        content_type=msg.content_type,
        delivery_mode=2,
        message_id=msg.message_id,
        timestamp=msg.timestamp_s,
        headers=msg.headers,
    )


_INT64_MIN, _INT64_END = -(2**63), 2**63


def unwritable(msg: OutgoingMessage) -> str | None:
    """Why pika cannot write ``msg``'s properties, or ``None``: pika reads some values it
    cannot write again (a float of 1e300 read as a 997-digit integer, a header name that
    is not UTF-8, tables nested past what it writes). Checked by encoding only when the
    headers hold more than strings, bytes, booleans and 64-bit integers."""
    why = _names_problem(msg.headers)
    if why is not None:
        return why
    for value in msg.headers.values():
        if isinstance(value, (str, bytes, bool)) or value is None:
            continue
        if isinstance(value, int) and _INT64_MIN <= value < _INT64_END:
            continue
        try:
            pika_properties(msg).encode()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None
    return None


NAME_NOT_TEXT = "a header name is not UTF-8 text"
MAX_DEPTH = 100
"""Tables and arrays nested deeper than this are not written again (pika's encoder
recurses once a level; Python's stack is the limit)."""
TOO_DEEP = f"the headers nest tables or arrays more than {MAX_DEPTH} levels deep"


def _names_problem(table: dict[Any, Any], depth: int = 0) -> str | None:
    """Why ``table`` (or a table inside it) cannot be written: a key that is not a str
    (pika reads a name that is not UTF-8 as bytes, which delayq's stream cannot write),
    or nesting past :data:`MAX_DEPTH`; ``None`` when neither."""
    if depth > MAX_DEPTH:
        return TOO_DEEP
    for key, value in table.items():
        if type(key) is not str:
            return NAME_NOT_TEXT
        if type(value) not in _FLAT:
            why = _nested_problem(value, depth + 1)
            if why is not None:
                return why
    return None


_FLAT = frozenset({str, int, bytes, bool, float, type(None)})
"""Value types with no names inside (the common ones: checked without a call)."""


def _nested_problem(value: object, depth: int) -> str | None:
    if isinstance(value, dict):
        return _names_problem(value, depth)
    if isinstance(value, (list, tuple)):
        if depth > MAX_DEPTH:
            return TOO_DEEP
        for item in value:
            why = _nested_problem(item, depth + 1)
            if why is not None:
                return why
    return None


def check_header_frame(
    msg: OutgoingMessage, properties: pika.BasicProperties, connection: Any, checked_max: int
) -> None:
    """Raise :class:`~delayq.errors.HeaderFrameTooLarge` if ``msg``'s content header does
    not fit in one frame of the ``frame_max`` ``connection`` negotiated (pika's blocking or
    select connection). Free when that is at least ``checked_max``, the topology's
    ``limits.frame_max``, which the message was checked against when built."""
    params = getattr(connection, "_impl", connection).params
    frame_max = params.frame_max
    if frame_max >= checked_max:
        return
    size = CONTENT_HEADER_FIXED_BYTES + sum(len(part) for part in properties.encode())
    if size > frame_max:
        raise outcomes.header_frame_too_large(msg, size, frame_max)


class Source:
    """What is left to send: first what a lost round left unconfirmed, then the stream.

    Messages are pulled from the stream only as the window frees up, so a stream
    of millions holds at most ``window`` messages in memory.
    """

    def __init__(self, stream: Iterator[tuple[int, OutgoingMessage]]) -> None:
        self.again: deque[tuple[int, OutgoingMessage]] = deque()
        self._stream = stream
        self.exhausted = False
        self.aborted = False
        """The stream is abandoned: its round drops its connection and nothing more is
        sent, nor settled (a live source's owner stopped waiting: :class:`delayq.sync.
        _intake_stream.Feed`)."""
        self.strikes: dict[int, int] = {}
        """How many connections writing a message raised on, by index: a write that
        raises drops its connection (its state is unknown); one that raises again on a
        fresh one is the message's own failure (:mod:`delayq.sync._round`)."""

    def next(self) -> tuple[int, OutgoingMessage] | None:
        if self.again:
            return self.again.popleft()
        if self.exhausted:
            return None
        item = next(self._stream, None)
        if item is None:
            self.exhausted = True
        return item

    def attach(self, wake: Callable[[], None] | None) -> None:
        """A round's way to be woken when the source has more to send (``None``: the
        round is over). A stream never needs it; a live source
        (:class:`delayq.sync._shared.LiveSource`) says "nothing now" and wakes the round."""

    def pause(self, seconds: float) -> None:
        """Wait between rounds (a live source cuts it short when aborted)."""
        time.sleep(seconds)

    def push_front(self, items: Iterable[tuple[int, OutgoingMessage]]) -> None:
        self.again.extendleft(reversed(list(items)))

    @property
    def done(self) -> bool:
        return self.aborted or (self.exhausted and not self.again)

    def drain(self) -> Iterator[tuple[int, OutgoingMessage]]:
        while (item := self.next()) is not None:
            yield item
