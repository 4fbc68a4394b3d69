"""A failure of delayq's own on one message inside the bridge's stream (issue 48): the
frame encoder raising for it, or the write of its frames raising (an ``OSError``, once or
every time). Before, the message was taken from the stream and never settled: every
delivery after it waited behind it, unacked, the prefetch filled, and the bridge stopped
moving for good (a stop waited for it forever too).

Now the message is settled on its own: a forward delayq cannot encode is parked as
``bridge-error`` (the reason says what failed), and one whose park fails as well is
rejected to the intake's DLQ as it came. A write that raises leaves the connection's
state unknown: the stream drops it and sends what was in flight again on a fresh one
(the reconnect path), and a message whose write raises again there is settled as the
encoder's would be. Every other message arrives: exactly once when only the encoder
failed (no connection was dropped), at least once when writes raised (what was in flight
on a dropped connection is sent again). The bridge never reconnects its consuming side.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pika
import pytest

import delayq.sync._round as round_module
from delayq.sync import apply_topology
from delayq.sync._settling import WRITE_STRIKES
from delayq.sync._unreadable import tolerate_unreadable_headers
from delayq.sync.bridge import Bridge
from tests.amqp import depth
from tests.integration.intake_support import Running, publish_plugin_style, settled_except
from tests.waiting import wait_for

COUNT = 300


def _topology(make_topology: Any) -> Any:
    ns = make_topology().namespace
    return make_topology(
        ladder=["1s"],
        destinations=[{"queue": f"{ns}x.work", "bindings": ["job.a"]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": "direct", "delivery_limit": 5}],
    )


def _publish(url: str, topology: Any) -> list[str]:
    messages = [
        {"id": f"m-{n}", "routing_key": "job.a", "body": b"{}", "headers": {"x-delay": 0}}
        for n in range(COUNT)
    ]
    publish_plugin_style(url, topology.intakes[0].exchange, messages)
    return [m["id"] for m in messages]


def _dlq(url: str, queue: str) -> dict[str, Any]:
    """The messages in ``queue`` by id (their properties), left in place."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    tolerate_unreadable_headers(connection)
    found: dict[str, Any] = {}
    try:
        channel = connection.channel()
        while True:
            method, props, _body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                break
            found[props.message_id] = props
        channel.basic_nack(0, multiple=True, requeue=True)
    finally:
        connection.close()
    return found


def _bridged(url: str, topology: Any, collect: Any, parked: int) -> tuple[list[Any], Bridge]:
    """Run a bridge until ``parked`` messages are in the intake's DLQ, every other one
    reached its queue and all is quiet; the arrivals, and the bridge (stopped)."""
    dlq = topology.intakes[0].dlq_name(topology.namespace)
    arrived = collect(topology.destinations[0].queue)
    running = Running(Bridge(url, topology, prefetch=50))
    try:
        wait_for(
            lambda: depth(url, dlq) >= parked and len(arrived.arrivals) >= COUNT - parked,
            120,
            lambda: f"{len(arrived.arrivals)} arrivals, {depth(url, dlq)} of {parked} in "
            f"the DLQ; {running.bridge.stats}",
        )
        got = settled_except(arrived, url, topology, dlq)
        assert running.thread.is_alive() and not running.error
    finally:
        running.stop()
    return got, running.bridge


def _exactly_once(got: list[Any], ids: list[str], poison: set[str]) -> None:
    counts = Counter(a.message_id for a in got)
    assert set(counts) == set(ids) - poison
    assert set(counts.values()) == {1}, {i: n for i, n in counts.items() if n != 1}


def _at_least_once(got: list[Any], ids: list[str], poison: set[str]) -> None:
    assert {a.message_id for a in got} == set(ids) - poison


@pytest.fixture
def failing_on(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Make the stream's frame encoders raise for the messages ``fails`` says (it is
    given each message about to be encoded)."""

    def install(fails: Callable[[Any], BaseException | None]) -> None:
        for name in ("carried_frames", "publish_frames"):
            original = getattr(round_module, name)

            def encode(msg: Any, *args: Any, _original: Any = original) -> Any:
                error = fails(msg)
                if error is not None:
                    raise error
                return _original(msg, *args)

            monkeypatch.setattr(round_module, name, encode)

    return install


def _is_park(msg: Any) -> bool:
    return str(msg.routing_key).endswith(".dlq")


def test_a_message_the_encoder_fails_on_is_parked_and_the_others_arrive_once(
    rabbitmq_url: str, make_topology: Any, collect: Any, failing_on: Callable[..., None]
) -> None:
    topology = _topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    ids = _publish(rabbitmq_url, topology)

    def fails(msg: Any) -> BaseException | None:
        if msg.message_id == "m-100" and not _is_park(msg):
            return RuntimeError("injected: cannot encode m-100")
        if msg.message_id == "m-200":  # its park too
            return OSError("injected: cannot encode m-200 at all")
        return None

    failing_on(fails)
    got, bridge = _bridged(rabbitmq_url, topology, collect, parked=2)
    _exactly_once(got, ids, {"m-100", "m-200"})
    dlq = _dlq(rabbitmq_url, topology.intakes[0].dlq_name(topology.namespace))
    assert set(dlq) == {"m-100", "m-200"}
    parked = dlq["m-100"].headers
    assert parked["delayq-dead-letter-reason"] == "bridge-error"
    assert "injected: cannot encode m-100" in parked["delayq-error-message"]
    rejected = dlq["m-200"].headers  # as it came, dead-lettered by the broker
    assert "delayq-dead-letter-reason" not in rejected
    assert rejected["x-death"][0]["reason"] == "rejected"
    assert rejected["x-delay"] == 0
    stats = bridge.stats
    assert (stats.forwarded, stats.parked, stats.rejected) == (COUNT - 2, 1, 1)
    assert stats.reconnects == 0
    assert depth(rabbitmq_url, topology.intakes[0].queue_name(topology.namespace)) == 0


@pytest.fixture
def writes_failing(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Make the stream's frame writer raise for the frames ``fails`` says (before any
    byte of them is queued)."""

    def install(fails: Callable[[bytes], BaseException | None]) -> None:
        original = round_module.frames_writer

        def writer(channel: Any) -> Any:
            write = original(channel)
            if write is None:
                return None

            def failing(frames: bytes) -> None:
                error = fails(frames)
                if error is not None:
                    raise error
                write(frames)

            return failing

        monkeypatch.setattr(round_module, "frames_writer", writer)

    return install


def test_a_write_that_raises_is_the_reconnect_path_and_one_that_always_does_is_settled(
    rabbitmq_url: str, make_topology: Any, collect: Any, writes_failing: Callable[..., None]
) -> None:
    topology = _topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    ids = _publish(rabbitmq_url, topology)
    raised: Counter[str] = Counter()

    def fails(frames: bytes) -> BaseException | None:
        for name in ("m-150", "m-170"):
            if f"\x05{name}".encode() in frames:  # its message id, as a short string
                if name == "m-170" or not raised[name]:  # m-150: once only
                    raised[name] += 1
                    return OSError(f"injected: cannot write {name}")
        return None

    writes_failing(fails)
    got, bridge = _bridged(rabbitmq_url, topology, collect, parked=1)
    # A dropped connection's unconfirmed messages are sent again (maybe more than once:
    # each drop sends again what was in flight on it), m-150 among them; none is lost.
    _at_least_once(got, ids, {"m-170"})
    dlq = _dlq(rabbitmq_url, topology.intakes[0].dlq_name(topology.namespace))
    assert set(dlq) == {"m-170"}  # its forward and its park never written: rejected
    assert dlq["m-170"].headers["x-death"][0]["reason"] == "rejected"
    # m-150 once (a fresh connection wrote it); m-170's forward, then its park, on two
    # connections each before each was settled.
    assert raised == {"m-150": 1, "m-170": 2 * WRITE_STRIKES}
    assert bridge.stats.rejected == 1 and bridge.stats.reconnects == 0
    assert depth(rabbitmq_url, topology.intakes[0].queue_name(topology.namespace)) == 0
