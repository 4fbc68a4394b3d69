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
few hundred acks and rejects (every other confirm refused), checks that every ack went
before the cancel, and that no acked message came back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import delayq.sync.bridge as bridge_module
from delayq.errors import PublishError, PublishRejected
from delayq.sync import apply_topology
from delayq.sync._intake_stream import Ended, Feed
from delayq.sync.bridge import Bridge
from tests.amqp import depth
from tests.integration.intake_support import Running, publish_plugin_style
from tests.waiting import wait_for

COUNT = 300

Outcome = tuple[int, PublishError | None]


class _Refusing(Feed):
    """Holds the outcomes of the stream until ``release`` (and a take more: they come a
    moment after the stop), then gives them all at once, every other one refused: the
    bridge acks one, puts the next back, and so on."""

    release = threading.Event()
    held = 0

    def __init__(self, wake_consumer: Callable[[], None]) -> None:
        super().__init__(wake_consumer)
        self._held: list[Outcome] = []
        self._takes_released = 0

    def take(self) -> tuple[list[Outcome], Ended | None]:
        outcomes, ended = super().take()
        self._held.extend(outcomes)
        type(self).held = len(self._held)
        if self.release.is_set():
            self._takes_released += 1
        if self._takes_released < 2:
            return [], None
        given = [
            (tag, PublishRejected("refused by the test") if n % 2 else error)
            for n, (tag, error) in enumerate(sorted(self._held))
        ]
        self._held = []
        return given, ended


@pytest.fixture
def refusing(monkeypatch: pytest.MonkeyPatch) -> type[_Refusing]:
    _Refusing.release = threading.Event()
    _Refusing.held = 0
    monkeypatch.setattr(bridge_module, "Feed", _Refusing)
    return _Refusing


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The acks, rejects and cancels of the bridge's consuming channel, in order."""
    made: list[str] = []
    connect = bridge_module.connect

    def recording(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            made.append(name)
            return method(*args, **kwargs)

        return call

    def connecting(url: str, **kwargs: Any) -> Any:
        connection = connect(url, **kwargs)
        opened = connection.channel

        def channel() -> Any:
            opened_channel = opened()
            for name in ("basic_ack", "basic_reject", "basic_cancel"):
                setattr(opened_channel, name, recording(name, getattr(opened_channel, name)))
            return opened_channel

        connection.channel = channel
        return connection

    monkeypatch.setattr(bridge_module, "connect", connecting)
    return made


def test_a_stop_acks_before_it_cancels_and_nothing_acked_comes_back(
    rabbitmq_url: str, make_topology: Any, refusing: type[_Refusing], calls: list[str]
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
    wait_for(lambda: refusing.held == COUNT, 60, lambda: f"{refusing.held} confirmed")
    running.bridge.request_stop()  # every one sent and confirmed: none acked yet
    refusing.release.set()
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
