"""A failure of delayq's own on one message inside the bridge (issue 48): the frame
encoder raising for it, or its publish raising. Before, the message was taken from the
stream and never settled: every delivery after it waited behind it, unacked, the
prefetch filled, and the bridge stopped moving for good (a stop waited for it forever
too).

Now the message is settled on its own: a forward delayq cannot encode is parked as
``bridge-error`` (the reason says what failed), and one whose park fails as well, or
whose publish raises, is rejected to the intake's DLQ as it came. Every other message
arrives exactly once, and the bridge never reconnects. (A socket that fails is the
connection's loss: ``test_intake_loss.py``.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pika
import pytest

import delayq.aio._relaying as engine_module
from delayq.aio._wire import Wire
from delayq.sync import apply_topology
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


@pytest.fixture
def failing_on(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Make the bridge's frame encoder raise for the messages ``fails`` says (it is
    given each message about to be encoded)."""

    def install(fails: Callable[[Any], BaseException | None]) -> None:
        original = engine_module.bridged_frames

        def encode(msg: Any, *args: Any) -> Any:
            error = fails(msg)
            if error is not None:
                raise error
            return original(msg, *args)

        monkeypatch.setattr(engine_module, "bridged_frames", encode)

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


def test_a_message_whose_publish_raises_is_rejected_as_it_came_and_the_others_arrive_once(
    rabbitmq_url: str, make_topology: Any, collect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    topology = _topology(make_topology)
    apply_topology(topology, rabbitmq_url)
    ids = _publish(rabbitmq_url, topology)
    original = Wire.publish
    raised: Counter[str] = Counter()

    def publish(wire: Wire, frames: bytes, sink: Any, token: int, route: Any) -> None:
        if route[2] == "m-170":
            raised[route[2]] += 1
            raise RuntimeError("injected: cannot publish m-170")
        original(wire, frames, sink, token, route)

    monkeypatch.setattr(Wire, "publish", publish)
    got, bridge = _bridged(rabbitmq_url, topology, collect, parked=1)
    _exactly_once(got, ids, {"m-170"})
    dlq = _dlq(rabbitmq_url, topology.intakes[0].dlq_name(topology.namespace))
    assert set(dlq) == {"m-170"}
    assert dlq["m-170"].headers["x-death"][0]["reason"] == "rejected"
    assert raised == {"m-170": 1}
    assert bridge.stats.rejected == 1 and bridge.stats.reconnects == 0
    assert depth(rabbitmq_url, topology.intakes[0].queue_name(topology.namespace)) == 0
