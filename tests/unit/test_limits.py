"""Message size limits: checked before publish, and a message at the limits can always
be republished (retry or dead letter) in one AMQP frame, measured with the real
encoders of pika and pamqp (aio-pika)."""

from __future__ import annotations

from typing import Any

import pamqp.commands
import pamqp.frame
import pamqp.header
import pika.frame
import pika.spec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayq import FixedBackoff, HeadersTooLarge, InvalidInput, InvalidTopology, Topology
from delayq.consume.delivery import H_ERROR_MESSAGE, H_ERROR_TRACE, Action, Delivery
from delayq.consume.planner import DeliveryPlanner
from delayq.errors import BodyTooLarge
from delayq.message.envelope import OutgoingMessage
from delayq.message.factory import MessageFactory
from delayq.message.limits import (
    DEFAULT_LIMITS,
    DELAYQ_RESERVED_BYTES,
    FRAME_MAX,
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MessageLimits,
)
from delayq.message.validate import headers_size, validate_headers
from delayq.topology.model import load_topology

# --- the model -----------------------------------------------------------------------------------


def test_defaults_are_the_documented_ones() -> None:
    assert DEFAULT_LIMITS.max_body_bytes == MAX_BODY_BYTES == 16 * 1024 * 1024
    assert DEFAULT_LIMITS.max_headers == MAX_HEADERS == 64
    assert DEFAULT_LIMITS.max_header_bytes == MAX_HEADER_BYTES == 16 * 1024
    assert DEFAULT_LIMITS.frame_max == FRAME_MAX == 131_072
    assert Topology().limits == DEFAULT_LIMITS


def test_header_budget_must_leave_room_for_delayqs_own_headers() -> None:
    room = FRAME_MAX - DELAYQ_RESERVED_BYTES
    assert MessageLimits(max_header_bytes=room).max_header_bytes == room
    # A delayq error (issue 29: pydantic's ValidationError escaped), naming the field.
    with pytest.raises(InvalidInput, match=f"max_header_bytes=.*at most {room}"):
        MessageLimits(max_header_bytes=room + 1)
    with pytest.raises(InvalidInput, match="leaves no room"):
        MessageLimits(frame_max=8192, max_header_bytes=0)
    smaller = MessageLimits(frame_max=32_768, max_header_bytes=32_768 - DELAYQ_RESERVED_BYTES)
    assert smaller.max_header_bytes == 20_480


@pytest.mark.parametrize(
    "bad",
    [
        {"max_body_bytes": -1},
        {"max_body_bytes": 512 * 1024 * 1024 + 1},
        {"max_headers": -1},
        {"frame_max": 1024},
        {"colour": "blue"},
    ],
)
def test_bad_limits_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput, match="invalid message limits: "):
        MessageLimits(**bad)
    with pytest.raises(InvalidInput, match="invalid message limits: "):
        MessageLimits.model_validate(bad)


def test_limits_load_from_the_topology_yaml(tmp_path: Any) -> None:
    path = tmp_path / "delayq.yaml"
    path.write_text("namespace: shop\nlimits:\n  max_body_bytes: 1048576\n  max_headers: 8\n")
    topology = load_topology(path)
    assert topology.limits == MessageLimits(max_body_bytes=1_048_576, max_headers=8)
    path.write_text("limits:\n  max_header_bytes: 200000\n")
    with pytest.raises(InvalidTopology, match=r"limits: .*max_header_bytes=200000"):
        load_topology(path)


def test_a_topology_copy_keeps_its_limits() -> None:
    topology = Topology(namespace="a", limits={"max_headers": 3})
    assert topology.with_namespace("b").limits.max_headers == 3


# --- enforced before publish ----------------------------------------------------------------------


def small(**limits: Any) -> MessageFactory:
    return MessageFactory(Topology(limits=limits, external_bindings=["#"]))


def test_body_limit_comes_from_the_topology_and_the_publisher_may_override_it() -> None:
    factory = small(max_body_bytes=10)
    assert len(factory.build(b"x" * 10, "k", "1m").body) == 10
    with pytest.raises(BodyTooLarge, match="11 bytes, more than the limit of 10"):
        factory.build(b"x" * 11, "k", "1m")
    topology = Topology(limits={"max_body_bytes": 10}, external_bindings=["#"])
    override = MessageFactory(topology, max_body_bytes=20)
    assert len(override.build(b"x" * 20, "k", "1m").body) == 20
    with pytest.raises(InvalidInput, match="max_body_bytes"):
        MessageFactory(Topology(), max_body_bytes=-5)


def test_header_count_limit() -> None:
    factory = small(max_headers=2)
    factory.build(b"", "k", "1m", headers={"a": 1, "b": 2})
    with pytest.raises(HeadersTooLarge, match="3 headers; at most 2"):
        factory.build(b"", "k", "1m", headers={"a": 1, "b": 2, "c": 3})


def test_header_size_limit_is_exact_for_strings() -> None:
    # one str header: 4 (table length) + 1 + len(name) + 1 (tag) + 4 + len(value)
    factory = small(max_header_bytes=100)
    name = "note"
    fits = "v" * (100 - 4 - 1 - len(name) - 1 - 4)
    assert headers_size({name: fits}) == 100
    factory.build(b"", "k", "1m", headers={name: fits})
    with pytest.raises(HeadersTooLarge, match="101 bytes encoded; at most 100"):
        factory.build(b"", "k", "1m", headers={name: fits + "v"})


def test_validate_headers_defaults_to_the_default_limits() -> None:
    with pytest.raises(HeadersTooLarge):
        validate_headers({"blob": b"x" * MAX_HEADER_BYTES})
    with pytest.raises(HeadersTooLarge):
        validate_headers({f"h{i}": None for i in range(MAX_HEADERS + 1)})


# --- the size function against the real encoders --------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.text(max_size=40)
    | st.binary(max_size=40)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(min_size=1, max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
names = st.text(max_size=19).map(lambda s: "h" + s)  # never a reserved prefix
header_tables = st.dictionaries(names, values, max_size=8)


def pika_encoded(headers: dict[str, Any]) -> int:
    pieces: list[bytes] = []
    return int(pika.data.encode_table(pieces, headers))


def pamqp_encoded(headers: dict[str, Any]) -> int:
    from delayq.aio._link import _pamqp_value

    return len(pamqp.encode.field_table(_pamqp_value(validate_headers(headers))))


@settings(max_examples=300, deadline=None)
@given(header_tables)
def test_headers_size_is_never_below_what_pika_or_pamqp_send(headers: dict[str, Any]) -> None:
    size = headers_size(headers)
    assert size >= pika_encoded(validate_headers(headers))
    assert size >= pamqp_encoded(headers)


@given(st.dictionaries(names, st.text(max_size=50), max_size=8))
def test_headers_size_is_exact_for_string_headers(headers: dict[str, str]) -> None:
    assert headers_size(headers) == pika_encoded(headers) == pamqp_encoded(headers)


# --- a message at the limits can always be republished --------------------------------------------


def header_frame_sizes(msg: OutgoingMessage) -> tuple[int, int]:
    """Bytes of the content header frame for ``msg``, as pika and as pamqp encode it."""
    from delayq.aio._link import aio_message
    from delayq.sync._link import pika_properties

    by_pika = len(pika.frame.Header(1, len(msg.body), pika_properties(msg)).marshal())
    message = aio_message(msg)
    properties = pamqp.commands.Basic.Properties(
        content_type=message.content_type,
        delivery_mode=message.delivery_mode,
        message_id=message.message_id,
        timestamp=message.timestamp,
        headers=message.headers,
    )
    header = pamqp.header.ContentHeader(0, len(msg.body), properties)
    by_pamqp = len(pamqp.frame.marshal(header, 1))
    return by_pika, by_pamqp


def filler(budget: int) -> dict[str, str]:
    """User headers whose encoding takes exactly ``budget`` bytes."""
    value = "v" * (budget - 4 - 1 - len("filler") - 1 - 4)
    headers = {"filler": value}
    assert headers_size(headers) == budget
    return headers


class AVeryLongNamedErrorClassThatKeepsGoing(Exception):
    pass


AVeryLongNamedErrorClassThatKeepsGoing.__qualname__ = "Deep." * 200 + "Error"


@pytest.mark.parametrize("frame_max", [FRAME_MAX, 32_768, DELAYQ_RESERVED_BYTES + 1024])
def test_the_largest_message_delayq_accepts_is_republished_within_one_frame(
    frame_max: int,
) -> None:
    queue = "q" * 200  # the longest queue name a topology allows
    limits = {"frame_max": frame_max, "max_header_bytes": frame_max - DELAYQ_RESERVED_BYTES}
    topology = Topology(
        namespace="n" * 150,
        ladder=["23h59m59s999ms"],
        destinations=[{"queue": queue, "bindings": ["#"]}],
        limits=limits,
    )
    first = MessageFactory(topology).build(
        b"body", "k" * 255, "1h", message_id="m" * 255, headers=filler(limits["max_header_bytes"])
    )
    assert max(header_frame_sizes(first)) <= frame_max
    arrived = Delivery(
        queue=queue,
        body=first.body,
        routing_key=first.routing_key,
        message_id=first.message_id,
        content_type="c" * 255,  # from the broker: any short string
        headers={**first.headers, "x-death": [{"count": 1, "queue": "n" * 200}]},
    )
    planner = DeliveryPlanner(topology, queue, policy=FixedBackoff(delay="1h", max_attempts=2))
    error = AVeryLongNamedErrorClassThatKeepsGoing("m" * 100_000)
    trace = "t" * 100_000
    retry = planner.failure(arrived, error, trace)
    assert retry.action is Action.RETRY and retry.message is not None
    assert H_ERROR_TRACE in retry.message.headers  # nothing had to be dropped
    assert max(header_frame_sizes(retry.message)) <= frame_max
    again = Delivery(
        queue=queue,
        body=retry.message.body,
        routing_key=queue,
        message_id=retry.message.message_id,
        content_type="c" * 255,
        headers=retry.message.headers,
    )
    dead = planner.failure(again, error, trace)
    assert dead.action is Action.DEAD_LETTER and dead.message is not None
    assert H_ERROR_TRACE in dead.message.headers
    assert max(header_frame_sizes(dead.message)) <= frame_max


def test_a_foreign_message_with_huge_headers_loses_the_trace_rather_than_its_republish() -> None:
    topology = Topology(destinations=[{"queue": "work", "bindings": ["#"]}])
    # Published by another client: headers just under the frame, never checked by delayq.
    foreign = filler(FRAME_MAX - 2048)
    arrived = Delivery(
        queue="work",
        body=b"x",
        routing_key="job",
        message_id="m-1",
        content_type="application/octet-stream",
        headers=foreign,
    )
    planner = DeliveryPlanner(topology, "work", policy=FixedBackoff(delay="1m", max_attempts=1))
    decision = planner.failure(arrived, ValueError("e" * 5000), "t" * 50_000)
    assert decision.message is not None
    headers = decision.message.headers
    assert H_ERROR_TRACE not in headers
    assert len(headers[H_ERROR_MESSAGE].encode()) <= 128
    assert headers["filler"] == foreign["filler"]  # the application's headers are kept
    assert max(header_frame_sizes(decision.message)) <= FRAME_MAX
