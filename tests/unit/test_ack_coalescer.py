"""The async consumer's acks: one multiple-ack per loop turn for the settled head, single
acks behind a handler still running, never an ack for a delivery not settled."""

from __future__ import annotations

import asyncio
from typing import Any

from delayq.aio._acks import AckCoalescer


class FakeMessage:
    def __init__(self, tag: int, sent: list[tuple[str, int, bool]]) -> None:
        self.delivery_tag = tag
        self._sent = sent

    async def ack(self, multiple: bool = False) -> None:
        self._sent.append(("ack", self.delivery_tag, multiple))

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        self._sent.append(("nack", self.delivery_tag, multiple))


def run(scenario: Any) -> list[tuple[str, int, bool]]:
    sent: list[tuple[str, int, bool]] = []

    async def main() -> None:
        acks = AckCoalescer()
        messages = {tag: FakeMessage(tag, sent) for tag in range(1, 11)}
        for message in messages.values():
            acks.track(message)  # type: ignore[arg-type]
        await scenario(acks, messages)
        await acks.drain()

    asyncio.run(main())
    return sent


async def turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_a_settled_head_is_acked_with_one_multiple_ack():
    async def scenario(acks: AckCoalescer, m: dict[int, Any]) -> None:
        for tag in range(1, 6):
            acks.ack(m[tag])
        await turn()

    assert run(scenario) == [("ack", 5, True)]


def test_settled_deliveries_behind_a_running_handler_are_acked_one_by_one():
    async def scenario(acks: AckCoalescer, m: dict[int, Any]) -> None:
        for tag in (2, 3, 4):
            acks.ack(m[tag])
        await turn()
        acks.ack(m[1])
        await turn()
        acks.ack(m[5])
        await turn()

    sent = run(scenario)
    assert sorted(sent[:3]) == [("ack", 2, False), ("ack", 3, False), ("ack", 4, False)]
    assert sent[3:] == [("ack", 1, True), ("ack", 5, True)]


def test_nothing_unsettled_is_covered_by_a_multiple_ack():
    async def scenario(acks: AckCoalescer, m: dict[int, Any]) -> None:
        acks.ack(m[1])
        acks.ack(m[3])  # 2 still running
        await turn()

    sent = run(scenario)
    assert ("ack", 1, True) in sent and ("ack", 3, False) in sent
    assert all(tag != 2 for _, tag, _ in sent)
    assert not any(multiple and tag >= 2 for _, tag, multiple in sent)


def test_a_nack_leaves_the_line_and_the_acks_go_on():
    async def scenario(acks: AckCoalescer, m: dict[int, Any]) -> None:
        await acks.nack(m[1], requeue=True)
        acks.ack(m[2])
        acks.ack(m[3])
        await turn()

    assert run(scenario) == [("nack", 1, False), ("ack", 3, True)]


def test_a_forgotten_delivery_is_never_covered_by_a_multiple_ack():
    async def scenario(acks: AckCoalescer, m: dict[int, Any]) -> None:
        acks.forget(m[1])  # cancelled: the broker requeues it when the channel closes
        acks.ack(m[2])
        acks.ack(m[3])
        await turn()

    assert sorted(run(scenario)) == [("ack", 2, False), ("ack", 3, False)]


def test_drain_sends_what_is_due_without_waiting_for_a_loop_turn():
    async def scenario(acks: AckCoalescer, m: dict[int, Any]) -> None:
        acks.ack(m[1])

    assert run(scenario) == [("ack", 1, True)]
