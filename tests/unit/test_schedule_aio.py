"""``AsyncSchedule`` (issue 51): the schedule index's reads and changes on asyncio, on
the memory broker, with a blocking store (SQLite, read in a thread) and the in-memory
one: reschedule by id alone, a promote handled once, a purge by label none of whose
messages is handled, a cancel, and another namespace's ids refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from delayq import InMemoryStore, Message, Topology
from delayq.errors import InvalidInput
from delayq.schedule.aio import AsyncSchedule
from delayq.schedule.base import ScheduleStore
from delayq.schedule.entry import State
from delayq.schedule.memory import MemorySchedule
from delayq.schedule.query import Query
from delayq.schedule.record import ScheduleIndex
from delayq.schedule.sqlite import SQLiteSchedule
from delayq.testing import MemoryBroker

TOPOLOGY = Topology(
    namespace="shop",
    ladder=["1m", "30m", "1h"],
    destinations=[{"queue": "orders", "bindings": ["order.*"]}],
)


@pytest.fixture(params=["memory", "sqlite"])
def index(request: pytest.FixtureRequest, tmp_path: Path) -> ScheduleStore:
    return MemorySchedule() if request.param == "memory" else SQLiteSchedule(tmp_path / "i.db")


def test_reads_and_changes_on_asyncio(index: ScheduleStore) -> None:
    handled: list[Any] = []
    store = InMemoryStore()
    with MemoryBroker() as broker:
        broker.apply(TOPOLOGY)
        broker.consumer(TOPOLOGY, "orders", handled.append, store=store)

        async def scenario() -> None:
            tenant = lambda m: {"tenant": m.headers["tenant"]}  # noqa: E731
            publisher = broker.async_publisher(
                TOPOLOGY, store=store, schedule=ScheduleIndex(index, labels=tenant, keep_bodies=99)
            )
            await publisher.publish_many(
                [Message(n, "order.remind", "25m", message_id=f"o{n}",
                         headers={"tenant": "acme" if n < 4 else "globex"}) for n in range(8)]
            )  # fmt: skip
            schedule = AsyncSchedule(index, publisher)
            assert await schedule.count() == 8
            assert [e.id for e in await schedule.list(Query(labels={"tenant": "acme"}))] == [
                "o0", "o1", "o2", "o3"
            ]  # fmt: skip
            (moved,) = await schedule.reschedule(["o4"], "50m")
            assert moved.moved
            shown = await schedule.show("o4")
            assert shown is not None and (shown.state, shown.tier) == (State.RESCHEDULED, "1h")
            await schedule.promote(["o5"])
            (cancelled,) = await schedule.cancel(["o6"])
            assert cancelled.cancelled
            report = await schedule.purge(Query(labels={"tenant": "acme"}))
            assert report.stopped == 4
            with pytest.raises(InvalidInput, match="not in the schedule index"):
                await schedule.cancel(["nope"])
            other = Topology(namespace="shop2", ladder=["1m"],
                             destinations=[{"queue": "o2", "bindings": ["order.*"]}])  # fmt: skip
            broker.apply(other)
            elsewhere = AsyncSchedule(
                index, broker.async_publisher(other, store=store, schedule=publisher.schedule)
            )
            with pytest.raises(InvalidInput, match="in namespace 'shop', not 'shop2'"):
                await elsewhere.promote(["o7"])
            with pytest.raises(InvalidInput, match="needs AsyncSchedule"):
                await AsyncSchedule(index).cancel(["o7"])

        asyncio.run(scenario())
        broker.advance("2h")
    assert sorted(handled) == [4, 5, 7]  # o5 once, o4 at its new time, none of acme's, not o6
    index.close()
