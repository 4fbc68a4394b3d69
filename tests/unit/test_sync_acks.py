"""The blocking consumer's coalesced acks (delayq.sync._acks, delayq.sync._feed) and its
handler threads' wakes: a ``multiple`` ack never covers a delivery that is not acked
(running, put back, or a lost channel's), and a turn's acks leave in one frame."""

from __future__ import annotations

import itertools
import queue
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pika
import pytest

from delayq.consume.delivery import Delivery
from delayq.sync import _feed
from delayq.sync._acks import ACK_DELAY_S, AckLine, ack_batch
from delayq.sync._feed import PikaFeed
from delayq.sync._threads import HandlerThreads, Job

# The line, alone ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def line_of(tags: range, batch: int = 1) -> tuple[AckLine, Clock]:
    clock = Clock()
    line = AckLine(batch, clock=clock)
    for tag in tags:
        line.track(tag)
    return line, clock


def test_a_contiguous_run_goes_with_one_multiple_ack() -> None:
    line, clock = line_of(range(1, 5))
    for tag in (2, 1, 4, 3):  # handlers end in any order
        assert line.ack(tag)
    assert line.take(clock.now) == (4, [])
    assert line.due == 0 and len(line) == 0


def test_the_run_stops_at_a_delivery_not_acked() -> None:
    line, clock = line_of(range(1, 6))
    for tag in (1, 2, 4, 5):
        line.ack(tag)
    assert line.take(clock.now) == (2, []), "3 runs: 4 and 5 must not be covered"
    assert line.take(clock.now + ACK_DELAY_S / 2) == (None, [])
    assert line.wait_s(clock.now) == pytest.approx(ACK_DELAY_S)
    # 3 still runs after the delay: 4 and 5 go one by one, never as a multiple ack
    assert line.take(clock.now + ACK_DELAY_S) == (None, [4, 5])
    assert line.due == 0 and len(line) == 1
    line.ack(3)
    assert line.take(clock.now + 1) == (3, [])


def test_behind_acks_join_the_run_once_the_gap_is_acked() -> None:
    line, clock = line_of(range(1, 6))
    for tag in (1, 3, 4):
        line.ack(tag)
    assert line.take(clock.now) == (1, [])
    line.ack(2)
    assert line.take(clock.now) == (4, []), "2 closed the gap: one frame for 2..4"
    assert len(line) == 1  # 5, not acked


def test_a_nack_breaks_the_run_then_leaves_it() -> None:
    """A delivery put back is nacked at once: it leaves the line, and later multiple acks
    may pass its tag (the broker forgot it); until then nothing covers it."""
    line, clock = line_of(range(1, 6))
    line.ack(1)
    line.ack(3)
    assert line.take(clock.now) == (1, []), "2 is not settled yet: 3 waits"
    line.drop(2)  # its nack is written now, before any later ack
    line.ack(4)
    assert line.take(clock.now) == (4, [])
    line.drop(5)
    assert line.due == 0 and len(line) == 0
    assert line.take(clock.now) == (None, [])


def test_a_delivery_never_settled_holds_every_multiple_ack_back() -> None:
    """One that goes back with the channel (a handler's SystemExit, the end of a stop's
    grace) is never acked: whatever is behind it goes alone, however long it waits."""
    line, clock = line_of(range(1, 4))
    line.ack(2)
    line.ack(3)
    assert line.take(clock.now, waited=True) == (None, [2, 3])
    assert len(line) == 1


def test_only_outstanding_tags_are_marked() -> None:
    line, _ = line_of(range(1, 3))
    assert not line.ack(7), "not this line's delivery: acked alone by the caller"
    assert line.ack(1)
    assert not line.ack(1), "acked twice"
    line.drop(2)
    assert not line.ack(2), "nacked already"


def test_acks_gather_up_to_a_batch_or_a_delay() -> None:
    line, clock = line_of(range(1, 11), batch=3)
    line.ack(1)
    clock.now += 0.001
    line.ack(2)
    assert line.take(clock.now) == (None, []), "2 of 3: they wait"
    assert line.wait_s(clock.now) == pytest.approx(ACK_DELAY_S - 0.001)
    assert line.take(100.0 + ACK_DELAY_S) == (2, []), "the first waited long enough"
    for tag in (3, 4, 5):
        line.ack(tag)
    assert line.take(clock.now) == (5, []), "a batch: at once"
    assert ack_batch(200) == 50 and ack_batch(1) == 1 and ack_batch(3) == 1


# The feed: what reaches the channel ---------------------------------------------------------


class FakeChannel:
    def __init__(self) -> None:
        self.frames: list[tuple[str, int, bool]] = []
        self.is_open = True
        self.cancelled = False
        self._consumer: Any = None
        self._tags = itertools.count(1)

    def add_on_cancel_callback(self, _callback: Any) -> None:
        pass

    def basic_qos(self, prefetch_count: int) -> None:
        self.prefetch = prefetch_count

    def basic_consume(self, _queue: str, callback: Any) -> str:
        self._consumer = callback
        return "ctag"

    def basic_cancel(self, _tag: str) -> None:
        self.cancelled = True

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        self.frames.append(("ack", delivery_tag, multiple))

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        # one delivery goes back with a reject: RabbitMQ 4.3 counts it, a nack not
        self.frames.append(("reject", delivery_tag, requeue))

    def close(self) -> None:
        self.is_open = False

    def deliver(self) -> None:
        tag = next(self._tags)
        method = SimpleNamespace(delivery_tag=tag, routing_key="orders.x", redelivered=False)
        self._consumer(self, method, pika.BasicProperties(message_id=f"m{tag}"), b"{}")


class FakeConnection:
    def __init__(self) -> None:
        self.channels: list[FakeChannel] = []
        self.is_open = True
        self.on_the_wire = 0
        """Deliveries sent to the last channel that its next read takes in."""

    def channel(self) -> FakeChannel:
        self.channels.append(FakeChannel())
        return self.channels[-1]

    def process_data_events(self, time_limit: float | None = 0) -> None:
        channel = self.channels[-1]
        while self.on_the_wire and not channel.cancelled:
            self.on_the_wire -= 1
            channel.deliver()

    def add_callback_threadsafe(self, _callback: Any) -> None:
        pass

    def sleep(self, _seconds: float) -> None:
        pass

    def close(self) -> None:
        self.is_open = False


Handed = list[tuple[Any, Delivery]]


@pytest.fixture
def feed(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[PikaFeed, Handed]]:
    monkeypatch.setattr(_feed, "connect", lambda _url, name: FakeConnection())
    monkeypatch.setattr(_feed, "ensure_topology", lambda _topology, _connection: None)
    handed: Handed = []
    feed = PikaFeed("amqp://localhost")
    feed.open(None, "orders", 4, lambda settler, delivery: handed.append((settler, delivery)))  # type: ignore[arg-type]
    yield feed, handed
    feed.close()


def channel_of(feed: PikaFeed) -> FakeChannel:
    channel = feed.channel
    assert isinstance(channel, FakeChannel)
    return channel


def covered(frames: list[tuple[str, int, bool]]) -> set[int]:
    """Every tag the frames settle, a multiple ack's whole range included."""
    tags: set[int] = set()
    for kind, tag, multiple in frames:
        tags |= set(range(1, tag + 1)) if kind == "ack" and multiple else {tag}
    return tags


def test_a_turns_acks_leave_in_one_frame(feed: tuple[PikaFeed, Handed]) -> None:
    pika_feed, handed = feed
    channel = channel_of(pika_feed)
    for _ in range(3):
        channel.deliver()
    for settler, _delivery in reversed(handed):
        settler.ack()
    assert channel.frames == [], "sent by the feed thread's next pump, not one by one"
    pika_feed.pump(0)
    assert channel.frames == [("ack", 3, True)]


def test_acks_never_cover_a_reject_or_a_running_delivery(feed: tuple[PikaFeed, Handed]) -> None:
    pika_feed, handed = feed
    channel = channel_of(pika_feed)
    for _ in range(5):
        channel.deliver()
    settlers = [settler for settler, _delivery in handed]
    settlers[0].ack()
    settlers[3].ack()
    settlers[1].requeue()  # a PutBack: rejected at once
    assert channel.frames == [("reject", 2, True)]
    pika_feed.pump(0)
    assert channel.frames[1:] == [("ack", 1, True)], "3 runs: 4 waits behind it"
    assert covered(channel.frames) == {1, 2}
    settlers[2].ack()
    pika_feed.pump(0)
    assert channel.frames[2:] == [("ack", 4, True)], "3 and 4 together, passing the rejected 2"
    settlers[4].requeue()
    assert covered(channel.frames) == {1, 2, 3, 4, 5}
    assert ("ack", 5, False) not in channel.frames and ("ack", 5, True) not in channel.frames


def test_acks_behind_a_running_delivery_go_alone_after_a_while(
    feed: tuple[PikaFeed, Handed],
) -> None:
    pika_feed, handed = feed
    channel = channel_of(pika_feed)
    for _ in range(3):
        channel.deliver()
    handed[1][0].ack()
    handed[2][0].ack()
    pika_feed.pump(0)
    assert channel.frames == []
    time.sleep(ACK_DELAY_S * 2)
    pika_feed.pump(0)
    assert channel.frames == [("ack", 2, False), ("ack", 3, False)]


def test_a_lost_channels_delivery_is_never_acked_on_the_new_one(
    feed: tuple[PikaFeed, Handed],
) -> None:
    pika_feed, handed = feed
    old = channel_of(pika_feed)
    old.deliver()
    old.deliver()
    stale = handed[1][0]
    pika_feed.close()  # the connection was lost: reopened
    pika_feed.open(None, "orders", 4, lambda s, d: handed.append((s, d)))  # type: ignore[arg-type]
    new = channel_of(pika_feed)
    assert new is not old and not stale.current
    new.deliver()  # tag 1 again, on the new channel
    stale.ack()  # the consumer never does (not current); if it did: on the old channel only
    pika_feed.pump(0)
    assert new.frames == [], "tag 2 of the old channel must not be settled here"
    handed[2][0].ack()
    pika_feed.pump(0)
    assert new.frames == [("ack", 1, True)]


def test_close_sends_the_acks_still_waiting(feed: tuple[PikaFeed, Handed]) -> None:
    pika_feed, handed = feed
    channel = channel_of(pika_feed)
    pika_feed.resubscribe(40)  # a batch of 10 acks now
    for _ in range(4):
        channel.deliver()
    for settler in (handed[0][0], handed[1][0], handed[3][0]):
        settler.ack()
    pika_feed.pump(0)
    assert channel.frames == [], "3 of a batch of 10: they wait"
    pika_feed.close()
    assert channel.frames == [("ack", 2, True), ("ack", 4, False)]


def test_a_cancel_takes_in_what_was_sent_before_it(feed: tuple[PikaFeed, Handed]) -> None:
    """pika's ``basic_cancel`` gives back (requeues, charged on a quorum queue) what it
    read and did not hand over: a stop takes it in first, to settle it gracefully."""
    pika_feed, handed = feed
    connection = pika_feed._connection
    assert isinstance(connection, FakeConnection)
    connection.on_the_wire = 3  # unread: the feed thread waited for a handler's end
    pika_feed.unsubscribe()
    assert len(handed) == 3 and channel_of(pika_feed).cancelled
    assert not pika_feed.consuming


def test_sleep_sends_the_acks_first(feed: tuple[PikaFeed, Handed]) -> None:
    pika_feed, handed = feed
    channel = channel_of(pika_feed)
    channel.deliver()
    handed[0][0].ack()
    pika_feed.sleep(1.0)  # before a requeue's pause
    assert channel.frames == [("ack", 1, True)]


# Handler threads: one wake per batch of ends, none lost ----------------------------------------


class _Finished(queue.SimpleQueue[Job]):
    """Records whether each job was still in its slot when it was put here."""

    def __init__(self, pool: HandlerThreads) -> None:
        self.pool = pool
        self.in_slot: list[bool] = []

    def put(self, item: Job, block: bool = True, timeout: float | None = None) -> None:
        self.in_slot.append(item in self.pool._running)
        super().put(item, block, timeout)


def test_an_ended_job_is_unsettled_until_the_feed_thread_takes_it() -> None:
    """A graceful stop ends once nothing is unsettled: a job whose handler returned must
    not drop out of sight between its slot and ``finished``."""
    pool = HandlerThreads(1, spare=1, timeout_s=5, name="t-handler")
    finished = pool.finished = _Finished(pool)
    try:
        job = _job(lambda: None, 1)
        pool.submit(job)
        deadline = time.monotonic() + 5
        while finished.empty() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert finished.in_slot == [True], "put in finished before it left its slot"
        assert pool.running == 0 and pool.unsettled()
        assert pool.take_finished() == [job]
        assert not pool.unsettled()
    finally:
        pool.close()


def _job(call: Any, n: int) -> Job:
    delivery = Delivery(
        queue="work",
        body=b"",
        routing_key="job.x",
        message_id=f"m{n}",
        content_type=None,
        headers={},
    )
    return Job(None, delivery, 0, None, call)


def _settled(pool: HandlerThreads, count: int, wakes: list[int], woken: int) -> None:
    """Wait until ``count`` jobs are in ``pool.finished`` and ``woken`` wakes came, then a
    moment more for any wake that should not come."""
    deadline = time.monotonic() + 5
    while (pool.finished.qsize() < count or len(wakes) < woken) and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)


def test_handler_ends_wake_the_feed_thread_once_until_it_looks() -> None:
    wakes: list[int] = []
    pool = HandlerThreads(3, spare=3, timeout_s=5, name="t-handler", wake=lambda: wakes.append(1))
    try:
        jobs = [_job(lambda: None, n) for n in range(3)]
        for job in jobs:
            pool.submit(job)
        _settled(pool, 3, wakes, 1)
        assert len(wakes) == 1, "the first end wakes it; the others find it awake"
        assert set(pool.take_finished()) == set(jobs)
        late = _job(lambda: None, 9)
        pool.submit(late)
        _settled(pool, 1, wakes, 2)
        assert len(wakes) == 2, "it looked: the next end wakes it again"
        assert pool.take_finished() == [late]
    finally:
        pool.close()
