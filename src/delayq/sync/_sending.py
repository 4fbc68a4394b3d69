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
from delayq.message.carried import pika_properties, unwritable
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
