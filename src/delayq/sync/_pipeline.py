"""Pipelined confirms for the sync adapter, on pika's SelectConnection.

pika's BlockingChannel waits for each confirm before the next publish (about
1,600 msg/s here). For a batch, delayq runs a SelectConnection's I/O loop in the
calling thread, keeps up to ``window`` messages unconfirmed, and re-sends what
was not confirmed on a fresh connection when one is lost (each connection's part:
:class:`delayq.sync._round.Round`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import pika

from delayq.errors import (
    AccessRefused,
    ConnectionFailed,
    PublishBatchError,
    PublishError,
    TopologyMissing,
)
from delayq.links import Settle
from delayq.message import outcomes
from delayq.message.envelope import OutgoingMessage
from delayq.message.limits import FRAME_MAX
from delayq.retrying import Reconnecting, pause_s
from delayq.sync._round import Round
from delayq.sync._sending import Source
from delayq.topology.marker import Gate

__all__ = ["publish_pipelined", "send_pipelined"]

log = logging.getLogger("delayq.publisher")


def send_pipelined(
    hosts: Sequence[pika.ConnectionParameters],
    messages: Iterable[OutgoingMessage] | Source,
    *,
    settle: Settle,
    window: int,
    properties: Callable[[OutgoingMessage], pika.BasicProperties],
    attempts: int,
    backoff_s: float,
    url_for_errors: str,
    explain: Callable[[BaseException], str | None] = lambda _exc: None,
    gate: Gate | None = None,
    max_bytes: int | None = None,
    reconnecting: Reconnecting | None = None,
    frame_max: int = FRAME_MAX,
) -> None:
    """Stream ``messages`` with up to ``window`` unconfirmed; ``settle`` hears each fate once.

    ``max_bytes`` bounds what is unconfirmed in bytes too (body plus an allowance per
    message: :func:`delayq.message.inflight.size_of`).

    ``messages`` is pulled lazily (a generator of millions is fine; a
    :class:`~delayq.sync._sending.Source` may say "nothing now" and wake the round). A lost
    connection costs an attempt only when its round confirmed nothing, so a long
    stream survives several drops; what was in flight is sent again (same
    message ids: idempotent consumers skip the duplicates). Once a connection has
    been up (``reconnecting.up``), the rounds go on until nothing was confirmed for
    ``reconnecting.within_s`` seconds (a broker restart is ridden through); before,
    ``attempts`` rounds (:class:`delayq.retrying.Reconnecting`). When they are
    spent, every message not yet settled is settled: ``PublishUnconfirmed`` if it
    was written to a connection (its fate unknown), ``PublishNotSent`` if never; if
    nothing was ever written to a socket, :class:`~delayq.errors.ConnectionFailed`
    is raised instead. ``explain`` names a failure that no retry can mend (TLS):
    nothing sent yet, it raises at once. Each round after a lost one goes to the
    next of ``hosts`` (the nodes of a cluster); an attempt is a pass over all of
    them. :class:`~delayq.errors.TopologyMissing` and
    :class:`~delayq.errors.AccessRefused` raise at once; so does
    :class:`~delayq.errors.TopologyNotApplied` when a round's connection finds no
    apply marker of ``gate`` (checked before its first publish). A message delayq fails
    on itself (encoding it, or writing it on two connections) is settled alone with
    :class:`~delayq.errors.UnsendableMessage`. A source aborted
    (:attr:`~delayq.sync._sending.Source.aborted`) ends the stream at once: its round's
    connection dropped, nothing more sent or settled.
    """
    source = messages if isinstance(messages, Source) else Source(enumerate(messages))
    if reconnecting is None:
        reconnecting = Reconnecting(attempts, backoff_s, None)
    quiet_since = time.monotonic()
    barren_rounds = 0
    last: BaseException | None = None
    handed_over = False  # did any round write a message to a socket?
    rounds = 0
    while not source.aborted:
        rnd = Round(
            hosts[rounds % len(hosts)],
            source,
            window,
            properties,
            settle,
            gate,
            max_bytes,
            frame_max,
        )
        rounds += 1
        rnd.run()
        if source.aborted:
            return  # its owner stopped waiting: nothing more is sent, nor settled
        reconnecting.up = reconnecting.up or rnd.opened
        handed_over = handed_over or rnd.next_tag > 1
        if isinstance(rnd.fatal, (TopologyMissing, AccessRefused)):
            raise rnd.fatal
        source.push_front(rnd.outstanding.values())
        if source.done:
            return
        last = rnd.fatal or rnd.lost
        if isinstance(last, pika.exceptions.ConnectionBlockedTimeout):
            # The broker blocks publishers (a memory or disk alarm): every connection is
            # blocked alike, so sending again cannot help; each message hears so now.
            waited = float(hosts[0].blocked_connection_timeout or 0)
            written, source.again = source.again, deque()
            for index, msg in [*written, *source.drain()]:
                settle(index, msg, outcomes.blocked(msg, waited, url_for_errors))
            return
        reason = explain(last) if last is not None and not handed_over else None
        if reason is not None:
            raise ConnectionFailed(reason) from last
        if rnd.settled:
            barren_rounds, quiet_since = 0, time.monotonic()
        else:
            barren_rounds += 1
        if reconnecting.gives_up(barren_rounds, attempts * len(hosts), quiet_since):
            break
        if rnd.opened:
            log.warning(
                "batch connection ended (%s) with %d messages unconfirmed; sending them again",
                type(last).__name__ if last else "closed",
                len(source.again),
            )
        if barren_rounds and barren_rounds % len(hosts) == 0:  # after a pass over the hosts
            source.pause(pause_s(barren_rounds // len(hosts), backoff_s))
    if source.aborted:
        return
    spent = reconnecting.spent(-(-barren_rounds // len(hosts)))
    if not handed_over:
        raise ConnectionFailed(
            f"cannot connect to the broker at {url_for_errors} {spent} "
            f"({type(last).__name__}); nothing of the batch was sent"
        ) from last
    written, source.again = source.again, deque()  # each was on a connection: fate unknown
    for index, msg in written:
        settle(index, msg, outcomes.unconfirmed(msg, spent, url_for_errors, last))
    for index, msg in source.drain():
        settle(index, msg, outcomes.not_sent(msg, spent, url_for_errors, last))


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
    gate: Gate | None = None,
    reconnecting: Reconnecting | None = None,
    frame_max: int = FRAME_MAX,
) -> None:
    """Publish ``messages`` with up to ``window`` unconfirmed; raise for any not confirmed.

    :func:`send_pipelined` over a list, raising
    :class:`~delayq.errors.PublishBatchError` naming each failed message.
    """
    failures: dict[int, PublishError] = {}

    def settle(index: int, _msg: OutgoingMessage, error: PublishError | None) -> None:
        if error is not None:
            failures[index] = error

    send_pipelined(
        hosts,
        messages,
        settle=settle,
        window=window,
        properties=properties,
        attempts=attempts,
        backoff_s=backoff_s,
        url_for_errors=url_for_errors,
        explain=explain,
        gate=gate,
        reconnecting=reconnecting,
        frame_max=frame_max,
    )
    if failures:
        receipts = [None if i in failures else messages[i].receipt for i in range(len(messages))]
        raise PublishBatchError(receipts, failures)
