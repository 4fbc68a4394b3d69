"""``Publisher.publish`` from many threads at once, through one publisher, on a real
broker: every caller hears its own outcome (its confirm, or the error a single publish
raises; a missing exchange fails only the callers publishing there), nothing confirmed
is lost when the broker restarts mid-way, ``close()`` lets waiting callers finish and
ends the I/O thread, and an interrupted caller harms nobody.

Overlap is made certain, not hoped for: the publishes go through
:class:`tests.proxy.HoldingProxy`, which holds the first one (on the blocking channel)
until the others are queued on the shared connection.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest

from delayq import Publisher, Unroutable
from delayq.errors import TopologyMissing
from delayq.local.node import LocalNode
from delayq.sync import apply_topology
from delayq.sync._shared import SharedSender
from delayq.topology.model import Topology
from tests.integration.test_restart_publish import _message_ids
from tests.proxy import HoldingProxy
from tests.waiting import wait_for

CALLERS = 100


def _callers(n: int, call: Callable[[int], Any]) -> tuple[list[threading.Thread], list[Any]]:
    """``n`` threads running ``call(i)``; each one's result or exception, by ``i``."""
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        try:
            out[i] = call(i)
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    return threads, out


def _join(threads: list[threading.Thread], timeout_s: float = 120) -> None:
    for thread in threads:
        thread.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "a caller never returned"


def _shared(pub: Publisher) -> SharedSender:
    shared = pub._sends.shared
    assert shared is not None, "no caller went through the shared connection"
    return shared


def _io_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "delayq-publisher-io"]


@pytest.fixture
def applied(rabbitmq_url: str, make_topology: Callable[..., Topology]) -> Topology:
    topo = make_topology(["1h"])
    apply_topology(topo, rabbitmq_url)
    return topo


@pytest.fixture
def held(rabbitmq_url: str) -> Iterator[HoldingProxy]:
    """A proxy holding the first publish until released."""
    with HoldingProxy(rabbitmq_url, hold_after=1) as proxy:
        yield proxy


def _overlapping(
    pub: Publisher, proxy: HoldingProxy, n: int, call: Callable[[int], Any]
) -> list[Any]:
    """``n`` callers of ``call``, the first held on the blocking channel until the
    others wait on the shared connection; their results."""
    first, out0 = _callers(1, call)
    wait_for(proxy.holding.is_set, 30, "the first publish held")
    rest, out = _callers(n - 1, lambda i: call(i + 1))
    wait_for(lambda: pub._sends.shared is not None, 30, "the shared connection opened")

    def handed_over() -> int:
        # Waiting on the shared connection, or answered already: a stream checks each
        # exchange (no publish, so not held) before it sends there, and a missing one
        # fails its callers while the others are still arriving.
        return _shared(pub).waiting + sum(r is not None for r in out)

    wait_for(lambda: handed_over() >= n - 1, 60, lambda: f"{handed_over()} handed over")
    proxy.release()
    _join(first + rest)
    return out0 + out


def test_a_hundred_threads_share_one_publisher_each_message_confirmed_once(
    rabbitmq_url: str, applied: Topology, held: HoldingProxy
) -> None:
    each = 20
    tier = applied.tier_name(applied.ladder.tiers[0])
    with Publisher(held.url, applied) as pub:

        def call(c: int) -> list[str]:
            return [
                pub.publish(
                    {"c": c, "n": n}, "job.threads", "1h", message_id=f"t{c}-{n}"
                ).message_id
                for n in range(each)
            ]

        out = _overlapping(pub, held, CALLERS, call)
    errors = [r for r in out if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    assert out == [[f"t{c}-{n}" for n in range(each)] for c in range(CALLERS)]
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        depth = connection.channel().queue_declare(tier, passive=True).method.message_count
    finally:
        connection.close()
    assert depth == CALLERS * each
    ids = _message_ids(rabbitmq_url, tier)
    assert ids == Counter({f"t{c}-{n}": 1 for c in range(CALLERS) for n in range(each)})
    assert not _io_threads(), "close() left the I/O thread running"


def test_good_and_unroutable_messages_from_many_threads_each_get_their_own_outcome(
    rabbitmq_url: str, make_topology: Callable[..., Topology], held: HoldingProxy
) -> None:
    topo = make_topology(["1s", "30s"])
    apply_topology(topo, rabbitmq_url)
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:  # the 1s tier's queue gone: its messages come back unroutable
        connection.channel().queue_delete(topo.tier_name(topo.ladder.tiers[0]))
    finally:
        connection.close()
    with Publisher(held.url, topo, publish_attempts=1) as pub:

        def call(c: int) -> list[Any]:
            results: list[Any] = []
            for n in range(5):
                delay = "1s" if (c + n) % 2 else "30s"
                try:
                    results.append(pub.publish(b"x", "job.mixed", delay, message_id=f"m{c}-{n}"))
                except Unroutable as exc:
                    results.append(exc)
            return results

        out = _overlapping(pub, held, 40, call)
    for c, results in enumerate(out):
        assert isinstance(results, list), results
        for n, result in enumerate(results):
            if (c + n) % 2:
                assert isinstance(result, Unroutable), (c, n, result)
                assert result.message_id == f"m{c}-{n}"
            else:
                assert result.message_id == f"m{c}-{n}" and not isinstance(result, Exception)
    routable = {f"m{c}-{n}" for c in range(40) for n in range(5) if not (c + n) % 2}
    ids = _message_ids(rabbitmq_url, topo.tier_name(topo.ladder.tiers[1]))
    assert ids == Counter(dict.fromkeys(routable, 1))


def test_a_missing_exchange_fails_only_the_threads_publishing_there(
    rabbitmq_url: str, make_topology: Callable[..., Topology], held: HoldingProxy
) -> None:
    """The shared connection's channel closes at the missing exchange: its callers get
    ``TopologyMissing``, as a single publish does; the others' messages are sent again
    on a fresh connection and confirmed."""
    topo = make_topology(["1s", "30s"])
    apply_topology(topo, rabbitmq_url)
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        connection.channel().exchange_delete(topo.tier_name(topo.ladder.tiers[0]))
    finally:
        connection.close()
    with Publisher(held.url, topo) as pub:

        def call(c: int) -> Any:
            delay = "1s" if c % 4 == 1 else "30s"
            try:
                return pub.publish(b"x", "job.gone", delay, message_id=f"g{c}")
            except TopologyMissing as exc:
                return exc

        out = _overlapping(pub, held, 20, call)
    for c, result in enumerate(out):
        if c % 4 == 1:
            assert isinstance(result, TopologyMissing), (c, result)
        else:
            assert not isinstance(result, BaseException), (c, result)
            assert result.message_id == f"g{c}"
    ids = _message_ids(rabbitmq_url, topo.tier_name(topo.ladder.tiers[1]))
    assert set(ids) == {f"g{c}" for c in range(20) if c % 4 != 1}


def test_close_while_threads_wait_gives_each_its_outcome_and_ends_the_io_thread(
    rabbitmq_url: str, applied: Topology, held: HoldingProxy
) -> None:
    tier = applied.tier_name(applied.ladder.tiers[0])
    pub = Publisher(held.url, applied)
    call = lambda i: pub.publish({"i": i}, "job.close", "1h", message_id=f"c{i}")  # noqa: E731
    first, out0 = _callers(1, call)
    wait_for(held.holding.is_set, 30, "the first publish held")
    rest, out = _callers(19, lambda i: call(i + 1))
    wait_for(lambda: pub._sends.shared is not None and _shared(pub).waiting == 19, 60, "19 waiting")
    shared = _shared(pub)
    closing, _ = _callers(1, lambda _i: pub.close())
    wait_for(lambda: pub._sends.shared is None, 30, "close() took the shared connection")
    assert closing[0].is_alive(), "close() returned while callers were still waiting"
    held.release()
    _join(closing + first + rest)
    receipts = out0 + out
    assert [r.message_id for r in receipts] == [f"c{i}" for i in range(20)], receipts
    assert shared.threads == 0 and not _io_threads()
    # A publish after close reconnects, as the docstring says.
    assert pub.publish({"i": 20}, "job.close", "1h", message_id="c20").message_id == "c20"
    pub.close()
    assert _message_ids(rabbitmq_url, tier) == Counter({f"c{i}": 1 for i in range(21)})


def test_an_interrupted_caller_leaves_the_others_and_the_publisher_working(
    rabbitmq_url: str, applied: Topology, held: HoldingProxy
) -> None:
    """A caller waiting on the shared connection gets a signal (Ctrl-C in the main
    thread): it raises there; its message is sent at most once; the rest goes on."""

    class Interrupted(Exception):
        pass

    def interrupt(_sig: int, _frame: object) -> None:
        raise Interrupted

    tier = applied.tier_name(applied.ladder.tiers[0])
    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        with Publisher(held.url, applied) as pub:
            call = lambda i: pub.publish({"i": i}, "job.int", "1h", message_id=f"i{i}")  # noqa: E731
            first, out0 = _callers(1, call)
            wait_for(held.holding.is_set, 30, "the first publish held")
            main = threading.main_thread().ident
            assert main == threading.get_ident()

            def kill_when_waiting(_i: int) -> None:
                wait_for(
                    lambda: pub._sends.shared is not None and _shared(pub).waiting == 1,
                    30,
                    "main waiting",
                )
                assert main is not None
                signal.pthread_kill(main, signal.SIGINT)

            killer, _ = _callers(1, kill_when_waiting)
            with pytest.raises(Interrupted):
                call(1)
            _join(killer)
            held.release()
            _join(first)
            others, out = _callers(10, lambda i: call(i + 2))
            _join(others)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert [r.message_id for r in out0 + out] == [f"i{i}" for i in (0, *range(2, 12))]
    ids = _message_ids(rabbitmq_url, tier)
    assert ids.pop("i1", 0) <= 1
    assert ids == Counter({f"i{i}": 1 for i in (0, *range(2, 12))})


@pytest.mark.timeout(300)
def test_a_broker_restart_mid_way_loses_nothing_confirmed(
    local_rabbitmq_node: LocalNode, make_topology: Callable[..., Topology]
) -> None:
    node = local_rabbitmq_node
    topo = make_topology(["1h"])
    apply_topology(topo, node.url)
    each = 30
    with (
        HoldingProxy(node.url, hold_after=CALLERS * each // 3) as proxy,
        Publisher(proxy.url, topo) as pub,
    ):

        def call(c: int) -> list[str]:
            return [
                pub.publish({"c": c}, "job.restart", "1h", message_id=f"r{c}-{n}").message_id
                for n in range(each)
            ]

        threads, out = _callers(CALLERS, call)
        wait_for(proxy.holding.is_set, 120, "a third of the publishes through")
        node.restart()  # the proxy lets the node close both connections, then they resume
        _join(threads, 180)
        assert pub._sends.shared is not None
    errors = [r for r in out if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    sent = {f"r{c}-{n}" for c in range(CALLERS) for n in range(each)}
    ids = _message_ids(node.url, topo.tier_name(topo.ladder.tiers[0]))
    assert set(ids) == sent, f"{len(sent - set(ids))} confirmed messages lost"
    duplicates = sum(ids.values()) - len(sent)
    assert duplicates <= CALLERS, f"{duplicates} duplicates: more than were in flight"
