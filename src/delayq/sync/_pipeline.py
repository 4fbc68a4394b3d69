"""Pipelined confirms for the sync adapter, on pika's SelectConnection.

pika's BlockingChannel waits for each confirm before the next publish (about
1,600 msg/s here). For a batch, delayq runs a SelectConnection's I/O loop in the
calling thread, keeps up to ``window`` messages unconfirmed, and re-sends what
was not confirmed on a fresh connection when one is lost.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions as pex
from pika.spec import Basic

from delayq import outcomes
from delayq.conflicts import missing_from_reply, refused_from_reply
from delayq.envelope import OutgoingMessage
from delayq.errors import (
    AccessRefused,
    ConnectionFailed,
    PublishBatchError,
    PublishError,
    PublishRejected,
    TopologyMissing,
)

__all__ = ["publish_pipelined"]

log = logging.getLogger("delayq.publisher")

CONFIRM_IDLE_TIMEOUT_S = 60.0
"""A round with messages unconfirmed and no confirm for this long is abandoned."""


class _Round:
    """One connection's worth of publishing; what it could not finish goes to the next."""

    def __init__(
        self,
        params: pika.ConnectionParameters,
        messages: Sequence[OutgoingMessage],
        todo: list[int],
        window: int,
        properties: Callable[[OutgoingMessage], pika.BasicProperties],
        results: dict[int, PublishError | None],
    ) -> None:
        self.params = params
        self.messages = messages
        self.pending: deque[int] = deque(todo)
        self.window = window
        self.properties = properties
        self.results = results
        self.outstanding: OrderedDict[int, int] = OrderedDict()  # tag -> message index
        self.returned: set[int] = set()
        self.next_tag = 1
        self.fatal: BaseException | None = None
        self.lost: BaseException | None = None
        self.channel: Any = None
        self.connection: pika.SelectConnection | None = None
        self.last_progress = time.monotonic()
        self.exchanges = sorted({messages[i].exchange for i in todo})

    def run(self) -> None:
        self.connection = pika.SelectConnection(
            self.params,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
        )
        self.connection.ioloop.start()

    # connection and channel ---------------------------------------------------

    def _on_open(self, connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=self._on_channel)
        self._watchdog()

    def _on_open_error(self, _conn: Any, error: BaseException | str) -> None:
        self.lost = error if isinstance(error, BaseException) else pex.AMQPConnectionError(error)
        assert self.connection is not None
        self.connection.ioloop.stop()

    def _on_closed(self, _conn: Any, reason: BaseException) -> None:
        if self.outstanding or self.pending:
            self.lost = self.lost or reason
        assert self.connection is not None
        self.connection.ioloop.stop()

    def _on_channel(self, channel: Any) -> None:
        self.channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._check_exchanges)

    def _on_channel_closed(self, _channel: Any, reason: BaseException) -> None:
        if isinstance(reason, pex.ChannelClosedByBroker):
            text = reason.reply_text or ""
            self.fatal = missing_from_reply(text) or refused_from_reply(text) or PublishRejected(
                f"the broker closed the channel: ({reason.reply_code}) {reason.reply_text}"
            )
        self._finish()

    def _check_exchanges(self, _frame: Any = None) -> None:
        # A publish to a missing exchange closes the channel and leaves the fate of
        # every in-flight message unknown, so check the few exchanges first.
        if self.exchanges:
            name = self.exchanges.pop()
            self.channel.exchange_declare(name, passive=True, callback=self._check_exchanges)
        else:
            self._fill()

    def _watchdog(self) -> None:
        assert self.connection is not None
        if self.connection.is_closed:
            return
        if self.outstanding and time.monotonic() - self.last_progress > CONFIRM_IDLE_TIMEOUT_S:
            self.lost = TimeoutError(f"no confirm for {CONFIRM_IDLE_TIMEOUT_S:.0f} s")
            self._finish()
            return
        self.connection.ioloop.call_later(1.0, self._watchdog)

    def _finish(self) -> None:
        assert self.connection is not None
        if self.connection.is_open:
            self.connection.close()
        elif not self.connection.is_closing:
            self.connection.ioloop.stop()

    # publishing ---------------------------------------------------------------

    def _fill(self) -> None:
        channel = self.channel
        while self.pending and len(self.outstanding) < self.window:
            index = self.pending.popleft()
            msg = self.messages[index]
            self.outstanding[self.next_tag] = index
            self.next_tag += 1
            channel.basic_publish(
                msg.exchange, msg.routing_key, msg.body, self.properties(msg), mandatory=True
            )
        if not self.pending and not self.outstanding:
            self._finish()

    def _on_return(self, _channel: Any, _method: Any, properties: Any, _body: bytes) -> None:
        # Returns come before the confirm of the same message, in publish order.
        for index in self.outstanding.values():  # in delivery-tag order
            if (
                index not in self.returned
                and self.messages[index].message_id == properties.message_id
            ):
                self.returned.add(index)
                return

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag = method.delivery_tag
        acked = isinstance(method, Basic.Ack)
        if method.multiple:
            while self.outstanding and next(iter(self.outstanding)) <= tag:
                self._settle(self.outstanding.popitem(last=False)[1], acked)
        else:
            index = self.outstanding.pop(tag, None)
            if index is not None:
                self._settle(index, acked)
        self.last_progress = time.monotonic()
        self._fill()

    def _settle(self, index: int, acked: bool) -> None:
        msg = self.messages[index]
        if index in self.returned:
            self.results[index] = outcomes.unroutable(msg)
        elif acked:
            self.results[index] = None
        else:
            self.results[index] = outcomes.rejected(msg)


def publish_pipelined(
    hosts: Sequence[pika.ConnectionParameters],
    messages: Sequence[OutgoingMessage],
    *,
    window: int,
    properties: Callable[[OutgoingMessage], pika.BasicProperties],
    attempts: int,
    backoff_s: float,
    url_for_errors: str,
    explain: Callable[[BaseException], str | None] = lambda _exc: None,
) -> None:
    """Publish ``messages`` with up to ``window`` unconfirmed; raise for any not confirmed.

    A lost connection costs an attempt only when its round confirmed nothing, so
    a long batch survives several drops; what was in flight is sent again (same
    message ids: idempotent consumers skip the duplicates). ``explain`` names a
    failure that no retry can mend (TLS): nothing sent yet, it raises at once.
    Each round after a lost one goes to the next of ``hosts`` (the nodes of a
    cluster); an attempt is a pass over all of them.
    """
    results: dict[int, PublishError | None] = {}
    todo = list(range(len(messages)))
    barren_rounds = 0
    last: BaseException | None = None
    handed_over = False  # did any round write a message to a socket?
    rounds = 0
    while todo:
        before = len(results)
        rnd = _Round(hosts[rounds % len(hosts)], messages, todo, window, properties, results)
        rounds += 1
        rnd.run()
        handed_over = handed_over or rnd.next_tag > 1
        if isinstance(rnd.fatal, (TopologyMissing, AccessRefused)):
            raise rnd.fatal
        todo = [i for i in todo if i not in results]
        if not todo:
            break
        last = rnd.fatal or rnd.lost
        reason = explain(last) if last is not None and not handed_over else None
        if reason is not None:
            raise ConnectionFailed(reason) from last
        barren_rounds = 0 if len(results) > before else barren_rounds + 1
        if barren_rounds >= attempts * len(hosts):
            break
        log.warning(
            "batch connection ended (%s) with %d messages unconfirmed; sending them again",
            type(last).__name__ if last else "closed",
            len(todo),
        )
        if barren_rounds % len(hosts) == 0:  # back off after a whole pass over the hosts
            time.sleep(backoff_s * 2 ** max(0, barren_rounds // len(hosts) - 1))
    if todo and not handed_over:
        raise ConnectionFailed(
            f"cannot connect to the broker at {url_for_errors} after {attempts} attempts "
            f"({type(last).__name__}); nothing of the batch was sent"
        ) from last
    for index in todo:
        results[index] = outcomes.unconfirmed(messages[index], attempts, url_for_errors, last)
    failures = {i: e for i, e in results.items() if e is not None}
    if failures:
        receipts = [None if i in failures else messages[i].receipt for i in range(len(messages))]
        raise PublishBatchError(receipts, failures)
