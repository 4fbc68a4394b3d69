"""Publisher confirms by delivery tag, for the frame link's wire: no I/O, no future.

A confirming channel numbers its publishes 1, 2, 3, ...; the broker acks or nacks
each (``multiple``: all up to a tag), and sends a ``Basic.Return`` for a mandatory
publish no queue took, before that publish's confirm. Each publish has a *sink*
(a batch, or a single send's future) told its fate once: :meth:`Sink.settled`, or
:meth:`Sink.failed` when the channel or connection closed first (its fate unknown).

>>> class Log:
...     def __init__(self): self.seen = []
...     def settled(self, token, acked, returned): self.seen.append((token, acked, returned))
...     def failed(self, token, exc): self.seen.append((token, "failed"))
>>> log, book = Log(), Confirms()
>>> [book.add(log, n, ("ex", "key", f"id-{n}")) for n in range(4)]
[1, 2, 3, 4]
>>> book.returned(("ex", "key", "id-1")); book.confirm(3, multiple=True, acked=True)
>>> book.confirm(4, multiple=False, acked=False); log.seen
[(0, True, False), (1, True, True), (2, True, False), (3, False, False)]
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Confirms", "Route", "Sink"]

Route = tuple[str, str, str]
"""A publish as a ``Basic.Return`` names it: exchange, routing key, message id."""


class Sink(Protocol):
    """Where a publish's fate goes; ``token`` is the sink's own number for the message."""

    def settled(self, token: int, acked: bool, returned: bool) -> None: ...

    def failed(self, token: int, exc: Exception) -> None:
        """The publish's fate is unknown: its channel or connection closed first."""
        ...


class Confirms:
    """The unconfirmed publishes of one confirming channel, by delivery tag."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[Sink, int, Route]] = {}
        self._returned: set[int] = set()
        self._last_returned = 0
        self._next = 1
        self._low = 1  # no tag below it is pending

    def add(self, sink: Sink, token: int, route: Route) -> int:
        """Record the next publish; returns its delivery tag."""
        tag = self._next
        self._next = tag + 1
        self.pending[tag] = (sink, token, route)
        return tag

    def returned(self, route: Route) -> None:
        """A ``Basic.Return`` naming ``route``. Returns come in publish order, each before
        its message's confirm, while messages published earlier may still wait for theirs:
        the returned one is the first unconfirmed message with this route after the last
        one returned (two in flight with the same id, exchange and key are the same message
        twice)."""
        pending = self.pending
        for tag in range(max(self._low, self._last_returned + 1), self._next):
            entry = pending.get(tag)
            if entry is not None and entry[2] == route:
                self._returned.add(tag)
                self._last_returned = tag
                return

    def confirm(self, tag: int, multiple: bool, acked: bool) -> None:
        """A ``Basic.Ack`` (``acked``) or ``Basic.Nack`` up to ``tag``."""
        pending, returned = self.pending, self._returned
        if multiple:
            for one in range(self._low, tag + 1):
                entry = pending.pop(one, None)
                if entry is not None:
                    was_returned = bool(returned) and _take(returned, one)
                    entry[0].settled(entry[1], acked, was_returned)
            self._low = max(self._low, tag + 1)
            return
        entry = pending.pop(tag, None)
        if entry is not None:
            entry[0].settled(entry[1], acked, bool(returned) and _take(returned, tag))
        while self._low < self._next and self._low not in pending:
            self._low += 1

    def fail_all(self, exc: Exception) -> None:
        """The channel or connection closed: every unconfirmed publish's fate is unknown."""
        pending, self.pending = self.pending, {}
        self._returned.clear()
        self._low = self._next
        for sink, token, _ in pending.values():
            sink.failed(token, exc)


def _take(returned: set[int], tag: int) -> bool:
    if tag in returned:
        returned.discard(tag)
        return True
    return False
