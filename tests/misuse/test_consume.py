"""Consuming, misused: bad concurrency and timeouts, handlers that cannot run in a thread
or never return or end the process, handlers that are not thread-safe, stores shared by
concurrent handlers, and stops in the middle of a stream. Each ends in a clear delayq
error or a correct outcome, and nothing confirmed is lost."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from delayq import FixedBackoff, Message, SQLiteStore, Topology, Worker
from delayq.aio import AsyncConsumer
from delayq.cli import main as cli_main
from delayq.consume.delivery import H_DEAD_LETTER_REASON, H_ERROR_TYPE
from delayq.errors import HandlersStuck, InvalidInput
from delayq.sync import Consumer, Publisher, apply_topology
from tests.integration.conftest import SyncConsumerHandle

DEAD_URL = "amqp://guest:guest@127.0.0.1:1/"  # nothing listens: building must not connect


def _topology() -> Topology:
    return Topology(namespace="mis", destinations=[{"queue": "mis.work", "bindings": ["job.#"]}])


def until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _publish(url: str, topo: Topology, *messages: Message) -> None:
    with Publisher(url, topo) as pub:
        pub.publish_many(list(messages))


def _raw(url: str, queue: str) -> list[tuple[Any, Any]]:
    """(method, properties) of every message left in ``queue``, taken off it."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        got = []
        while True:
            method, props, _ = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            got.append((method, props))
    finally:
        connection.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# Options, refused before anything is consumed ---------------------------------------


@pytest.mark.parametrize("bad", [0, -2, True, "8", 2.5])
@pytest.mark.parametrize("adapter", [Consumer, AsyncConsumer])
def test_concurrency_that_is_not_a_positive_int_is_refused(adapter: Any, bad: Any) -> None:
    with pytest.raises(InvalidInput, match="concurrency must be an int"):
        adapter(DEAD_URL, _topology(), "mis.work", lambda body: None, concurrency=bad)


@pytest.mark.parametrize("adapter", [Consumer, AsyncConsumer])
def test_concurrency_above_the_prefetch_is_refused_not_silently_capped(adapter: Any) -> None:
    with pytest.raises(InvalidInput, match="more than prefetch 5"):
        adapter(DEAD_URL, _topology(), "mis.work", lambda body: None, prefetch=5, concurrency=6)


def test_one_handler_call_applied_twice_is_refused_not_a_split_queue() -> None:
    """Issue 29: ``on = worker.handler("q"); on(first); on(second)`` registered both, and
    ``delayq worker`` ran "2 handlers (q, q)" that shared the queue (9 of 10 to second)."""

    def first(body: Any) -> None: ...

    def second(body: Any) -> None: ...

    worker = Worker(_topology())
    on = worker.handler("mis.work")
    on(first)
    with pytest.raises(InvalidInput, match=r"already has a handler, .*first: a second one"):
        on(second)
    with pytest.raises(InvalidInput, match="already has a handler"):
        worker.handler("mis.work")
    assert [r.handler for r in worker.registrations] == [first]


def test_a_worker_refuses_bad_concurrency_before_connecting() -> None:
    worker = Worker(_topology())
    worker.handler("mis.work")(lambda body: None)
    with pytest.raises(InvalidInput, match="concurrency"):  # not ConnectionFailed
        worker.run(DEAD_URL, prefetch=4, concurrency=8)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--concurrency", "0"], "concurrency"),
        (["--prefetch", "5", "--concurrency", "10"], "more than prefetch"),
    ],
)
def test_the_worker_command_exits_2_on_bad_concurrency(
    options: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(["worker", "tests.misuse.consume_app", "--url", DEAD_URL, *options])
    assert code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("adapter", [Consumer, AsyncConsumer])
def test_a_bare_number_handler_timeout_is_refused(adapter: Any) -> None:
    with pytest.raises(InvalidInput):
        adapter(DEAD_URL, _topology(), "mis.work", lambda body: None, handler_timeout=30)


def test_handlers_a_thread_cannot_run_are_refused_by_the_sync_consumer() -> None:
    async def coroutine(body: Any) -> None: ...

    def generator(body: Any) -> Any:
        yield body

    with pytest.raises(InvalidInput, match="AsyncConsumer"):
        Consumer(DEAD_URL, _topology(), "mis.work", coroutine)
    for adapter in (Consumer, AsyncConsumer):
        with pytest.raises(InvalidInput, match="generator function"):
            adapter(DEAD_URL, _topology(), "mis.work", generator)


# Against a real broker ---------------------------------------------------------------


def test_an_async_function_behind_a_wrapper_fails_instead_of_being_acked(
    make_topology, rabbitmq_url, start_consumer, collect
):
    """``lambda body: send(body)`` with an async ``send`` returns a coroutine that nobody
    awaits: the delivery must fail with the reason, not count as done."""
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    dlq = collect(f"{queue}.dlq")
    ran: list[Any] = []

    async def send(body: Any) -> None:
        ran.append(body)

    consumer = start_consumer(
        topo, queue, lambda body: send(body), policy=FixedBackoff(delay="1s", max_attempts=1)
    )
    _publish(rabbitmq_url, topo, Message({"n": 1}, "job.w", "0s", message_id="wrapped"))
    arrivals = dlq.wait(1, 20)
    assert [a.message_id for a in arrivals] == ["wrapped"]
    assert _text(arrivals[0].headers[H_ERROR_TYPE]).endswith("InvalidInput")
    assert consumer.stats.handled == 0 and ran == []


def test_a_handler_that_never_returns_with_concurrency_1_is_retried_and_the_queue_goes_on(
    make_topology, rabbitmq_url, collect
):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    dlq = collect(f"{queue}.dlq")
    release = threading.Event()
    threads: set[str] = set()
    done: Counter[str] = Counter()

    def handler(body: dict[str, str]) -> None:
        threads.add(threading.current_thread().name)
        if body["id"] == "stuck":
            release.wait(120)  # forever, as far as the consumer knows
            return
        done[body["id"]] += 1

    handle = SyncConsumerHandle(
        Consumer(
            rabbitmq_url, topo, queue, handler, concurrency=1, handler_timeout="1s",
            policy=FixedBackoff(delay="1s", max_attempts=2),
        )
    )
    try:
        _publish(
            rabbitmq_url, topo,
            *[Message({"id": i}, "job.s", "0s", message_id=i) for i in ("stuck", "a", "b", "c")],
        )
        # Two attempts, each abandoned after its timeout, then the DLQ; the others run.
        arrivals = dlq.wait(1, 30)
        assert [a.message_id for a in arrivals] == ["stuck"]
        assert _text(arrivals[0].headers[H_DEAD_LETTER_REASON]) == "exhausted"
        assert _text(arrivals[0].headers[H_ERROR_TYPE]).endswith("HandlerTimeout")
        assert until(lambda: len(done) == 3, 20)
        assert done == Counter({"a": 1, "b": 1, "c": 1})
        assert len(threads) <= 3, f"handler threads grew: {sorted(threads)}"
        started = time.monotonic()
        handle.stop()  # the stuck threads are daemons: they hold up neither stop nor exit
        assert time.monotonic() - started < 15
    finally:
        release.set()


def test_a_consumer_whose_every_thread_is_stuck_says_so_dead_letters_the_hung_and_stops(
    make_topology, rabbitmq_url, collect, caplog: pytest.LogCaptureFixture
):
    """Three messages whose handler never returns, each hanging twice (an attempt and
    the retry beside it), fill every thread (2 working + 4 replacements): their next
    attempts go to the DLQ without a thread, the consumer logs an error, counts the
    stuck threads, and after ``stuck_grace`` stops with HandlersStuck, the messages it
    could not start back in the queue for a fresh process."""
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    dlq = collect(f"{queue}.dlq")
    release = threading.Event()
    done: Counter[str] = Counter()

    def handler(body: dict[str, str]) -> None:
        if body["id"].startswith("hang"):
            release.wait(120)  # forever, as far as the consumer knows
            return
        done[body["id"]] += 1

    consumer = Consumer(
        rabbitmq_url, topo, queue, handler, concurrency=2, handler_timeout="1s",
        stuck_grace="5s", policy=FixedBackoff(delay="1s", max_attempts=8),
    )  # fmt: skip
    handle = SyncConsumerHandle(consumer)
    hangs = [f"hang-{i}" for i in range(1, 4)]
    try:
        with caplog.at_level("ERROR", logger="delayq.consumer"):
            _publish(rabbitmq_url, topo, *[
                Message({"id": i}, "job.s", "0s", message_id=i) for i in hangs
            ])  # fmt: skip
            # Two attempts each fill the 6 threads; a later one goes to the DLQ unrun.
            arrivals = dlq.wait(3, 30)
            assert sorted(a.message_id for a in arrivals) == hangs
            for arrival in arrivals:
                assert _text(arrival.headers[H_DEAD_LETTER_REASON]) == "handlers-stuck"
                assert _text(arrival.headers[H_ERROR_TYPE]).endswith("HandlersStuck")
                said = _text(arrival.headers["delayq-error-message"])
                assert re.search(r"not run: its previous attempt \(attempt \d\) ran past", said)
            assert consumer.stats.stuck_handlers == 6
            assert consumer.stats.stuck_since is not None
            assert any(
                "every handler thread of the consumer of" in r.getMessage() for r in caplog.records
            )
            # Ordinary messages cannot start; after stuck_grace the consumer gives up.
            _publish(rabbitmq_url, topo, *[
                Message({"id": f"ok-{n}"}, "job.s", "0s", message_id=f"ok-{n}") for n in range(5)
            ])  # fmt: skip
            assert until(lambda: not handle._thread.is_alive(), 30), "stopped by itself"
            with pytest.raises(HandlersStuck, match=r"was stuck .* for 5 s \(stuck_grace\)"):
                handle.stop()
        assert done == Counter()
        assert until(lambda: _ready(rabbitmq_url, queue) == 5, 20), "back in the queue"
    finally:
        release.set()

    # A fresh consumer (a fresh process, its threads free) handles them.
    fresh = SyncConsumerHandle(Consumer(rabbitmq_url, topo, queue, handler, concurrency=2))
    try:
        assert until(lambda: len(done) == 5, 20)
        assert set(done.values()) == {1}
    finally:
        fresh.stop()


def test_handlers_stuck_in_every_thread_leave_ordinary_messages_flowing(
    make_topology, rabbitmq_url, collect
):
    """N messages whose handler never returns, N = the thread count: past
    handler_timeout each hung thread is replaced (up to 2N replacements), a retry runs
    beside its hung attempt and hangs too, and a third attempt does not run while two
    hang. Ordinary messages published once the hung ones hang twice all get handled
    (issue 48: they used to wait until stuck_grace stopped the consumer)."""
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    dlq = collect(f"{queue}.dlq")
    release = threading.Event()
    hung: Counter[str] = Counter()
    done: Counter[str] = Counter()
    threads: set[str] = set()
    n = 2

    def handler(body: dict[str, str]) -> None:
        threads.add(threading.current_thread().name)
        if body["id"].startswith("hang"):
            hung[body["id"]] += 1
            release.wait(120)  # forever, as far as the consumer knows
            return
        done[body["id"]] += 1

    consumer = Consumer(
        rabbitmq_url, topo, queue, handler, concurrency=n, handler_timeout="1s",
        stuck_grace="60s", policy=FixedBackoff("1s", max_attempts=4),
    )  # fmt: skip
    handle = SyncConsumerHandle(consumer)
    try:
        hangs = [f"hang-{i}" for i in range(n)]
        _publish(rabbitmq_url, topo, *[
            Message({"id": i}, "job.s", "0s", message_id=i) for i in hangs
        ])  # fmt: skip
        # Each has timed out twice, its attempts hanging in 2N threads: the old code had
        # N spare ones, all stuck now.
        assert until(lambda: consumer.stats.retried >= 2 * n, 30), consumer.stats
        ordinary = [f"ok-{i}" for i in range(20)]
        _publish(rabbitmq_url, topo, *[
            Message({"id": i}, "job.s", "0s", message_id=i) for i in ordinary
        ])  # fmt: skip
        assert until(lambda: len(done) == 20, 30), f"handled {sorted(done)}"
        assert done == Counter(ordinary)
        assert hung == Counter(hangs * 2), "a third attempt ran beside two hung ones"
        assert len(threads) <= 3 * n, f"handler threads grew: {sorted(threads)}"
        assert consumer.stats.stuck_since is None and consumer.stats.stuck_handlers == 2 * n
        # The hung messages' attempts run out without a thread each: to the DLQ.
        arrivals = dlq.wait(n, 30)
        assert sorted(a.message_id for a in arrivals) == hangs
        for arrival in arrivals:
            assert _text(arrival.headers[H_DEAD_LETTER_REASON]) == "exhausted"
            said = _text(arrival.headers["delayq-error-message"])
            assert "not run: attempts 1, 2 of this message are still running" in said
        handle.stop()
    finally:
        release.set()


def test_a_bare_number_stuck_grace_is_refused_and_none_is_taken() -> None:
    with pytest.raises(InvalidInput, match="stuck_grace"):
        Consumer(DEAD_URL, _topology(), "mis.work", lambda body: None, stuck_grace=30)
    Consumer(DEAD_URL, _topology(), "mis.work", lambda body: None, stuck_grace=None)


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
def test_a_handler_raising_a_base_exception_stops_the_consumer_and_loses_nothing(
    make_topology, rabbitmq_url, tmp_path: Path, raised: BaseException
):
    """The sync consumer stops as asked, ``run()`` raises it; the other handlers in flight
    finish, and the message goes back to the queue with its claim given back."""
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    store = SQLiteStore(tmp_path / "keys.db")
    done: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(body: dict[str, str]) -> None:
        if body["id"] == "exit":
            raise raised
        time.sleep(0.2)
        with lock:
            done[body["id"]] += 1

    consumer = Consumer(rabbitmq_url, topo, queue, handler, store=store, concurrency=4,
                        prefetch=4)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            consumer.run(install_signal_handlers=False)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert consumer.started.wait(30)
    ids = ["a", "b", "exit", "c"]
    _publish(rabbitmq_url, topo, *[Message({"id": i}, "job.x", "0s", message_id=i) for i in ids])
    thread.join(30)
    assert not thread.is_alive()
    assert len(errors) == 1 and type(errors[0]) is type(raised)
    assert set(done) <= {"a", "b", "c"} and max(done.values(), default=1) == 1
    # Nothing lost: a second consumer handles what is left at once (claim released, so
    # not deferred), each message once.
    second = SyncConsumerHandle(
        Consumer(rabbitmq_url, topo, queue, lambda body: done.update([body["id"]]), store=store)
    )
    try:
        assert until(lambda: set(done) == {"a", "b", "c", "exit"}, 20), done
    finally:
        second.stop()
    assert done == Counter({"a": 1, "b": 1, "c": 1, "exit": 1})
    assert second.stats.retried == 0, "the exiting handler's claim was left behind"


def test_concurrency_1_runs_handlers_one_at_a_time_for_code_that_is_not_thread_safe(
    make_topology, rabbitmq_url, start_consumer
):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    lock = threading.Lock()
    running, peak = [0], [0]

    def handler(body: Any) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1

    consumer = start_consumer(topo, queue, handler, concurrency=1)
    _publish(rabbitmq_url, topo, *[Message({"n": n}, "job.o", "0s") for n in range(30)])
    assert until(lambda: consumer.stats.handled == 30, 30)
    assert peak[0] == 1


def test_one_store_shared_by_concurrent_handlers_of_two_consumers_runs_each_effect_once(
    make_topology, rabbitmq_url, tmp_path: Path
):
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    store = SQLiteStore(tmp_path / "shared.db")
    effects: Counter[int] = Counter()
    lock = threading.Lock()

    def handler(body: dict[str, int]) -> None:
        time.sleep(0.002)
        with lock:
            effects[body["n"]] += 1

    handles = [
        SyncConsumerHandle(Consumer(rabbitmq_url, topo, queue, handler, store=store))
        for _ in range(2)
    ]
    try:
        messages = [Message({"n": n}, "job.d", "0s", message_id=f"d{n}") for n in range(150)]
        _publish(rabbitmq_url, topo, *messages, *messages)  # every message twice
        assert until(lambda: sum(h.stats.handled + h.stats.duplicates for h in handles) >= 300, 60)
    finally:
        for handle in handles:
            handle.stop()
    assert effects == Counter(range(150)), "an effect ran twice or never"


def _ready(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def test_a_graceful_stop_hands_back_no_prefetched_message_to_be_charged(
    make_topology, rabbitmq_url, start_consumer
):
    """A quorum queue counts every message a consumer gives back unsettled towards its
    delivery limit: a stop settles what it prefetched instead of handing it back, so
    what is left in the queue was never delivered, and nothing is lost."""
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    go = threading.Event()
    seen: Counter[int] = Counter()
    lock = threading.Lock()

    def handler(body: dict[str, int]) -> None:
        go.wait(30)
        with lock:
            seen[body["n"]] += 1

    consumer = start_consumer(topo, queue, handler, prefetch=10, concurrency=2)
    _publish(rabbitmq_url, topo, *[Message({"n": n}, "job.g", "0s") for n in range(60)])
    # The consumer holds a full window (10 and the delivery that ended its cautious
    # start), two handlers waiting: nothing is on the wire to it when it stops.
    assert until(lambda: _ready(rabbitmq_url, queue) <= 60 - 10, 20)
    stopping = threading.Thread(target=consumer.stop, kwargs={"timeout_s": 30})
    stopping.start()
    # Both feeds stop consuming once the broker confirmed the cancel (the queue's
    # consumer count still shows a cancelled consumer holding deliveries).
    assert until(lambda: not consumer.consumer.feed.consuming, 20)
    go.set()
    stopping.join(60)
    left = _raw(rabbitmq_url, queue)
    charged = [m for m, p in left if m.redelivered or (p.headers or {}).get("x-delivery-count")]
    assert charged == [], f"{len(charged)} prefetched messages were handed back"
    assert len(seen) >= 10 and len(seen) + len(left) == 60 and max(seen.values()) == 1


def test_a_worker_whose_plain_handler_raises_system_exit_stops_and_exits_with_it(
    make_topology, rabbitmq_url
):
    """``sys.exit(5)`` in a handler run by ``delayq worker``: the worker stops (not just
    that queue's consumer, silently) and exits with 5; the message is not lost."""
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    worker = Worker(topo)

    @worker.handler(queue)
    def handle(body: Any) -> None:
        raise SystemExit(5)

    stop = threading.Event()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(rabbitmq_url, stop=stop)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    _publish(rabbitmq_url, topo, Message({"n": 1}, "job.e", "0s", message_id="exits"))
    try:
        assert until(lambda: not thread.is_alive(), 30), "the worker went on without the queue"
    finally:
        stop.set()
        thread.join(60)
    assert len(raised) == 1 and isinstance(raised[0], SystemExit) and raised[0].code == 5
    assert [p.message_id for _, p in _raw(rabbitmq_url, queue)] == ["exits"]


def test_a_worker_whose_sync_handlers_are_all_stuck_stops_with_handlers_stuck(
    make_topology, rabbitmq_url
):
    """Under a supervisor, a worker whose consumer can start no handler ends non-zero
    (``delayq worker`` exits 1 on a delayq error) instead of sitting idle for ever."""
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    release = threading.Event()
    worker = Worker(topo)

    @worker.handler(queue, concurrency=1, handler_timeout="1s", stuck_grace="2s",
                    policy=FixedBackoff(delay="1s", max_attempts=8))  # fmt: skip
    def handle(body: Any) -> None:
        release.wait(120)

    stop = threading.Event()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(rabbitmq_url, stop=stop)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    # Two of them: one thread and its two replacements are all they can hang in.
    _publish(rabbitmq_url, topo, *[
        Message({"n": n}, "job.h", "0s", message_id=f"hangs-{n}") for n in (1, 2)
    ])  # fmt: skip
    try:
        assert until(lambda: not thread.is_alive(), 60), "the worker sat stuck"
    finally:
        release.set()
        stop.set()
        thread.join(60)
    assert len(raised) == 1 and isinstance(raised[0], HandlersStuck), raised
    assert f"consumer of {queue!r} (3) was stuck" in str(raised[0])


def test_a_stop_requested_before_or_while_a_sync_consumer_starts_is_not_lost(
    make_topology, rabbitmq_url
):
    """``request_stop()`` right after handing ``run`` to a thread (before it started, or
    while it connects): ``run`` returns, instead of consuming forever."""
    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)
    for _ in range(2):  # the same consumer, stopped twice: each request counts once
        consumer = Consumer(rabbitmq_url, topo, queue, lambda body: None)
        consumer.request_stop()  # before run() began
        runner = threading.Thread(target=consumer.run, kwargs={"install_signal_handlers": False})
        runner.start()
        runner.join(30)
        assert not runner.is_alive(), "run() did not see the stop requested before it"
    # While run() is starting: the request lands during the connect.
    consumer = Consumer(rabbitmq_url, topo, queue, lambda body: None)
    runner = threading.Thread(target=consumer.run, kwargs={"install_signal_handlers": False})
    runner.start()
    consumer.request_stop()
    runner.join(30)
    assert not runner.is_alive()
    # A consumer that served and stopped runs again: the old request is forgotten.
    runner = threading.Thread(target=consumer.run, kwargs={"install_signal_handlers": False})
    runner.start()
    assert consumer.started.wait(30) and runner.is_alive()
    consumer.request_stop()
    runner.join(30)
    assert not runner.is_alive()


def test_a_stop_requested_before_or_while_an_async_consumer_starts_is_not_lost(
    make_topology, rabbitmq_url
):
    """The asyncio twin: ``request_stop()`` after ``create_task(consumer.run())`` but
    before the task ran (or while it connects), and from another thread."""
    import asyncio

    topo = make_topology(["1s"])
    queue = f"{topo.namespace}.work"
    apply_topology(topo, rabbitmq_url)

    async def scenario() -> None:
        consumer = AsyncConsumer(rabbitmq_url, topo, queue, lambda body: None)
        task = asyncio.create_task(consumer.run(install_signal_handlers=False))
        consumer.request_stop()  # the task has not started yet
        await asyncio.wait_for(task, 30)
        task = asyncio.create_task(consumer.run(install_signal_handlers=False))
        await asyncio.sleep(0)  # now it is connecting
        consumer.request_stop()
        await asyncio.wait_for(task, 30)
        # From another thread, once it consumes: a fresh run, the old request forgotten.
        task = asyncio.create_task(consumer.run(install_signal_handlers=False))
        while not consumer.feed.consuming:
            await asyncio.sleep(0.02)
        assert not task.done()
        await asyncio.to_thread(consumer.request_stop)
        await asyncio.wait_for(task, 30)

    asyncio.run(scenario())
