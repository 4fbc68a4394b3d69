"""Handler threads for the blocking consumer: up to N handlers at once, none stuck forever.

pika's BlockingConnection is not thread-safe, so handlers run here and only hand
their outcome back: the connection's thread drains :attr:`HandlerThreads.finished`
(:meth:`HandlerThreads.take_finished`) and does every ack, nack and republish
itself. A handler's end wakes that thread only when nothing else has since it
last drained them (a wake crosses threads through pika's socket pair: costly).

A handler past its timeout cannot be killed; it is *abandoned*: its slot is given
back at once (the delivery is retried) while its thread runs on, and what it
returns is ignored; a new thread replaces it. Abandoned threads are bounded too:
at most ``spare`` of them beyond the ``size`` working ones, so the consumer never
has more than ``size + spare`` handler threads; when that many are stuck, no new
handler starts until one of them ends. :meth:`HandlerThreads.hung` tells the
consumer which attempts of a message still hang there, so that a message that
hangs every time cannot take all the replacements by its retries (see
:mod:`delayq.sync._deliveries`).

Threads are daemons: a handler stuck forever must not keep the process from
exiting after a graceful stop (``concurrent.futures`` threads are joined at exit).
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from delayq.consume.delivery import Delivery

__all__ = ["HandlerThreads", "Job"]


@dataclass(eq=False, slots=True)
class Job:
    """One delivery whose handler runs in a thread, and what came of it."""

    settler: Any
    """Where the delivery came from (after a reconnect it cannot be settled there)."""
    delivery: Delivery
    received_ms: int
    flow: Any
    """The delivery's flow (:mod:`delayq.consume.flow`), waiting for the handler's end."""
    call: Callable[[], object]
    context: contextvars.Context = field(default_factory=contextvars.copy_context)
    started: float = 0.0
    """``time.monotonic()`` when the handler started."""
    deadline: float = 0.0
    error: BaseException | None = None
    """What the handler raised (anything: ``SystemExit`` too), ``None`` on success."""

    def run(self) -> None:
        """Run the handler in this thread, with the delivery's logging context."""
        self.started = time.monotonic()
        try:
            self.context.run(self.call)
        except BaseException as exc:  # reported to the connection's thread, never lost here
            self.error = exc

    @property
    def handler_ms(self) -> float:
        return (time.monotonic() - self.started) * 1000


class HandlerThreads:
    """Runs jobs in daemon threads: ``size`` working slots, ``spare`` for abandoned ones."""

    def __init__(
        self,
        size: int,
        *,
        spare: int,
        timeout_s: float,
        name: str,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.size = size
        self.spare = spare
        self._timeout_s = timeout_s
        self._name = name
        self._wake = wake
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._running: set[Job] = set()
        self._abandoned: set[Job] = set()
        """Jobs past their timeout whose handler still runs, each in a thread of its own."""
        self.finished: queue.SimpleQueue[Job] = queue.SimpleQueue()
        """Jobs whose handler ended in time, for the connection's thread to settle."""
        self._woken = False
        """Whether a handler's end woke the connection's thread since it last took the
        finished jobs: later ends need not wake it again (it takes them too)."""

    @property
    def running(self) -> int:
        """Jobs in their slot: started, not finished, not abandoned."""
        with self._lock:
            return len(self._running)

    def unsettled(self) -> bool:
        """Whether a job started in time is not yet taken by :meth:`take_finished`: its
        handler runs, or it ended and waits in :attr:`finished` (a job leaves its slot
        only once it is there, so none is ever in neither)."""
        with self._lock:
            return bool(self._running) or not self.finished.empty()

    @property
    def abandoned(self) -> int:
        """Threads still stuck in a handler that overran its timeout."""
        with self._lock:
            return len(self._abandoned)

    def hung(self, message_id: str | None) -> list[Job]:
        """The abandoned jobs of message ``message_id`` whose handler still runs."""
        if not message_id or not self._abandoned:  # a racy peek: a job only ever leaves
            return []
        with self._lock:
            return [job for job in self._abandoned if job.delivery.message_id == message_id]

    @property
    def threads(self) -> int:
        with self._lock:
            return len(self._threads)

    def stuck(self) -> bool:
        """Whether no job can start only because abandoned threads fill the spare ones
        (not because the working slots are busy): nothing starts until one returns."""
        with self._lock:
            busy, abandoned = len(self._running), len(self._abandoned)
            room = self.size + self.spare - busy - abandoned
            return abandoned > 0 and busy < self.size and room <= 0

    def free(self) -> int:
        """How many more jobs may start now."""
        with self._lock:
            busy, abandoned = len(self._running), len(self._abandoned)
            return max(0, min(self.size - busy, self.size + self.spare - busy - abandoned))

    def submit(self, job: Job) -> None:
        """Start ``job`` in a thread (the caller checked :meth:`free`)."""
        with self._lock:
            job.deadline = time.monotonic() + self._timeout_s
            self._running.add(job)
            if self._idle > 0:
                self._idle -= 1
            else:
                thread = threading.Thread(
                    target=self._serve,
                    name=f"{self._name}-{len(self._threads) + 1}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
        self._work.put(job)

    def overrun(self, now: float | None = None) -> list[Job]:
        """Abandon the jobs past their deadline and return them; their slots are free."""
        now = time.monotonic() if now is None else now
        with self._lock:
            late = [job for job in self._running if job.deadline <= now]
            for job in late:
                self._running.discard(job)
                self._abandoned.add(job)
        return late

    def forget_running(self) -> list[Job]:
        """Abandon every running job (the consumer is closing) and return them."""
        with self._lock:
            jobs = list(self._running)
            self._abandoned.update(jobs)
            self._running.clear()
        return jobs

    def take_finished(self) -> list[Job]:
        """The jobs whose handler ended in time, in the order they ended (the connection's
        thread; the next end after this call wakes it again)."""
        self._woken = False  # before draining: a job put after this is taken, or wakes
        finished = self.finished
        jobs: list[Job] = []
        while not finished.empty():  # this thread alone takes: not empty, then it gets
            jobs.append(finished.get_nowait())
        return jobs

    def close(self) -> None:
        """Let idle threads end; stuck ones are daemons and end with the process."""
        with self._lock:
            count = len(self._threads)
        for _ in range(count):
            self._work.put(None)

    def _serve(self) -> None:
        while True:
            job = self._work.get()
            if job is None:
                with self._lock:
                    self._threads.remove(threading.current_thread())
                return
            job.run()
            with self._lock:
                in_time = job in self._running
                if in_time:
                    self.finished.put(job)  # first: see unsettled()
                    self._running.discard(job)
                else:
                    self._abandoned.discard(job)
                self._idle += 1
            if in_time:  # put, then the flag: see take_finished
                if not self._woken:
                    self._woken = True
                    self._wake()
