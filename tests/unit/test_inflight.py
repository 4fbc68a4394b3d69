"""Backpressure: the in-flight bound's accounting (pure) and the asyncio publisher's waiting."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from delayq import (
    AsyncPublisher,
    InFlightLimit,
    Message,
    PublishBackpressure,
    PublishBatchError,
    Publisher,
    PublishUnconfirmed,
    Topology,
)
from delayq.aio._admission import Admission
from delayq.errors import InvalidDelay, InvalidInput
from delayq.message.envelope import H_DUE_AT, H_PUBLISHED_AT, OutgoingMessage, restamp
from delayq.message.factory import MessageFactory
from delayq.message.inflight import OVERHEAD_BYTES, InFlight, batch_window, size_of

TOPOLOGY = Topology(external_bindings=("job.#",))


def built(*sizes: int) -> list:
    factory = MessageFactory(TOPOLOGY)
    return [factory.build(b"x" * n, "job.x", "1m") for n in sizes]


# the limit ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"messages": 0},
        {"messages": -5},
        {"messages": "100"},
        {"messages": 1.5},
        {"messages": True},
        {"bytes": 0},
        {"bytes": "64MiB"},
        {"when_full": "drop"},
        {"when_full": "Block"},
    ],
)
def test_a_bad_limit_is_refused_naming_the_field(kwargs: dict) -> None:
    with pytest.raises(InvalidInput, match="InFlightLimit"):
        InFlightLimit(**kwargs)


@pytest.mark.parametrize("wait", [5, 2.5, "5", "-1s", "soon"])
def test_a_wait_without_a_unit_or_not_a_duration_is_refused(wait: object) -> None:
    with pytest.raises(InvalidDelay, match=r"InFlightLimit\.wait"):
        InFlightLimit(wait=wait)


def test_a_wait_takes_strings_and_timedeltas() -> None:
    assert InFlightLimit(wait="1m30s").wait_ms == 90_000
    assert InFlightLimit(wait=timedelta(milliseconds=250)).wait_ms == 250
    assert InFlightLimit(wait="0s").wait_ms == 0


@pytest.mark.parametrize("value", [1000, "1000", {"messages": 10}])
def test_publishers_refuse_an_in_flight_that_is_not_a_limit(value: object) -> None:
    with pytest.raises(InvalidInput, match="in_flight must be an InFlightLimit"):
        Publisher("memory://inflight-misuse", TOPOLOGY, in_flight=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="in_flight must be an InFlightLimit"):
        AsyncPublisher("memory://inflight-misuse", TOPOLOGY, in_flight=value)  # type: ignore[arg-type]


# the accounting ---------------------------------------------------------------------


def test_the_book_admits_up_to_both_bounds() -> None:
    book = InFlight(InFlightLimit(messages=3, bytes=1_000))
    assert book.fits(3, 1_000)
    book.take(2, 600)
    assert book.fits(1, 400)
    assert not book.fits(2, 10)  # messages
    assert not book.fits(1, 401)  # bytes
    book.give(2, 600)
    assert (book.messages, book.bytes) == (0, 0)


def test_anything_fits_when_nothing_is_in_flight() -> None:
    book = InFlight(InFlightLimit(messages=1, bytes=10))
    assert book.fits(50, 10**9)  # a message over the whole bound still goes, alone


def test_size_counts_the_body_and_an_allowance() -> None:
    (msg,) = built(1_000)
    assert size_of(msg) == 1_000 + OVERHEAD_BYTES


def test_a_batch_window_is_lowered_to_fit_the_byte_bound() -> None:
    assert batch_window(InFlightLimit(messages=100), built(*[10] * 500), 1_000) == 100
    limit = InFlightLimit(messages=100, bytes=10 * (1_000 + OVERHEAD_BYTES))
    assert batch_window(limit, built(*[1_000] * 500), 1_000) == 10  # by the largest size
    assert batch_window(limit, built(10, 10, 10), 1_000) == 3  # never past the batch
    assert batch_window(limit, built(10**6), 1_000) == 1  # never below one
    assert batch_window(limit, built(*[10] * 50), 7) == 7  # the caller's window


# the asyncio waiting ----------------------------------------------------------------


def test_a_publish_waits_for_room_and_goes_when_confirms_free_it() -> None:
    async def main() -> list[str]:
        admission = Admission(InFlightLimit(messages=2, bytes=10**6, wait="10s"))
        order: list[str] = []
        release = asyncio.Event()

        async def publish(name: str) -> None:
            async with admission.hold(1, 100):
                order.append(f"{name} in")
                await release.wait()

        tasks = [asyncio.create_task(publish(n)) for n in "abc"]
        while len(order) < 2:
            await asyncio.sleep(0)
        assert order == ["a in", "b in"] and admission.book.messages == 2  # c waits
        release.set()
        await asyncio.gather(*tasks)
        assert admission.book.messages == 0 and admission.book.bytes == 0
        return order

    assert asyncio.run(main()) == ["a in", "b in", "c in"]


def test_a_publish_that_waits_in_vain_raises_backpressure_and_takes_nothing() -> None:
    async def main() -> None:
        admission = Admission(InFlightLimit(messages=1, bytes=10**6, wait="50ms"))
        async with admission.hold(1, 100):
            with pytest.raises(PublishBackpressure, match="did not free room within"):
                async with admission.hold(1, 100):
                    pytest.fail("admitted past the bound")
            assert admission.book.messages == 1
        assert admission.book.messages == 0
        async with admission.hold(1, 100):  # the bound works again afterwards
            pass

    asyncio.run(main())


def test_when_full_raise_refuses_at_once() -> None:
    async def main() -> None:
        admission = Admission(InFlightLimit(messages=1, bytes=10**6, when_full="raise"))
        async with admission.hold(1, 100):
            with pytest.raises(PublishBackpressure, match="when_full='raise'"):
                async with admission.hold(1, 100):
                    pass

    asyncio.run(main())


def test_waiters_are_served_in_order_a_large_batch_is_not_overtaken() -> None:
    async def main() -> list[str]:
        admission = Admission(InFlightLimit(messages=10, bytes=10**6, wait="10s"))
        order: list[str] = []
        first = asyncio.Event()

        async def hold(name: str, count: int, until: asyncio.Event | None = None) -> None:
            async with admission.hold(count, count):
                order.append(name)
                if until is not None:
                    await until.wait()

        holder = asyncio.create_task(hold("holder", 6, first))
        await asyncio.sleep(0)
        big = asyncio.create_task(hold("big", 8))
        await asyncio.sleep(0)
        small = asyncio.create_task(hold("small", 1))  # would fit now, but big is first
        await asyncio.sleep(0)
        assert order == ["holder"]
        first.set()
        await asyncio.gather(holder, big, small)
        return order

    assert asyncio.run(main()) == ["holder", "big", "small"]


def test_a_waiter_cancelled_gives_its_place_and_room_back() -> None:
    async def main() -> None:
        admission = Admission(InFlightLimit(messages=1, bytes=10**6, wait="10s"))
        gate = asyncio.Event()

        async def hold() -> None:
            async with admission.hold(1, 1):
                await gate.wait()

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        gate.set()
        await holder
        assert admission.book.messages == 0 and not admission._waiters

    asyncio.run(main())


def test_a_waiter_cancelled_just_after_it_was_admitted_gives_the_room_back() -> None:
    async def main() -> None:
        admission = Admission(InFlightLimit(messages=1, bytes=10**6, wait="10s"))
        holding = admission.hold(1, 1)
        await holding.__aenter__()

        async def wait_for_room() -> None:
            async with admission.hold(1, 1):
                pytest.fail("ran after it was cancelled")

        waiter = asyncio.create_task(wait_for_room())
        await asyncio.sleep(0)
        await holding.__aexit__(None, None, None)  # admits the waiter (room taken for it)
        assert admission.book.messages == 1
        waiter.cancel()  # ... which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert admission.book.messages == 0

    asyncio.run(main())


# a publish that waited is stamped when it is sent --------------------------------------


class GatedLink:
    """An asyncio link that holds every send until ``gate`` opens; records what it sent."""

    clock_ms = None

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.sent: list[OutgoingMessage] = []

    async def connect(self) -> None:
        pass

    async def send(self, msg: OutgoingMessage) -> None:
        await self.gate.wait()
        self.sent.append(msg)

    async def send_batch(self, built: list[OutgoingMessage], window: int) -> None:
        await self.gate.wait()
        self.sent.extend(built)

    async def close(self) -> None:
        pass

    async def apply(self, topology: Any, *, raise_on_conflict: bool = True) -> Any:
        raise NotImplementedError


def test_a_publish_that_waited_for_room_counts_its_delay_from_when_it_is_sent() -> None:
    now = [1_000_000]
    link = GatedLink()
    pub = AsyncPublisher(
        "memory://restamp", TOPOLOGY, link=link, clock_ms=lambda: now[0],
        in_flight=InFlightLimit(messages=1, wait="10s"),
    )

    async def main() -> tuple[Any, list[Any]]:
        first = asyncio.create_task(pub.publish(b"a", "job.x", "1m"))
        await asyncio.sleep(0)
        waiting = asyncio.create_task(pub.publish_many([Message(b"b", "job.x", "1m")]))
        await asyncio.sleep(0)
        now[0] += 45_000  # 45 s pass while the batch waits for room
        link.gate.set()
        return await first, await waiting

    first, (second,) = asyncio.run(main())
    assert first.published_at_ms == 1_000_000  # it did not wait: stamped when built
    assert second.published_at_ms == 1_045_000
    sent = {m.message_id: m for m in link.sent}[second.message_id]
    assert sent.receipt == second
    assert sent.headers[H_PUBLISHED_AT] == 1_045_000
    assert sent.headers[H_DUE_AT] == 1_045_000 + 60_000
    assert sent.timestamp_s == 1_045


def test_restamp_moves_only_the_times() -> None:
    (msg,) = built(10)
    moved = restamp(msg, msg.receipt.published_at_ms + 5_000)
    assert restamp(msg, msg.receipt.published_at_ms) is msg
    assert moved.receipt.published_at_ms == msg.receipt.published_at_ms + 5_000
    assert moved.headers[H_DUE_AT] - msg.headers[H_DUE_AT] == 5_000
    assert {k: v for k, v in moved.headers.items() if k not in (H_DUE_AT, H_PUBLISHED_AT)} == {
        k: v for k, v in msg.headers.items() if k not in (H_DUE_AT, H_PUBLISHED_AT)
    }
    assert (moved.body, moved.exchange, moved.routing_key, moved.message_id) == (
        msg.body, msg.exchange, msg.routing_key, msg.message_id
    )


class BrokenLink(GatedLink):
    """A link that lets a client library's bare error out (aiormq's drain future did)."""

    async def send(self, msg: OutgoingMessage) -> None:
        raise Exception("drain future failed")

    async def send_batch(self, built: list[OutgoingMessage], window: int) -> None:
        raise Exception("drain future failed")


def test_a_bare_error_from_a_link_is_reported_as_unconfirmed_never_raised_bare() -> None:
    pub = AsyncPublisher("memory://broken", TOPOLOGY, link=BrokenLink())

    async def main() -> None:
        with pytest.raises(PublishUnconfirmed, match="may or may not have reached") as one:
            await pub.publish(b"a", "job.x", "1m", message_id="one")
        assert one.value.message_id == "one"
        with pytest.raises(PublishBatchError) as batch:
            await pub.publish_many([Message(b"b", "job.x", "1m") for _ in range(3)])
        assert batch.value.receipts == [None, None, None]
        assert all(isinstance(e, PublishUnconfirmed) for e in batch.value.failures.values())
        assert pub._admission.book.messages == 0  # the room went back

    asyncio.run(main())
