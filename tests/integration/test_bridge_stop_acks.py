"""A stopping bridge acks what it forwarded before it cancels its consumer (outside
tester, RabbitMQ 4.3.6: a SIGHUP mid-burst, the stopping bridge said "341 forwarded"
after acking them, and the restarted one got those very messages again, redelivered:
duplicates, one burst in 4).

A quorum queue's channel sends each ack (a settle) to the queue as a command; with 32 of
its commands not yet applied, it holds the next acks back until the queue has applied
some, and a basic.cancel sends those held first (4.x). An ack made after the cancel that
is still held when the channel closes is dropped with the channel: the queue gives the
message back. The bridge used to cancel first, then ack what was in flight as its
confirms came; a burst kept the queue busy, the channel held the acks, the close came
before the queue caught up, and every message of the stop came back.

Whether a held ack is dropped is a race inside the broker; the test makes a stop with a
few hundred acks and rejects (the confirms held back until the stop, then every other
one refused), checks that every ack went before the cancel, and that no acked message
came back."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pamqp import commands

import delayq.aio._bridgewire as engine_module
import delayq.aio._relaying as relaying_module
from delayq.aio._wire import Wire
from delayq.sync import apply_topology
from delayq.sync.bridge import Bridge
from tests.amqp import depth
from tests.integration.intake_support import Running, publish_plugin_style
from tests.waiting import wait_for

COUNT = 300

Engine = engine_module.WireBridge


class Held:
    """The confirms the bridge heard, held back until it is told to stop; then given to
    it all at once, every other one refused: it acks one, puts the next back, and so on."""

    def __init__(self) -> None:
        self.confirms: list[tuple[int, bool, bool]] = []


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Held:
    holding = Held()
    settled, stop = Engine.settled, Engine.stop

    def hold(self: Any, token: int, acked: bool, returned: bool) -> None:
        holding.confirms.append((token, acked, returned))

    def release(self: Any) -> None:
        for n, (token, acked, returned) in enumerate(sorted(holding.confirms)):
            settled(self, token, acked and n % 2 == 0, returned)
        holding.confirms = []

    def stopping(self: Any, *, now: bool = False) -> None:
        stop(self, now=now)
        asyncio.get_running_loop().call_soon(release, self)

    monkeypatch.setattr(Engine, "settled", hold)
    monkeypatch.setattr(Engine, "stop", stopping)
    return holding


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The acks, rejects and cancels of the bridge's consuming channel, in order."""
    made: list[str] = []
    acks = relaying_module._Acks
    ack, reject, call = acks.basic_ack, acks.basic_reject, Wire.call

    def acking(self: Any, tag: int, multiple: bool) -> None:
        made.append("basic_ack")
        ack(self, tag, multiple)

    def rejecting(self: Any, tag: int, requeue: bool) -> None:
        made.append("basic_reject")
        reject(self, tag, requeue)

    async def calling(self: Wire, channel: int, method: Any, *replies: type) -> Any:
        if isinstance(method, commands.Basic.Cancel):
            made.append("basic_cancel")
        return await call(self, channel, method, *replies)

    monkeypatch.setattr(acks, "basic_ack", acking)
    monkeypatch.setattr(acks, "basic_reject", rejecting)
    monkeypatch.setattr(Wire, "call", calling)
    return made


def test_a_stop_acks_before_it_cancels_and_nothing_acked_comes_back(
    rabbitmq_url: str, make_topology: Any, held: Held, calls: list[str]
) -> None:
    ns = make_topology().namespace
    topology = make_topology(
        ladder=["1s"],
        destinations=[{"queue": f"{ns}x.work", "bindings": ["job.a"]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": "direct"}],
    )
    apply_topology(topology, rabbitmq_url)
    intake = topology.intakes[0]
    queue = intake.queue_name(topology.namespace)
    messages = [
        {"id": f"a-{n}", "routing_key": "job.a", "body": b"{}", "headers": {"x-delay": 0}}
        for n in range(COUNT)
    ]
    publish_plugin_style(rabbitmq_url, intake.exchange, messages)
    running = Running(Bridge(rabbitmq_url, topology, prefetch=COUNT, stop_grace="60s"))
    wait_for(lambda: len(held.confirms) == COUNT, 60, lambda: f"{len(held.confirms)} confirmed")
    running.bridge.request_stop()  # every one sent and confirmed: none acked yet
    running.thread.join(60)
    assert not running.thread.is_alive() and not running.error, running.error
    half = COUNT // 2
    assert (running.bridge.stats.forwarded, running.bridge.stats.returned) == (half, half)
    cancel = calls.index("basic_cancel")
    assert calls[:cancel].count("basic_ack") == half, "an ack after the cancel"
    assert calls[:cancel].count("basic_reject") == half
    wait_for(lambda: depth(rabbitmq_url, queue) >= half, 30, "the refused ones back")
    # one more is an ack dropped: a message forwarded and acked, back in the queue
    assert _most_within(rabbitmq_url, queue, 2.0) == half


def _most_within(url: str, queue: str, seconds: float) -> int:
    """The most ready messages ``queue`` shows in ``seconds`` (a quorum queue gives back
    at once what a closed channel left unacked)."""
    most, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        most = max(most, depth(url, queue))
        time.sleep(0.1)
    return most
