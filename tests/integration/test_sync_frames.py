"""The sync pipeline (``Publisher.publish_many``, the threads sharing a ``Publisher``)
writes frames delayq encodes itself (:mod:`delayq.message.frames`), not pika's: what
arrives must be what pika's own encoding delivers (``Publisher.publish`` still uses it),
header types, properties and bodies alike, on a real broker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika
import pika.channel
import pytest

from delayq import Message, Topology
from delayq.sync import Publisher, apply_topology

HEADERS: dict[str, Any] = {
    "tenant": "t-1",
    "text": "ünïcode ✓",
    "small": 7,
    "negative": -40_000,
    "wide": 2**40,
    "widest": -(2**63),
    "flag": True,
    "off": False,
    "nothing": None,
    "raw": b"\x00\xffbytes",
    "list": [1, "two", [3], {"four": 4}],
    "nested": {"a": {"b": ["c", 2**33]}, "empty": {}},
}
"""Every type a header may have (:func:`delayq.message.validate.validate_headers`)."""


def _compared(arrival: Any) -> tuple[Any, ...]:
    props = arrival.properties
    headers = {
        k: v
        for k, v in arrival.headers.items()
        if k not in ("delayq-published-at", "delayq-due-at")  # the clock's
    }
    return (
        arrival.routing_key,
        arrival.body,
        props.content_type,
        props.delivery_mode,
        props.priority or 0,  # delayq's frames say 0, pika's say nothing: the same
        headers,
    )


def test_publish_many_frames_deliver_what_pikas_own_encoding_delivers(
    rabbitmq_url: str,
    make_topology: Callable[..., Topology],
    collect: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pika_publishes: list[str] = []
    original = pika.channel.Channel.basic_publish

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        pika_publishes.append(self.connection.__class__.__name__)
        original(self, *args, **kwargs)

    monkeypatch.setattr(pika.channel.Channel, "basic_publish", counted)
    topo = make_topology(["1s"])
    apply_topology(topo, rabbitmq_url)
    inbox = collect(f"{topo.namespace}.work")
    bodies: list[object] = [b"bytes body", "text body", {"json": [1, 2]}, b"", b"x" * 300_000]
    with Publisher(rabbitmq_url, topo) as publisher:
        for n, body in enumerate(bodies):  # one at a time: pika's basic_publish
            publisher.publish(body, "job.same", "0s", headers=HEADERS, message_id=f"pika-{n}")
        publisher.publish_many(  # pipelined: delayq's frames
            [
                Message(body, "job.same", "0s", headers=HEADERS, message_id=f"delayq-{n}")
                for n, body in enumerate(bodies)
            ]
        )
    # publish's blocking connection used pika's encoder; publish_many's pipeline did not
    assert pika_publishes == ["SelectConnection"] * len(bodies), pika_publishes
    arrived = {a.message_id: a for a in inbox.wait(2 * len(bodies), timeout_s=60)}
    assert len(arrived) == 2 * len(bodies), sorted(arrived)
    for n in range(len(bodies)):
        by_pika, by_delayq = arrived[f"pika-{n}"], arrived[f"delayq-{n}"]
        assert _compared(by_delayq) == _compared(by_pika)
        assert abs(by_delayq.properties.timestamp - by_pika.properties.timestamp) <= 5
    assert arrived["delayq-4"].body == b"x" * 300_000  # split into frames, arrived whole
    assert arrived["delayq-0"].headers["nested"] == HEADERS["nested"]
