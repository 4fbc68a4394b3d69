"""Rows read by a scheduling job's tasks, counted on the driver while the job runs.

Spark tells the driver about a task's rows only when the task ends (accumulators) or
at executor heartbeats (every 10 s, and not for Python rows): too coarse for a rate and
an ETA when a job has as few tasks as the cluster has cores. So each task tells the
driver itself: it connects to a small TCP listener the driver opens on a free port
(``spark.driver.host``), sends a token, then the rows it read, at most twice a second.
This is progress only: a task that cannot reach the listener (a firewall between the
executors and the driver) schedules its rows all the same, uncounted.

A bulk cancel counts Spark tasks instead (:func:`watch_tasks`, from Spark's status tracker).
"""

from __future__ import annotations

import contextlib
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["RowCounter", "counting", "watch_tasks"]

Task = Callable[[Iterable[Any]], Iterator[tuple[Any, ...]]]
_CONNECT_TIMEOUT_S = 1.0
_TELL_EVERY_S = 0.5


class RowCounter:
    """The driver's listener: sums the rows tasks say they read."""

    def __init__(self, spark: Any) -> None:
        host = spark.sparkContext.getConf().get("spark.driver.host") or socket.gethostname()
        self._server = socket.create_server(("", 0))
        self._server.setblocking(False)
        self.address = (host, self._server.getsockname()[1], secrets.token_hex(8))
        self.rows = 0
        self._open = 0
        self._closed = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="delayq-rows", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        buffers: dict[socket.socket, bytes] = {}
        while True:
            events = self._selector.select(timeout=0.2)
            if not events and self._closed.is_set():
                # Closed, and nothing left to take: a task that ended just before the
                # close may still wait in the backlog, or its last count in a buffer.
                break
            for key, _ in events:
                if key.fileobj is self._server:
                    with contextlib.suppress(OSError):
                        conn, _addr = self._server.accept()
                        conn.setblocking(False)
                        self._selector.register(conn, selectors.EVENT_READ, None)
                        buffers[conn] = b""
                        self._open += 1
                    continue
                conn = key.fileobj  # type: ignore[assignment]
                try:
                    data = conn.recv(4096)
                except OSError:
                    data = b""
                if data:
                    buffers[conn] = self._take(buffers[conn] + data)
                else:
                    self._selector.unregister(conn)
                    conn.close()
                    buffers.pop(conn, None)
                    self._open -= 1
        for conn in buffers:
            conn.close()

    def _take(self, buffer: bytes) -> bytes:
        """Count the complete lines of ``buffer`` (``token n``), keep the rest."""
        *lines, rest = buffer.split(b"\n")
        token = self.address[2].encode()
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and parts[0] == token and parts[1].isdigit():
                self.rows += int(parts[1])
        return rest

    @contextlib.contextmanager
    def watching(self, total: int, progress: Callable[[int, int], None]) -> Iterator[None]:
        """Tell ``progress(rows read, total)`` when it changes while the block runs, and
        once more at its end; the listener is closed afterwards."""
        done = threading.Event()

        def watch() -> None:
            last = -1
            while not done.wait(0.5):
                shown = min(self.rows, total)
                if shown != last:
                    last = shown
                    progress(shown, total)

        watcher = threading.Thread(target=watch, name="delayq-progress", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()
            deadline = time.monotonic() + 1.0  # the last counts of tasks just ended
            while self._open and time.monotonic() < deadline:
                time.sleep(0.05)
            self.close()
            progress(min(self.rows, total), total)

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        self._selector.close()
        self._server.close()


def counting(task: Task, counter: RowCounter | None) -> Task:
    """``task`` telling ``counter`` the rows it reads (``task`` itself without one)."""
    if counter is None:
        return task
    address = counter.address

    def run(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        return task(_told(rows, address))

    return run


def _told(rows: Iterable[Any], address: tuple[str, int, str]) -> Iterator[Any]:
    host, port, token = address
    sock: socket.socket | None
    try:
        sock = socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S)
    except OSError:
        sock = None
    unsaid, said_at = 0, time.monotonic()

    def say() -> None:
        nonlocal sock, unsaid, said_at
        if sock is not None and unsaid:
            try:
                sock.sendall(f"{token} {unsaid}\n".encode())
            except OSError:
                sock.close()
                sock = None
        unsaid, said_at = 0, time.monotonic()

    try:
        for row in rows:
            yield row
            unsaid += 1
            if unsaid & 127 == 0 and time.monotonic() - said_at >= _TELL_EVERY_S:
                say()
    finally:
        say()
        if sock is not None:
            sock.close()


def watch_tasks(
    spark: Any, group: str, progress: Callable[[int, int], None], done: threading.Event
) -> None:
    """Tell ``progress(tasks done, tasks in all)`` of the jobs of ``group`` when it changes,
    until ``done`` is set (a bulk cancel's progress: its tasks are few and short)."""
    tracker = spark.sparkContext.statusTracker()
    last = (-1, -1)
    while True:
        stopping = done.wait(0.5)  # one more poll once the job is done: the final count
        finished = total = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    finished += stage.numCompletedTasks
                    total += stage.numTasks
        if total and (finished, total) != last:
            last = (finished, total)
            progress(finished, total)
        if stopping:
            return
