"""The async consumer's acks: one multiple-ack per loop turn for the settled head, single
acks behind a handler still running, never an ack for a delivery not settled."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from delayq.aio._acks import AckCoalescer
from tests.waiting import wait_for_async


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


def covered_by(sent: list[tuple[str, int, bool]]) -> dict[int, str]:
    """What each frame did to each tag, checking the broker's rules on the way: a
    multiple ack covers every tag up to its own that is still unacked; a tag settled
    twice (or named when already settled) would close the channel."""
    fate: dict[int, str] = {}
    for kind, tag, multiple in sent:
        assert tag not in fate, f"{kind} of tag {tag}, already {fate.get(tag)}: channel error"
        if kind == "ack" and multiple:
            for earlier in range(1, tag + 1):
                fate.setdefault(earlier, "ack")
        else:
            fate[tag] = kind
    return fate


@pytest.mark.parametrize("seed", range(40))
def test_acks_cover_exactly_the_settled_deliveries_whatever_the_order(seed: int):
    """Deliveries settle in any order over several loop turns: acked, put back (nack) or
    forgotten (cancelled). Every acked one is acked once, every nacked one nacked, and no
    multiple ack covers a forgotten one or one whose nack was not yet sent."""
    rng = random.Random(seed)
    fates = {tag: rng.choice(("ack", "ack", "ack", "nack", "forget")) for tag in range(1, 11)}

    async def scenario(acks: AckCoalescer, m: dict[int, Any]) -> None:
        order = list(fates)
        rng.shuffle(order)
        for tag in order:
            if fates[tag] == "ack":
                acks.ack(m[tag])
            elif fates[tag] == "nack":
                await acks.nack(m[tag], requeue=True)
            else:
                acks.forget(m[tag])
            if rng.random() < 0.4:
                await turn()

    done = covered_by(run(scenario))
    assert done == {tag: fate for tag, fate in fates.items() if fate != "forget"}


def test_a_put_back_delivery_between_acked_ones_is_nacked_before_any_ack_covers_it():
    async def scenario(acks: AckCoalescer, m: dict[int, Any]) -> None:
        acks.ack(m[1])
        await acks.nack(m[2], requeue=True)  # its republish failed: back to the queue
        acks.ack(m[3])
        await turn()

    sent = run(scenario)
    assert covered_by(sent) == {1: "ack", 2: "nack", 3: "ack"}
    assert sent.index(("nack", 2, False)) < sent.index(("ack", 3, True))


def test_acks_wait_for_a_batch_or_for_the_delay():
    sent: list[tuple[str, int, bool]] = []

    async def main() -> None:
        acks = AckCoalescer(batch=4, delay_s=0.2)
        messages = {tag: FakeMessage(tag, sent) for tag in range(1, 9)}
        for message in messages.values():
            acks.track(message)  # type: ignore[arg-type]
        for tag in (1, 2, 3):
            acks.ack(messages[tag])  # type: ignore[arg-type]
        await turn()
        assert sent == []  # three of a batch of four: they wait
        acks.ack(messages[4])  # type: ignore[arg-type]
        await turn()
        assert sent == [("ack", 4, True)]
        acks.ack(messages[5])  # type: ignore[arg-type]
        await turn()
        assert sent == [("ack", 4, True)]
        await wait_for_async(lambda: len(sent) == 2, 5, "the delayed ack")
        assert sent[1] == ("ack", 5, True)

    asyncio.run(main())


def test_an_abandoned_channel_gets_no_more_acks():
    sent: list[tuple[str, int, bool]] = []

    async def main() -> None:
        acks = AckCoalescer(batch=4, delay_s=0.05)
        message = FakeMessage(1, sent)
        acks.track(message)  # type: ignore[arg-type]
        acks.ack(message)  # type: ignore[arg-type]
        acks.abandon()  # the connection was lost: the broker requeued it
        await asyncio.sleep(0.2)
        await acks.drain()

    asyncio.run(main())
    assert sent == []


def test_a_failed_ack_is_logged_and_the_next_ones_still_go(caplog: pytest.LogCaptureFixture):
    sent: list[tuple[str, int, bool]] = []

    class Failing(FakeMessage):
        async def ack(self, multiple: bool = False) -> None:
            raise RuntimeError("channel closed")

    async def main() -> None:
        acks = AckCoalescer()
        stale = Failing(7, sent)  # from an earlier channel: not tracked here
        fresh = FakeMessage(1, sent)
        acks.track(fresh)  # type: ignore[arg-type]
        acks.ack(stale)  # type: ignore[arg-type]
        acks.ack(fresh)  # type: ignore[arg-type]
        await acks.drain()

    with caplog.at_level(logging.WARNING, logger="delayq.consumer"):
        asyncio.run(main())
    assert sent == [("ack", 1, True)]
    assert "settling delivery 7 failed" in caplog.text
