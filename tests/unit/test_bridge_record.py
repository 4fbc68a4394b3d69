"""The bridge's schedule index (``Bridge(schedule=)``, ``delayq bridge --schedule-index``),
on a real event loop with a stand-in wire that records what the bridge publishes and
acks (no broker): each forward's entry is pending before it is published and moved
before its delivery is acked; an index that cannot take a pending write publishes
nothing and puts the delivery back; one id it refuses does not take the others back
with it; a move that fails still acks (the message is in its tier), logged."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from pamqp import commands, header

from delayq import Topology
from delayq.aio._bridgerecord import BridgeRecord
from delayq.aio._relaying import Relaying
from delayq.aio._wire import CONSUME_CHANNEL
from delayq.errors import StoreError
from delayq.intake import Relay
from delayq.intake.bridging import BridgeStats
from delayq.schedule.entry import Entry, State
from delayq.schedule.memory import MemorySchedule
from delayq.schedule.query import Query
from delayq.schedule.record import ScheduleIndex

TOPO = Topology(
    namespace="shop",
    ladder=["1m"],
    destinations=[{"queue": "emails", "bindings": ["email.welcome"]}],
    intakes=[{"exchange": "delayed", "type": "direct"}],
)


class Store(MemorySchedule):
    """A memory index that logs its writes and fails as told."""

    def __init__(self, log: list[tuple[str, object]]) -> None:
        super().__init__()
        self.log = log
        self.refuse_ids: set[str] = set()
        self.fail_moves = False

    def add(self, entries: Sequence[Entry]) -> list[bool]:
        if {e.id for e in entries} & self.refuse_ids:
            raise StoreError("the index refused it")
        self.log.append(("pending", sorted(e.id for e in entries)))
        return super().add(entries)

    def move(self, ids: Sequence[str], to: State, **kwargs: Any) -> list[State | None]:
        if self.fail_moves:
            raise StoreError("the index went away")
        self.log.append((to.value, sorted(ids)))
        return super().move(ids, to, **kwargs)


class Wire:
    """What the bridge uses of a wire: publishes and acks recorded, one consuming channel."""

    def __init__(self, loop: asyncio.AbstractEventLoop, log: list[tuple[str, object]]) -> None:
        self.closed = None
        self.readers = {CONSUME_CHANNEL: object()}
        self.loop = loop
        self.log = log
        self.frame_max = 131072

    def send_frames(self, frames: bytes) -> None:
        # An ack frame: class 60, method 80; a reject: 60, 90 (after the 7-byte header).
        method = int.from_bytes(frames[9:11], "big")
        tag = int.from_bytes(frames[11:19], "big")
        self.log.append(("ack" if method == 80 else "reject", tag))

    def publish(self, frames: bytes, sink: Any, token: int, route: Any) -> None:
        self.log.append(("published", token))


def _header(message_id: str) -> bytes:
    props = commands.Basic.Properties(message_id=message_id, headers={"x-delay": 30_000})
    return header.ContentHeader(0, 2, props).marshal()


async def _bridge(store: Store, log: list[tuple[str, object]]) -> tuple[Relaying, Wire]:
    bridge = Relaying(
        Relay(TOPO, TOPO.intakes[0]), BridgeStats(), BridgeRecord(ScheduleIndex(store), TOPO)
    )
    wire = Wire(asyncio.get_running_loop(), log)
    bridge.reset(wire, wire)  # type: ignore[arg-type]
    bridge._checked.add(f"{TOPO.namespace}.tier.1m")  # no passive check: no broker here
    bridge._checked.add(bridge.relay.plan(_incoming("m")).message.exchange)
    return bridge, wire


def _incoming(message_id: str) -> Any:
    from delayq.intake import Incoming

    return Incoming(
        "email.welcome", b"{}", {"message_id": message_id, "headers": {"x-delay": 30_000}}
    )


async def _settle(until: Any) -> None:
    for _ in range(200):
        if until():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the bridge did not get there")


def test_an_entry_is_pending_before_its_publish_and_moved_before_its_ack() -> None:
    async def main() -> list[tuple[str, object]]:
        log: list[tuple[str, object]] = []
        store = Store(log)
        bridge, _ = await _bridge(store, log)
        for tag in (1, 2):
            bridge.arrived(tag, "email.welcome", _header(f"m{tag}"), b"{}")
        await _settle(lambda: log.count(("published", 1)) and log.count(("published", 2)))
        bridge.settled(1, True, False)
        bridge.settled(2, True, False)
        await _settle(lambda: any(step == "ack" for step, _ in log))
        assert store.count(Query()) == 2
        return log

    log = asyncio.run(main())
    assert ("pending", ["m1", "m2"]) in log  # one write for what arrived together
    first_pending = next(i for i, (step, _) in enumerate(log) if step == "pending")
    first_publish = next(i for i, (step, _) in enumerate(log) if step == "published")
    moved = next(i for i, (step, _) in enumerate(log) if step == "scheduled")
    acked = next(i for i, (step, _) in enumerate(log) if step == "ack")
    assert first_pending < first_publish < moved < acked, log
    assert ("ack", 2) in log  # one multiple ack for both


def test_an_id_waiting_in_another_namespace_is_rejected_alone_and_the_others_sent() -> None:
    """An outside tester's id shared with another namespace of the index came back and
    paused the whole intake for up to 30 s a round until its delivery limit: now it goes
    to the intake's DLQ at once, as it came, and the rest of its batch is sent."""
    from delayq.message.factory import MessageFactory

    other = Topology(namespace="other", ladder=["1m"], external_bindings=("#",))

    async def main() -> tuple[list[tuple[str, object]], Store]:
        log: list[tuple[str, object]] = []
        store = Store(log)
        theirs = MessageFactory(other).build({}, "x", "30s", message_id="m2")
        ids = ScheduleIndex(store).before(other, [theirs])
        store.move(ids, State.SCHEDULED, now_ms=1)  # m2 waits in namespace "other"
        bridge, _ = await _bridge(store, log)
        for tag in (1, 2, 3):
            bridge.arrived(tag, "email.welcome", _header(f"m{tag}"), b"{}")
        await _settle(lambda: ("published", 1) in log and ("published", 3) in log)
        for tag in (1, 3):
            bridge.settled(tag, True, False)
        await _settle(lambda: ("ack", 3) in log)
        return log, store

    log, store = asyncio.run(main())
    assert ("published", 2) not in log and ("reject", 2) in log  # to the DLQ, never sent
    assert {e.id: e.state for e in store.find(Query(namespace="shop", states=set(State)))} == {
        "m1": State.SCHEDULED,
        "m3": State.SCHEDULED,
    }


def test_an_index_that_is_down_puts_the_batch_back_with_one_pause_and_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "delayq.bridge")

    async def main() -> tuple[list[tuple[str, object]], Relaying, Wire]:
        log: list[tuple[str, object]] = []
        store = Store(log)
        store.refuse_ids = {f"m{tag}" for tag in range(1, 51)}
        bridge, wire = await _bridge(store, log)
        for tag in range(1, 51):
            bridge.arrived(tag, "email.welcome", _header(f"m{tag}"), b"{}")
        await _settle(lambda: ("reject", 50) in log)
        return log, bridge, wire

    log, bridge, _ = asyncio.run(main())
    assert not [step for step, _ in log if step == "published"]
    assert bridge._paused and bridge.stats.returned == 50
    lines = [r.getMessage() for r in caplog.records if "not taken by" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("50 of ")


def test_a_move_that_fails_still_acks_and_leaves_the_entry_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, "delayq.bridge")

    async def main() -> tuple[list[tuple[str, object]], Store]:
        log: list[tuple[str, object]] = []
        store = Store(log)
        bridge, _ = await _bridge(store, log)
        bridge.arrived(1, "email.welcome", _header("m1"), b"{}")
        await _settle(lambda: ("published", 1) in log)
        store.fail_moves = True
        bridge.settled(1, True, False)
        await _settle(lambda: ("ack", 1) in log)
        return log, store

    _, store = asyncio.run(main())
    entry = store.get("m1")
    assert entry is not None and entry.state is State.PENDING
    assert any("kept 1 entries pending" in r.getMessage() for r in caplog.records)


def test_a_refused_publish_leaves_its_entry_unconfirmed_and_its_delivery_back() -> None:
    async def main() -> tuple[list[tuple[str, object]], Store]:
        log: list[tuple[str, object]] = []
        store = Store(log)
        bridge, _ = await _bridge(store, log)
        bridge.arrived(1, "email.welcome", _header("m1"), b"{}")
        await _settle(lambda: ("published", 1) in log)
        bridge.settled(1, False, False)  # a nack: a full tier
        await _settle(lambda: ("reject", 1) in log)
        return log, store

    _, store = asyncio.run(main())
    entry = store.get("m1")
    assert entry is not None and entry.state is State.UNCONFIRMED
