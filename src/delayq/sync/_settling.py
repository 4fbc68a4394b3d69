"""How a pipelined round (:class:`delayq.sync._round.Round`) settles each message it
took: by its confirm (or nack), a return before it, or a failure of delayq's own on that
message alone. A message leaves ``outstanding`` only once its outcome is known, so none
is ever neither outstanding nor settled (a stream waiting for it would wait forever).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

from pika.spec import Basic

from delayq.errors import PublishError, PublishRejected
from delayq.links import Settle
from delayq.message import outcomes
from delayq.message.envelope import OutgoingMessage
from delayq.message.inflight import size_of
from delayq.sync._sending import Source

__all__ = ["WRITE_STRIKES", "Settling"]

log = logging.getLogger("delayq.publisher")

WRITE_STRIKES = 2
"""Connections a message's write may raise on before it is settled as unsendable: the
first drop is the connection's benefit of the doubt (the reconnect path), the second
says the message itself cannot be written."""


class Settling:
    """The settling half of a round (see the module)."""

    source: Source
    settle: Settle
    settle_error: BaseException | None
    outstanding: OrderedDict[int, tuple[int, OutgoingMessage]]
    """tag -> (stream index, message), in delivery-tag order"""
    outstanding_bytes: int
    returned: set[int]
    settled: int
    last_progress: float

    def _fill(self, _frame: Any = None) -> None:
        raise NotImplementedError

    def _drop(self, error: BaseException | None) -> None:
        raise NotImplementedError

    def _write_failed(self, tag: int, exc: Exception) -> None:
        """Writing ``tag``'s frames raised with the connection still open: what was
        written of them is unknown, so the connection is dropped (what it left unconfirmed
        goes to the next round). A message whose write raised on an earlier connection
        too is settled as unsendable instead of being sent again."""
        index, msg = self.outstanding[tag]
        strikes = self.source.strikes[index] = self.source.strikes.get(index, 0) + 1
        log.warning(
            "writing message %r raised %r (%d of %d): dropping the connection",
            msg.message_id,
            exc,
            strikes,
            WRITE_STRIKES,
        )
        if strikes >= WRITE_STRIKES:
            del self.outstanding[tag]
            self.outstanding_bytes -= size_of(msg)
            self.settled += 1
            self._report(index, msg, outcomes.unsendable(msg, exc, "writing"))
        self._drop(exc)

    def _on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        # Returns come before the confirm of the same message, in publish order. The id
        # alone is not enough: two messages of one id may be in flight, one routable.
        for index, msg in self.outstanding.values():  # in delivery-tag order
            if (
                index not in self.returned
                and msg.message_id == properties.message_id
                and msg.exchange == method.exchange
                and msg.routing_key == method.routing_key
            ):
                self.returned.add(index)
                return

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag = method.delivery_tag
        acked = isinstance(method, Basic.Ack)
        outstanding = self.outstanding
        if method.multiple:
            while outstanding and (first := next(iter(outstanding))) <= tag:
                self._settle(first, acked)
        elif tag in outstanding:
            self._settle(tag, acked)
        self.last_progress = time.monotonic()
        self._fill()

    def _settle(self, tag: int, acked: bool) -> None:
        """Settle outstanding ``tag``: taken out only once its outcome is known (a failure
        working it out leaves no message neither outstanding nor settled)."""
        index, msg = item = self.outstanding[tag]
        error = self._outcome(item, acked)
        del self.outstanding[tag]
        self.settled += 1
        self.outstanding_bytes -= size_of(msg)
        self._report(index, msg, error)

    def _outcome(self, item: tuple[int, OutgoingMessage], acked: bool) -> PublishError | None:
        index, msg = item
        if acked and index not in self.returned:
            return None
        try:
            if index in self.returned:
                self.returned.discard(index)
                return outcomes.unroutable(msg)
            return outcomes.rejected(msg)
        except Exception as exc:  # not taken by the broker, whatever the wording
            log.exception("delayq failed wording the outcome of message %r", msg.message_id)
            return PublishRejected(f"message {msg.message_id!r} not taken: {exc!r}")

    def _report(self, index: int, msg: OutgoingMessage, error: PublishError | None) -> None:
        self.source.strikes.pop(index, None)
        try:
            self.settle(index, msg, error)
        except BaseException as exc:
            self.settle_error = exc
            raise
