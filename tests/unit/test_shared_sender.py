"""The pure parts of the shared pipelined connection of ``Publisher.publish`` from many
threads (:mod:`delayq.sync._shared`): the live source's "nothing now", its wake-ups and
end, a caller's wait, and the sender's threads and failures over a fake link."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from delayq.errors import (
    AccessRefused,
    ConnectionFailed,
    PublishError,
    TopologyMissing,
    TopologyNotApplied,
    Unroutable,
)
from delayq.message.envelope import OutgoingMessage
from delayq.message.factory import MessageFactory
from delayq.sync._shared import (
    Baton,
    LiveLink,
    LiveSource,
    SharedSender,
    ThreadSafeSends,
    Waiter,
    failed_for,
)
from delayq.topology.model import Topology
from tests.waiting import wait_for

FACTORY = MessageFactory(
    Topology(
        namespace="shared",
        ladder=["1m", "1h"],
        destinations=[{"queue": "shared.work", "bindings": ["job.#"]}],
    )
)


def _msg(n: int, delay: str = "1m") -> OutgoingMessage:
    return FACTORY.build({"n": n}, "job.x", delay, message_id=f"m{n}")


def test_an_empty_live_source_says_nothing_now_until_ended() -> None:
    source = LiveSource()
    assert source.next() is None and not source.done
    source.put(_msg(0), Waiter())
    index, msg = source.next() or (None, None)
    assert (index, msg.message_id if msg else None) == (0, "m0")
    assert source.next() is None and not source.done
    source.end()
    assert source.next() is None and source.done
    assert not source.put(_msg(1), Waiter()), "an ended source took a message"


def test_what_a_lost_round_left_goes_before_the_queue() -> None:
    source = LiveSource()
    source.put(_msg(0), Waiter())
    source.put(_msg(1), Waiter())
    first = source.next()
    assert first is not None
    source.push_front([first])
    assert [source.next(), source.next()] == [first, (1, source.waiters[1][0])]


def test_only_a_message_with_none_in_flight_before_it_wakes_the_round() -> None:
    """Under a burst the confirms wake the round (it pulls after each): a put wakes it
    only when nothing else is unsettled."""
    source, wakes = LiveSource(), []
    source.attach(lambda: wakes.append(1))
    source.put(_msg(0), Waiter())
    source.put(_msg(1), Waiter())
    assert len(wakes) == 1
    source.next(), source.next()
    source.put(_msg(2), Waiter())
    assert len(wakes) == 1, "woken while two were in flight"
    source.settle(0, _msg(0), None)
    source.settle(1, _msg(1), None)
    source.next()
    source.settle(2, _msg(2), None)
    source.put(_msg(3), Waiter())
    assert len(wakes) == 2, "a message with nothing in flight did not wake the round"
    source.end()
    assert len(wakes) == 3, "end did not wake the round to finish"


def test_a_round_lost_while_idle_ends_the_source_but_not_one_with_messages_queued() -> None:
    idle, busy = LiveSource(), LiveSource()
    busy.put(_msg(0), Waiter())
    for source in (idle, busy):
        source.attach(lambda: None)
        source.attach(None)
    assert idle.ended and idle.done
    assert not busy.ended and busy.next() is not None


def test_settle_wakes_only_its_own_caller_once() -> None:
    source, first, second = LiveSource(), Waiter(), Waiter()
    source.put(_msg(0), first)
    source.put(_msg(1), second)
    error = Unroutable("no queue", "m1")
    source.settle(1, _msg(1), error)
    source.settle(1, _msg(1), None)  # a second settle of one index is ignored
    assert (first.settled, second.settled, second.error) == (False, True, error)
    with pytest.raises(Unroutable):
        second.wait()
    source.settle(0, _msg(0), None)
    first.wait()


def test_finish_returns_the_unsettled_in_stream_order() -> None:
    source = LiveSource()
    for n in range(3):
        source.put(_msg(n), Waiter())
    source.settle(1, _msg(1), None)
    assert [m.message_id for m, _w in source.finish()] == ["m0", "m2"]
    assert source.ended and not source.waiters


def test_a_missing_exchange_fails_its_own_messages_only() -> None:
    source = LiveSource()
    short, long_ = _msg(0, "1m"), _msg(1, "1h")
    assert short.exchange != long_.exchange
    source.push_front([(0, short)])  # the round was checking its exchange
    missing = TopologyMissing("no exchange")
    assert failed_for(missing, source, short)
    assert not failed_for(missing, source, long_)
    for everyone in (TopologyNotApplied("no marker"), AccessRefused("no"), ConnectionFailed("x")):
        assert failed_for(everyone, source, long_)


class FakeLink:
    """A live link in memory: confirms each message whose id does not start with
    ``bad`` (those are unroutable), or raises ``fail`` after pulling one message."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail = fail
        self.streams = 0
        self.stream_gate = threading.Event()
        self.stream_gate.set()

    def send_live(self, source: LiveSource, settle: Callable[..., None], window: int) -> None:
        self.streams += 1
        woken = threading.Event()
        source.attach(woken.set)
        while True:
            item = source.next()
            if item is None:
                if source.done:
                    source.attach(None)
                    return
                woken.wait()
                woken.clear()
                continue
            self.stream_gate.wait()
            if self.fail is not None:
                source.push_front([item])
                raise self.fail
            index, msg = item
            error = (
                Unroutable("returned", msg.message_id) if msg.message_id.startswith("bad") else None
            )
            settle(index, msg, error)


def _callers(n: int, call: Callable[[int], object]) -> list[object]:
    out: list[object] = [None] * n

    def run(i: int) -> None:
        try:
            out[i] = call(i)
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return out


def test_each_caller_hears_its_own_outcome_through_one_stream() -> None:
    link = FakeLink()
    assert isinstance(link, LiveLink)
    sender = SharedSender(link, window=10)

    def call(i: int) -> object:
        name = f"bad{i}" if i % 3 == 0 else f"ok{i}"
        sender.send(FACTORY.build({"n": i}, "job.x", "1m", message_id=name))
        return name

    out = _callers(50, call)
    for i, result in enumerate(out):
        if i % 3 == 0:
            assert isinstance(result, Unroutable) and result.message_id == f"bad{i}", result
        else:
            assert result == f"ok{i}"
    assert link.streams == 1
    sender.close()
    assert sender.threads == 0


def test_close_lets_queued_callers_finish_and_ends_the_thread() -> None:
    link = FakeLink()
    link.stream_gate.clear()  # the stream holds the first message it pulls
    sender = SharedSender(link, window=10)
    results: list[object] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(sender.send(_msg(i)))) for i in range(5)
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: sender.waiting == 5, 10, "five callers waiting")
    closing = threading.Thread(target=sender.close)
    closing.start()
    wait_for(lambda: sender.waiting == 0 and sender.threads == 1, 10, "close took the stream")
    link.stream_gate.set()
    closing.join(10)
    for thread in threads:
        thread.join(10)
    assert results == [None] * 5 and sender.threads == 0
    sender.send(_msg(9))  # after close: a new stream
    assert link.streams == 2
    sender.close()


@pytest.mark.parametrize(
    "fail", [ConnectionFailed("down"), AccessRefused("refused"), TopologyNotApplied("marker")]
)
def test_a_fatal_stream_error_reaches_every_waiting_caller_as_its_own_copy(
    fail: PublishError,
) -> None:
    sender = SharedSender(FakeLink(fail=fail), window=10)
    out = _callers(5, lambda i: sender.send(_msg(i)))
    assert all(type(e) is type(fail) and e is not fail and e.__cause__ is fail for e in out)
    wait_for(lambda: sender.threads == 0, 10, "the failed stream's thread ended")


class BlockingFakeLink:
    """A link whose ``send`` blocks until ``gate`` opens, noting any overlap."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.inside = 0
        self.overlaps = 0
        self.sent: list[str] = []
        self.closed = 0

    def send(self, msg: OutgoingMessage) -> None:
        self.inside += 1
        self.overlaps += self.inside > 1
        self.gate.wait()
        self.sent.append(msg.message_id)
        self.inside -= 1

    def connect(self) -> None:
        pass

    def close(self) -> None:
        self.closed += 1


class LiveBlockingFakeLink(BlockingFakeLink, FakeLink):
    def __init__(self) -> None:
        BlockingFakeLink.__init__(self)
        FakeLink.__init__(self)


def test_without_live_streams_callers_take_the_blocking_channel_in_turn() -> None:
    link = BlockingFakeLink()
    sends = ThreadSafeSends(link, window=10)  # type: ignore[arg-type]
    threads, _out = _callers_started(5, lambda i: sends.send(_msg(i)))
    wait_for(lambda: link.inside == 1, 10, "one caller inside")
    link.gate.set()
    for thread in threads:
        thread.join(10)
    assert sorted(link.sent) == [f"m{i}" for i in range(5)] and link.overlaps == 0
    assert sends.shared is None


def test_a_caller_finding_the_blocking_channel_busy_goes_through_the_shared_stream() -> None:
    link = LiveBlockingFakeLink()
    sends = ThreadSafeSends(link, window=10)  # type: ignore[arg-type]
    first, _ = _callers_started(1, lambda i: sends.send(_msg(i)))
    wait_for(lambda: link.inside == 1, 10, "the first caller on the blocking channel")
    _callers(4, lambda i: sends.send(_msg(i + 1)))  # they return while the first waits
    assert link.sent == [] and link.streams == 1 and sends.shared is not None
    link.gate.set()
    first[0].join(10)
    assert link.sent == ["m0"] and link.overlaps == 0
    shared = sends.shared
    sends.close()
    assert sends.shared is None and shared.threads == 0 and link.closed == 1


def _callers_started(
    n: int, call: Callable[[int], object]
) -> tuple[list[threading.Thread], list[object]]:
    out: list[object] = [None] * n
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, call(i))) for i in range(n)]
    for thread in threads:
        thread.start()
    return threads, out


def test_the_baton_wakes_settled_callers_one_at_a_time_in_order() -> None:
    baton = Baton()
    first, second, third = (Waiter(baton.settled) for _ in range(3))
    first.settle(None)
    second.settle(Unroutable("returned", "m2"))
    third.settle(None)
    assert first.block(blocking=False) and not second.block(blocking=False)
    baton.pass_on()  # the first caller leaves
    assert second.block(blocking=False) and not third.block(blocking=False)
    baton.pass_on()
    assert third.block(blocking=False)
    baton.pass_on()
    fourth = Waiter(baton.settled)
    fourth.settle(None)
    assert fourth.block(blocking=False), "a free baton did not wake the next settled caller"


def test_the_baton_skips_an_abandoned_caller() -> None:
    baton = Baton()
    first, gone, last = (Waiter(baton.settled) for _ in range(3))
    first.settle(None)
    gone.settle(None)
    last.settle(None)
    gone.abandoned = True
    baton.pass_on()
    assert last.block(blocking=False) and not gone.block(blocking=False)


class _Interrupted(Exception):
    pass


class InterruptedWaiter(Waiter):
    """A caller interrupted in its blocking wait, after (``woken``) or before its
    outcome came."""

    __slots__ = ()

    def block(self, blocking: bool = True) -> bool:
        if blocking:
            raise _Interrupted
        return super().block(blocking)


@pytest.mark.parametrize("woken", [True, False])
def test_an_interrupted_caller_never_keeps_the_baton(woken: bool) -> None:
    baton = Baton()
    interrupted, next_one = InterruptedWaiter(baton.settled), Waiter(baton.settled)
    if woken:
        interrupted.settle(None)
    with pytest.raises(_Interrupted):
        baton.wait(interrupted)
    assert interrupted.abandoned is not woken
    if not woken:
        interrupted.settle(None)  # its outcome comes later: nobody to wake, no baton taken
    next_one.settle(None)
    assert next_one.block(blocking=False), "the baton was lost with the interrupted caller"
