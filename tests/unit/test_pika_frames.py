"""A bridged message's frames, encoded by delayq, are byte for byte what pika's
``basic_publish`` writes (its property and table encoders); what they cannot encode is
left to pika, and an oversized header is refused as pika's path refuses it."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from pika import frame, spec

from delayq import Topology
from delayq.errors import HeaderFrameTooLarge
from delayq.intake import Forward, Incoming, Relay
from delayq.message.carried import carried_frames, pika_properties

TOPO = Topology(
    namespace="shop",
    ladder=["1s", "5s"],
    destinations=[{"queue": "emails", "bindings": ["email.#"]}],
    intakes=[{"exchange": "delayed", "type": "topic"}],
)
RELAY = Relay(TOPO, TOPO.intakes[0])


def _pika(msg: Any, channel: int, frame_max: int) -> bytes:
    """What pika's Connection._send_message writes for a basic_publish."""
    out = [
        frame.Method(
            channel,
            spec.Basic.Publish(exchange=msg.exchange, routing_key=msg.routing_key, mandatory=True),
        ).marshal(),
        frame.Header(channel, len(msg.body), pika_properties(msg)).marshal(),
    ]
    limit = frame_max - 8
    for start in range(0, len(msg.body), limit):
        out.append(frame.Body(channel, msg.body[start : start + limit]).marshal())
    return b"".join(out)


def _forward(body: bytes, **props: Any) -> Any:
    plan = RELAY.plan(Incoming("email.welcome", body, props))
    assert isinstance(plan, Forward)
    return plan.message


@pytest.mark.parametrize(
    "props",
    [
        {"headers": {"x-delay": 500}, "content_type": "application/json", "message_id": "m-1"},
        {
            "headers": {"x-delay": "1500", "tenant": "acmé", "big": 2**40, "neg": -(2**63)},
            "correlation_id": "c",
            "reply_to": "r",
            "type": "t",
            "app_id": "legacy",
            "content_encoding": "gzip",
            "priority": 7,
            "timestamp": 1_700_000_000,
        },
        {"headers": {}, "priority": 0},
    ],
)
@pytest.mark.parametrize("size", [0, 10, 5000])
def test_the_frames_are_pikas(props: dict[str, Any], size: int) -> None:
    msg = _forward(b"x" * size, **props)
    assert msg.properties  # the carried path
    assert carried_frames(msg, 3, 4096) == _pika(msg, 3, 4096)


@pytest.mark.parametrize(
    "headers",
    [
        *({"f": 1.5}, {"d": Decimal("1.5")}, {"b": True}, {"n": None}),
        *({"t": {"a": 1}}, {"l": [1]}, {"x": b"raw"}, {"huge": 2**63}),
    ],
)
def test_a_header_pika_encodes_otherwise_is_left_to_pika(headers: dict[str, Any]) -> None:
    msg = _forward(b"{}", headers={"x-delay": 10}, app_id="a")
    msg = replace(msg, headers={**msg.headers, **headers})
    assert carried_frames(msg, 1, 131072) is None


def test_a_property_of_another_kind_is_left_to_pika() -> None:
    msg = _forward(b"{}", headers={"x-delay": 10}, app_id="a")
    assert carried_frames(replace(msg, properties={"cluster_id": "c"}), 1, 131072) is None
    assert carried_frames(replace(msg, properties={"priority": 300}), 1, 131072) is None
    assert carried_frames(replace(msg, properties={"app_id": "é" * 200}), 1, 131072) is None


def test_a_header_past_the_frame_is_refused() -> None:
    msg = _forward(b"{}", headers={"x-delay": 10, "pad": "p" * 5000}, app_id="a")
    with pytest.raises(HeaderFrameTooLarge):
        carried_frames(msg, 1, 4096)
