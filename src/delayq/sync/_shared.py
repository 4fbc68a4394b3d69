"""One pipelined connection shared by the threads that call ``Publisher.publish`` at once.

A caller that finds the publisher's blocking channel busy (another thread is waiting
for a confirm there) hands its message to a :class:`SharedSender` and waits for its own
outcome. The sender's I/O thread runs one long-lived pipelined stream
(:func:`delayq.sync._pipeline.send_pipelined`) whose source, a :class:`LiveSource`, is
the queue of those messages: it says "nothing now" without ending the stream, and a
caller's message wakes the round (pika's ``add_callback_threadsafe``). Each message is
settled by delivery tag with the error a single publish raises; what a lost connection
left unconfirmed is sent again on the next, within the link's ``reconnect_within``.

The stream ends, and its thread with it, when the publisher closes (what was queued is
still sent and each caller hears its outcome) or when its connection is lost with
nothing queued (the next caller starts another).
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from delayq.errors import PublishError, TopologyMissing, TopologyNotApplied
from delayq.links import Link
from delayq.message.envelope import OutgoingMessage
from delayq.sync._sending import Source

__all__ = ["Baton", "LiveLink", "LiveSource", "SharedSender", "ThreadSafeSends", "Waiter"]


class Waiter:
    """One caller's wait for its message's outcome (a lock released once settled, by
    ``on_settled`` when given: a :class:`Baton`)."""

    __slots__ = ("_done", "_on_settled", "abandoned", "error", "settled")

    def __init__(self, on_settled: Callable[[Waiter], None] | None = None) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self._on_settled = on_settled
        self.settled = False
        self.abandoned = False
        """Its caller stopped waiting (interrupted): nobody to wake."""
        self.error: BaseException | None = None

    def settle(self, error: BaseException | None) -> None:
        """Give the outcome (``None``: confirmed); only the first one counts."""
        if self.settled:
            return
        self.error, self.settled = error, True
        if self._on_settled is None:
            self._done.release()
        else:
            self._on_settled(self)

    def wake(self) -> None:
        self._done.release()

    def block(self, blocking: bool = True) -> bool:
        """Wait until woken (``blocking=False``: whether it was)."""
        return self._done.acquire(blocking)

    def wait(self) -> None:
        """Block until settled; raise the error if it was not confirmed."""
        self.block()
        self.outcome()

    def outcome(self) -> None:
        if self.error is not None:
            raise self.error


class Baton:
    """Wakes settled callers one at a time: each woken caller wakes the next as it
    leaves. Waking all of a multiple confirm's callers at once would have them fight
    the I/O thread and one another for the GIL, a few thread switches per message;
    in turn, about one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: deque[Waiter] = deque()
        self._held = False

    def settled(self, waiter: Waiter) -> None:
        """``waiter``'s outcome is in: wake it now, or once the woken before it left."""
        with self._lock:
            if waiter.abandoned:
                return
            if self._held:
                self._ready.append(waiter)
                return
            self._held = True
            waiter.wake()

    def pass_on(self) -> None:
        """The woken caller is leaving: wake the next one settled."""
        with self._lock:
            while self._ready:
                waiter = self._ready.popleft()
                if not waiter.abandoned:
                    waiter.wake()
                    return
            self._held = False

    def wait(self, waiter: Waiter) -> None:
        """Block the caller until its ``waiter`` is woken, pass on, raise its error."""
        try:
            waiter.block()
        except BaseException:  # interrupted: it may hold the baton, or never will
            with self._lock:
                woken = waiter.block(blocking=False)
                waiter.abandoned = not woken
            if woken:
                self.pass_on()
            raise
        self.pass_on()
        waiter.outcome()


class LiveSource(Source):
    """A :class:`~delayq.sync._sending.Source` fed by caller threads: empty is "nothing
    now" until :meth:`end`; :meth:`put` wakes the round attached to it."""

    def __init__(self) -> None:
        super().__init__(iter(()))
        self._lock = threading.Lock()
        self._queue: deque[tuple[int, OutgoingMessage]] = deque()
        self._indices = itertools.count()
        self._wake: Callable[[], None] | None = None
        self.waiters: dict[int, tuple[OutgoingMessage, Waiter]] = {}
        """Each message not yet settled, by its index in the stream."""
        self.ended = False
        """No more messages are taken (closed, or its connection lost while idle)."""

    def put(self, msg: OutgoingMessage, waiter: Waiter) -> bool:
        """Queue ``msg`` for sending; ``False`` when this source has ended."""
        with self._lock:
            if self.ended:
                return False
            index = next(self._indices)
            self.waiters[index] = (msg, waiter)
            self._queue.append((index, msg))
            # A round pulls whenever a confirm comes in, so only a message with none in
            # flight before it (none unsettled but itself) needs to wake the round:
            # under a burst the I/O thread is woken by the confirms alone.
            if len(self.waiters) == 1 and self._wake is not None:
                self._wake()
        return True

    def next(self) -> tuple[int, OutgoingMessage] | None:
        if self.again:
            return self.again.popleft()
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            self.exhausted = self.ended
            return None

    def attach(self, wake: Callable[[], None] | None) -> None:
        with self._lock:
            self._wake = wake
            if wake is None and not self._queue:
                self.ended = self.exhausted = True  # idle and disconnected: let it go

    def end(self) -> None:
        """Take no more; the round sends what is queued and finishes."""
        with self._lock:
            self.ended = True
            if self._wake is not None:
                self._wake()

    def settle(self, index: int, _msg: OutgoingMessage, error: PublishError | None) -> None:
        """The round's ``settle``: wake the caller of message ``index``."""
        with self._lock:  # put counts the unsettled
            found = self.waiters.pop(index, None)
        if found is not None:
            found[1].settle(error)

    def finish(self) -> list[tuple[OutgoingMessage, Waiter]]:
        """End this source; the messages it never settled, in stream order."""
        with self._lock:
            self.ended = True
            self._queue.clear()
            left = sorted(self.waiters.items())
            self.waiters.clear()
        return [item for _index, item in left]


@runtime_checkable
class LiveLink(Protocol):
    """A link that can run a stream from a :class:`LiveSource` (pika's)."""

    def send_live(self, source: Source, settle: Callable[..., None], window: int) -> None:
        """Run ``source`` (a :class:`LiveSource`, the bridge's feed) through one pipelined
        connection until it ends."""


def failed_for(exc: BaseException, source: LiveSource, msg: OutgoingMessage) -> bool:
    """Whether a stream's fatal ``exc`` is ``msg``'s own: an exchange found missing
    fails the messages bound there (the one checked is first in line again); the
    others are sent again. Anything else (the apply marker missing, access refused,
    no connection at all) fails every message waiting."""
    if isinstance(exc, TopologyMissing) and not isinstance(exc, TopologyNotApplied):
        if source.again:
            return msg.exchange == source.again[0][1].exchange
    return True


class SharedSender:
    """Sends single messages from many threads through one pipelined stream."""

    def __init__(self, link: LiveLink, window: int, name: str = "delayq-publisher-io") -> None:
        self._link = link
        self._window = max(1, window)
        self._name = name
        self._lock = threading.Lock()
        self._source: LiveSource | None = None
        self._threads: set[threading.Thread] = set()
        self._baton = Baton()

    def send(self, msg: OutgoingMessage) -> None:
        """Send ``msg`` and wait for its confirm; raise what a single publish would."""
        waiter = Waiter(self._baton.settled)
        self._put(msg, waiter)
        self._baton.wait(waiter)

    def _put(self, msg: OutgoingMessage, waiter: Waiter) -> None:
        while True:
            with self._lock:
                source = self._source
                if source is None or source.ended:
                    source = self._source = LiveSource()
                    thread = threading.Thread(
                        target=self._serve, args=(source,), name=self._name, daemon=True
                    )
                    self._threads.add(thread)
                    thread.start()
            if source.put(msg, waiter):
                return

    def _serve(self, source: LiveSource) -> None:
        failed: BaseException | None = None
        try:
            self._link.send_live(source, source.settle, self._window)
        except BaseException as exc:  # every waiting caller hears it, or is sent again
            failed = exc
        left = source.finish()
        with self._lock:
            self._threads.discard(threading.current_thread())
        for msg, waiter in left:
            if failed is not None and failed_for(failed, source, msg):
                error = copy.copy(failed)  # each caller raises its own (a traceback each)
                error.__cause__ = failed
                waiter.settle(error)
            else:  # came after the stream ended, or innocent of its failure: next stream
                self._put(msg, waiter)

    def close(self) -> None:
        """End the stream after what is queued; wait for its thread (and any older one)."""
        with self._lock:
            source, self._source = self._source, None
            threads = list(self._threads)
        if source is not None:
            source.end()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()

    @property
    def waiting(self) -> int:
        """Callers waiting for their outcome on the current stream."""
        source = self._source
        return 0 if source is None else len(source.waiters)

    @property
    def threads(self) -> int:
        """I/O threads running (0 once closed and idle)."""
        with self._lock:
            return len(self._threads)


class ThreadSafeSends:
    """A publisher's single sends from any thread: through the link's blocking channel
    when it is free (one thread: no cost but a lock tried), else through a
    :class:`SharedSender` opened at the first overlap (a link without live streams,
    like the memory broker's, takes them in turn)."""

    def __init__(self, link: Link, window: int) -> None:
        self._link = link
        self._window = window
        self._solo = threading.Lock()  # held by the caller using the blocking channel
        self._sharing = threading.Lock()
        self._shared: SharedSender | None = None

    def send(self, msg: OutgoingMessage) -> None:
        shared = self._shared
        if shared is not None and shared.waiting:  # a burst under way: join it
            shared.send(msg)
            return
        if self._solo.acquire(blocking=False):
            try:
                self._link.send(msg)
            finally:
                self._solo.release()
            return
        if not isinstance(self._link, LiveLink):
            with self._solo:
                self._link.send(msg)
            return
        with self._sharing:
            shared = self._shared
            if shared is None:
                shared = self._shared = SharedSender(self._link, self._window)
        shared.send(msg)

    def connect(self) -> None:
        with self._solo:
            self._link.connect()

    @property
    def shared(self) -> SharedSender | None:
        """The shared stream, once threads have overlapped (``None`` after close)."""
        return self._shared

    def close(self) -> None:
        """End the shared stream (what is queued is sent first), then the link."""
        with self._sharing:
            shared, self._shared = self._shared, None
        if shared is not None:
            shared.close()
        with self._solo:
            self._link.close()
