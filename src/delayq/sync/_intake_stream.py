"""The bridge's stream: deliveries published as they arrive, acked as their confirms come.

Two threads share a :class:`Feed`. The bridge's thread (the consuming
``BlockingConnection``, which pika lets no other thread touch) plans each delivery and
:meth:`Feed.put` s its message, keyed by delivery tag; an I/O thread runs one long-lived
pipelined stream over it (:func:`delayq.sync._pipeline.send_pipelined`, the same rounds
as ``Publisher.send_many``: the apply marker, exchange checks, returns, a lost publish
connection re-sent on a fresh one). Each outcome lands in the feed's inbox and wakes the
bridge's thread, which settles it through its :class:`Window`: the confirmed deliveries
at the front, in delivery order, acked with one ``multiple`` ack; a refused one nacked
back to the intake queue. Nothing is acked before its confirm, and a delivery is never
acked past one still in flight.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from delayq.errors import PublishError
from delayq.intake.relay import Forward, Incoming, Park
from delayq.message.envelope import OutgoingMessage
from delayq.sync._sending import Source

__all__ = ["Ended", "Feed", "Settled", "Window", "coalesce"]


@dataclass(frozen=True, slots=True)
class Ended:
    """How a feed's stream ended: ``error`` it raised (``None``: it returned, every
    message settled), ``left`` the tags it never settled, in delivery order."""

    error: BaseException | None
    left: list[int]


class Feed(Source):
    """A live :class:`~delayq.sync._sending.Source` fed by the consuming thread: empty is
    "nothing now" until :meth:`end`. Indices are delivery tags (a feed serves one
    consuming channel)."""

    def __init__(self, wake_consumer: Callable[[], None]) -> None:
        super().__init__(iter(()))
        self._lock = threading.Lock()
        self._queue: deque[tuple[int, OutgoingMessage]] = deque()
        self._unsettled: set[int] = set()
        self._wake_round: Callable[[], None] | None = None
        self._wake_consumer = wake_consumer
        self._inbox: list[tuple[int, PublishError | None]] = []
        self._ended: Ended | None = None
        self._aborting = threading.Event()
        self.closed = False
        """Takes no more messages (ended by the bridge, or its stream is over)."""

    # the consuming thread -------------------------------------------------------

    def put(self, tag: int, msg: OutgoingMessage) -> bool:
        """Queue ``msg`` for sending; ``False`` once the feed is closed."""
        with self._lock:
            if self.closed:
                return False
            self._unsettled.add(tag)
            self._queue.append((tag, msg))
            # A round pulls whenever a confirm comes in: only a message with nothing in
            # flight before it needs to wake the round (a wake crosses threads: costly).
            if len(self._unsettled) == 1 and self._wake_round is not None:
                self._wake_round()
        return True

    def take(self) -> tuple[list[tuple[int, PublishError | None]], Ended | None]:
        """The outcomes in since the last call, and how the stream ended once it did."""
        with self._lock:
            inbox, self._inbox = self._inbox, []
            return inbox, self._ended

    def end(self, *, drop: bool = False) -> None:
        """Take no more; the round sends what is queued (``drop``: not even that, the
        deliveries are back in the intake queue) and finishes once all is settled."""
        with self._lock:
            self.closed = True
            if drop:
                self._unsettled.difference_update(tag for tag, _msg in self._queue)
                self._queue.clear()
            if self._wake_round is not None:
                self._wake_round()

    def abort(self) -> None:
        """Stop the stream now, whatever it has in flight (the bridge stopped waiting:
        those deliveries go back to the intake queue with its channel): its round drops
        its connection, nothing more is sent, nor settled."""
        with self._lock:
            self.closed = self.aborted = self.exhausted = True
            self._queue.clear()
            self._unsettled.clear()
            wake = self._wake_round
        self._aborting.set()
        if wake is not None:
            try:
                wake()
            except Exception:  # its I/O loop is closing: the round ends all the same
                pass

    # the I/O thread -------------------------------------------------------------

    def pause(self, seconds: float) -> None:
        self._aborting.wait(seconds)

    def next(self) -> tuple[int, OutgoingMessage] | None:
        if self.aborted:
            return None
        if self.again:
            return self.again.popleft()
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            self.exhausted = self.closed
            return None

    def attach(self, wake: Callable[[], None] | None) -> None:
        with self._lock:
            self._wake_round = wake

    def settle(self, tag: int, _msg: OutgoingMessage, error: PublishError | None) -> None:
        """The round's ``settle``: hand the outcome to the consuming thread."""
        with self._lock:
            if tag not in self._unsettled:
                return  # dropped (its delivery went back to the queue), or settled
            self._unsettled.discard(tag)
            wake = not self._inbox
            self._inbox.append((tag, error))
        if wake:
            self._wake_consumer()

    def finish(self, error: BaseException | None) -> None:
        """The stream is over (``error``: what it raised): no more messages are taken."""
        with self._lock:
            self.closed = self.exhausted = True
            self._queue.clear()
            self._ended = Ended(error, sorted(self._unsettled))
            self._unsettled.clear()
        self._wake_consumer()


Plan = Forward | Park


class Window:
    """The deliveries sent but not yet settled, in delivery order (the consuming
    thread's alone): each waits for its outcome, and for every one before it."""

    def __init__(self) -> None:
        self._pending: OrderedDict[int, Plan] = OrderedDict()
        self._outcomes: dict[int, BaseException | None] = {}
        self._incoming: dict[int, Incoming] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, tag: int, plan: Plan, incoming: Incoming | None = None) -> None:
        self._pending[tag] = plan
        if incoming is not None:
            self._incoming[tag] = incoming

    def plan(self, tag: int) -> Plan:
        return self._pending[tag]

    def incoming(self, tag: int) -> Incoming | None:
        """The delivery ``tag`` as it came (to park it), when it was given."""
        return self._incoming.get(tag)

    def replan(self, tag: int, plan: Plan) -> None:
        """Send ``plan`` for ``tag`` instead, in the same place (its outcome to come)."""
        if tag in self._pending:
            self._pending[tag] = plan
            self._outcomes.pop(tag, None)

    def discard(self, tag: int) -> None:
        """Leave ``tag`` out (rejected: settled on the channel already)."""
        self._pending.pop(tag, None)
        self._outcomes.pop(tag, None)
        self._incoming.pop(tag, None)

    def settled(self, tag: int, error: BaseException | None) -> None:
        """``tag``'s outcome (``None``: confirmed); only the first one counts."""
        if tag in self._pending:
            self._outcomes.setdefault(tag, error)

    def ready(self) -> list[Settled]:
        """The settled deliveries at the front, in delivery order, taken out."""
        done: list[Settled] = []
        pending, outcomes = self._pending, self._outcomes
        while pending:
            tag = next(iter(pending))
            if tag not in outcomes:
                break
            self._incoming.pop(tag, None)
            done.append(Settled(tag, pending.pop(tag), outcomes.pop(tag)))
        return done


@dataclass(frozen=True, slots=True)
class Settled:
    """A delivery whose forward (or park) the broker confirmed (``error`` ``None``) or
    did not take."""

    tag: int
    plan: Plan
    error: BaseException | None


def coalesce(done: list[Settled]) -> list[tuple[str, int]]:
    """The acks and nacks settling ``done`` (in delivery order): ``("ack", tag)`` acks
    every delivery up to ``tag`` (``multiple``), one per run of confirmed ones;
    ``("nack", tag)`` puts one back on the queue.

    >>> coalesce([Settled(1, p, None), Settled(2, p, None), Settled(3, p, err)])  # doctest: +SKIP
    [('ack', 2), ('nack', 3)]
    """
    steps: list[tuple[str, int]] = []
    last: int | None = None
    for item in done:
        if item.error is None:
            last = item.tag
            continue
        if last is not None:
            steps.append(("ack", last))
            last = None
        steps.append(("nack", item.tag))
    if last is not None:
        steps.append(("ack", last))
    return steps
