"""The bridge's pause after the broker refused its publishes (no broker: the wire is a
stand-in that records what the bridge writes and schedules). An outside tester's full
tier (cap 100, a burst 30 times that) saw the bridge put each refused message back and
take deliveries again after 2 s, every time: 20 refusals spent a message's delivery
limit in 40 s, and one log line per refused publish (18,243 in a minute). Now the pause
doubles while refusals go on, up to 30 s, and is back to 2 s once the broker takes a
message again; a drain's refusals are one line."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from delayq import Topology
from delayq.aio._relaying import REFUSED_PAUSE_MAX_S, REFUSED_PAUSE_S, Relaying
from delayq.aio._wire import CONSUME_CHANNEL
from delayq.intake import Incoming, Relay
from delayq.intake.bridging import BridgeStats

TOPO = Topology(
    namespace="shop",
    ladder=["1s"],
    destinations=[{"queue": "emails", "bindings": ["email.welcome"]}],
    intakes=[{"exchange": "delayed", "type": "direct"}],
)


class _Loop:
    def __init__(self) -> None:
        self.later: list[tuple[float, Callable[..., None], tuple[Any, ...]]] = []

    def call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        pass  # the test drains by hand

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        self.later.append((delay, callback, args))


class _Wire:
    """What the bridge uses of a wire: acks written, timers kept, one consuming channel."""

    def __init__(self) -> None:
        self.closed = None
        self.readers = {CONSUME_CHANNEL: object()}
        self.loop = _Loop()
        self.frames: list[bytes] = []

    def send_frames(self, frames: bytes) -> None:
        self.frames.append(frames)


def _bridge() -> tuple[Relaying, _Wire]:
    bridge = Relaying(Relay(TOPO, TOPO.intakes[0]), BridgeStats())
    wire = _Wire()
    bridge.reset(wire, wire)  # type: ignore[arg-type]
    return bridge, wire


def _sent(bridge: Relaying, tag: int) -> None:
    incoming = Incoming("email.welcome", b"{}", {"message_id": f"m-{tag}",
                                                 "headers": {"x-delay": 500}})  # fmt: skip
    bridge._window.add(tag, bridge.relay.plan(incoming))


def _confirm(bridge: Relaying, tag: int, acked: bool) -> None:
    _sent(bridge, tag)
    bridge.settled(tag, acked, False)
    bridge._drain()


def test_the_pause_doubles_while_refusals_go_on_and_starts_again_once_one_is_taken() -> None:
    bridge, wire = _bridge()
    pauses = []
    for tag in range(1, 8):  # refused, each after the last pause ended
        _confirm(bridge, tag, acked=False)
        delay, resume, args = wire.loop.later.pop()
        pauses.append(delay)
        resume(*args)
    assert pauses == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert pauses[0] == REFUSED_PAUSE_S and max(pauses) == REFUSED_PAUSE_MAX_S
    _confirm(bridge, 8, acked=True)  # the broker takes one again
    _confirm(bridge, 9, acked=False)
    assert wire.loop.later[-1][0] == REFUSED_PAUSE_S
    assert bridge.stats.returned == 8 and bridge.stats.forwarded == 1


def test_refusals_during_a_pause_do_not_lengthen_it(caplog: pytest.LogCaptureFixture) -> None:
    bridge, wire = _bridge()
    caplog.set_level(logging.WARNING, "delayq.bridge")
    for tag in range(1, 4):
        _sent(bridge, tag)
    for tag in range(1, 4):
        bridge.settled(tag, False, False)
    bridge._drain()  # three refused at once: one pause, one line for the three
    _confirm(bridge, 4, acked=False)  # one more while paused
    assert [delay for delay, _, _ in wire.loop.later] == [REFUSED_PAUSE_S]
    refused = [
        r.getMessage() for r in caplog.records if "not taken by the broker" in r.getMessage()
    ]
    assert len(refused) == 2 and refused[0].startswith("3 of shop.intake.delayed not taken")
    assert "and 2 more" in refused[0]


def test_a_delivery_delayq_fails_on_wakes_a_stop_waiting_for_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last delivery in flight, failed by delayq itself (rejected to the DLQ), leaves
    the window empty: a stop waiting for it to empty (up to a grace of an hour) is woken,
    not left to its grace."""
    import asyncio

    import delayq.aio._relaying as relaying

    bridge, wire = _bridge()
    wire.frame_max = 131072  # type: ignore[attr-defined]

    def failing(*_: Any) -> None:
        raise RuntimeError("delayq's own failure")

    monkeypatch.setattr(bridge, "_publish", failing)
    monkeypatch.setattr(relaying, "basic_properties", lambda *_: {"message_id": "m-1"})
    bridge._changed = asyncio.Event()
    bridge._take(1, "email.welcome", b"", b"{}")
    assert not bridge._window
    assert bridge.stats.rejected == 1
    assert bridge._changed.is_set()
