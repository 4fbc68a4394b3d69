"""The frame feed's pure parts: deliveries read from frame bytes, acks encoded by hand,
the framing's delivery path and write flow control (no network).

Its real-broker counterpart is tests/integration/test_frame_feed.py.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body, commands, decode, encode, frame, header

from delayq.aio._deliveries import (
    ack_frame,
    content_header,
    deliver_fields,
    field_table,
    nack_frame,
    reject_frame,
)
from delayq.aio._framefeed import FrameDelivery, _Consuming
from delayq.aio._wire import CONSUME_CHANNEL, Wire, WireClosed
from delayq.consume.delivery import Delivery
from tests.unit.wire_fakes import Transport

# Field-table values of every type pamqp encodes (its own encoder picks the type).
_scalars = st.one_of(
    st.text(max_size=30),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.none(),
    st.decimals(places=2, min_value=-1000, max_value=1000, allow_nan=False),
    st.datetimes(
        min_value=datetime.datetime(2000, 1, 1), max_value=datetime.datetime(2100, 1, 1)
    ).map(lambda d: d.replace(microsecond=0, tzinfo=datetime.UTC)),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=20), _values, max_size=8))
def test_a_field_table_reads_as_pamqp_reads_it(table: dict[str, Any]) -> None:
    raw = b"pad" + encode.field_table(table) + b"tail"
    consumed, expected = decode.field_table(raw[3:])
    got, end = field_table(raw, 3)
    assert got == expected
    assert end == 3 + consumed


def test_every_field_type_pamqp_knows_reads_the_same() -> None:
    """Types pamqp's encoder never picks (unsigned, 8/16-bit, 'f', 'x', 'V') from raw bytes."""
    items = [
        (b"b", b"\xff"),
        (b"B", b"\xff"),
        (b"s", b"\xff\xfe"),
        (b"u", b"\xff\xfe"),
        (b"I", b"\xff\xff\xff\xfe"),
        (b"i", b"\xff\xff\xff\xfe"),
        (b"l", b"\xff" * 8),
        (b"L", b"\xff" * 8),
        (b"f", b"\x3f\xc0\x00\x00"),
        (b"d", b"\x3f\xf8" + b"\x00" * 6),
        (b"D", b"\x02\x00\x00\x01\x00"),
        (b"T", b"\x00\x00\x00\x00\x65\x00\x00\x00"),
        (b"x", b"\x00\x00\x00\x03abc"),
        (b"V", b""),
        (b"t", b"\x02"),
        (b"S", b"\x00\x00\x00\x02\xff\xfe"),  # not UTF-8: bytes, as pamqp gives
        (b"A", b"\x00\x00\x00\x04t\x01V\x00"[:8]),
    ]
    content = b"".join(bytes((len(k),)) + k + kind + value for k, (kind, value) in _named(items))
    raw = len(content).to_bytes(4, "big") + content
    assert field_table(raw, 0) == (decode.field_table(raw)[1], len(raw))


def _named(items: list[tuple[bytes, bytes]]) -> list[tuple[bytes, tuple[bytes, bytes]]]:
    return [(b"k%d" % n, item) for n, item in enumerate(items)]


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00\x00\x00\x10\x01a",  # the table runs past the frame
        b"\x00\x00\x00\x03\x05abc",  # a key runs past the table
        b"\x00\x00\x00\x03\x01aZ",  # no such type
        b"\x00\x00\x00\x04\x01aS\x00",  # a string's length cut short
    ],
)
def test_a_malformed_field_table_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        field_table(raw, 0)


def _payload(value: Any) -> bytes:
    """A frame's payload (what the framing hands a reader)."""
    return frame.marshal(value, 3)[7:-1]


@given(
    tag=st.integers(min_value=1, max_value=2**63 - 1),
    redelivered=st.booleans(),
    exchange=st.from_regex(r"[a-zA-Z0-9_.:-]{0,40}", fullmatch=True),
    routing_key=st.text(max_size=60),
    consumer_tag=st.text(min_size=1, max_size=40),
)
def test_deliver_fields_read_as_pamqp(
    tag: int, redelivered: bool, exchange: str, routing_key: str, consumer_tag: str
) -> None:
    if max(len(s.encode()) for s in (exchange, routing_key, consumer_tag)) > 255:
        return
    method = commands.Basic.Deliver(consumer_tag, tag, redelivered, exchange, routing_key)
    assert deliver_fields(_payload(method)) == (tag, redelivered, routing_key)


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(min_value=0, max_value=2**40),
    props=st.fixed_dictionaries(
        {},
        optional={
            "content_type": st.text(max_size=30),
            "content_encoding": st.text(max_size=10),
            "headers": st.dictionaries(st.text(max_size=10), _values, max_size=5),
            "delivery_mode": st.integers(1, 2),
            "priority": st.integers(0, 9),
            "correlation_id": st.text(max_size=20),
            "reply_to": st.text(max_size=20),
            "expiration": st.integers(0, 10**6).map(str),
            "message_id": st.text(max_size=60),
            "timestamp": st.datetimes(
                min_value=datetime.datetime(2000, 1, 1), max_value=datetime.datetime(2100, 1, 1)
            ).map(lambda d: d.replace(microsecond=0, tzinfo=datetime.UTC)),
            "message_type": st.text(max_size=10),
            "user_id": st.text(max_size=10),
            "app_id": st.text(max_size=10),
        },
    ),
)
def test_a_content_header_reads_as_pamqp(size: int, props: dict[str, Any]) -> None:
    properties = commands.Basic.Properties(**props)
    raw = _payload(header.ContentHeader(0, size, properties))
    parsed = frame.unmarshal(frame.marshal(header.ContentHeader(0, size, properties), 3))[2]
    want = parsed.properties
    assert content_header(raw) == (size, want.content_type, want.headers or {}, want.message_id)


@pytest.mark.parametrize("cut", [1, 5, 13, 16])
def test_truncated_deliveries_and_headers_are_value_errors(cut: int) -> None:
    props = commands.Basic.Properties(content_type="a/b", message_id="m" * 10, headers={"k": 1})
    raw = _payload(header.ContentHeader(0, 5, props))
    with pytest.raises(ValueError):
        content_header(raw[:cut])
    deliver = _payload(commands.Basic.Deliver("ctag", 7, False, "ex", "rk.long.key"))
    with pytest.raises(ValueError):
        deliver_fields(deliver[:cut] if cut < 16 else deliver[:-3])


@pytest.mark.parametrize("multiple", [False, True])
@pytest.mark.parametrize("requeue", [False, True])
def test_acks_and_nacks_are_the_frames_pamqp_encodes(multiple: bool, requeue: bool) -> None:
    tag = 2**40 + 3
    assert ack_frame(5, tag, multiple) == frame.marshal(commands.Basic.Ack(tag, multiple), 5)
    assert nack_frame(5, tag, multiple, requeue) == frame.marshal(
        commands.Basic.Nack(tag, multiple, requeue), 5
    )
    assert reject_frame(5, tag, requeue) == frame.marshal(commands.Basic.Reject(tag, requeue), 5)


# The framing, fed bytes by hand -----------------------------------------------------------


class Feed:
    """What a consuming channel's reader reports to (the FrameFeed's side)."""

    def __init__(self) -> None:
        self.lost: list[Exception] = []
        self.cancelled: list[str] = []

    def broker_cancelled(self, reader: Any, tag: str) -> None:
        self.cancelled.append(tag)

    def channel_lost(self, reader: Any, exc: Exception) -> None:
        self.lost.append(exc)


def consuming() -> tuple[Wire, Transport, Feed, list[tuple[FrameDelivery, Delivery]]]:
    wire, transport, feed = Wire(), Transport(), Feed()
    wire.transport = transport  # type: ignore[assignment]
    got: list[tuple[FrameDelivery, Delivery]] = []

    async def on_delivery(message: Any, delivery: Delivery) -> None:
        got.append((message, delivery))

    feed.queue = "ns.q"  # type: ignore[attr-defined]
    wire.readers[CONSUME_CHANNEL] = _Consuming(feed, wire, on_delivery)  # type: ignore[arg-type]
    return wire, transport, feed, got


def delivery_frames(tag: int, payload: bytes, frame_max: int = 4096, **props: Any) -> bytes:
    out = frame.marshal(commands.Basic.Deliver("ctag", tag, tag % 2 == 0, "ex", "rk"), 3)
    out += frame.marshal(
        header.ContentHeader(0, len(payload), commands.Basic.Properties(**props)), 3
    )
    step = frame_max - 8
    for start in range(0, len(payload), step):
        out += frame.marshal(body.ContentBody(payload[start : start + step]), 3)
    return out


@pytest.mark.parametrize("split", [0, 1, 7, 100])
def test_deliveries_are_put_together_from_frames_however_the_bytes_arrive(split: int) -> None:
    async def scenario() -> None:
        wire, _, feed, got = consuming()
        payloads = [b"", b"x" * 10, bytes(range(256)) * 40]  # none, one, several body frames
        data = b"".join(
            delivery_frames(
                n + 1,
                p,
                message_id=f"m{n}",
                content_type="application/json",
                headers={"n": n, "deep": {"list": [1, "a"]}},
            )
            for n, p in enumerate(payloads)
        )
        data += frame.marshal(commands.Basic.QosOk(), 3)  # not a delivery: the wire's
        pieces = [data] if not split else [data[i : i + split] for i in range(0, len(data), split)]
        for piece in pieces:
            wire.data_received(piece)
        await asyncio.sleep(0)
        assert [d.body for _, d in got] == payloads
        assert [m.delivery_tag for m, _ in got] == [1, 2, 3]
        assert [d.redelivered for _, d in got] == [False, True, False]
        assert [d.message_id for _, d in got] == ["m0", "m1", "m2"]
        assert got[2][1].headers == {"n": 2, "deep": {"list": [1, "a"]}}
        assert got[0][1].content_type == "application/json" and got[0][1].queue == "ns.q"
        assert wire.closed is None and not feed.lost

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "bad",
    [
        frame.marshal(body.ContentBody(b"stray"), 3),  # a body outside a delivery
        delivery_frames(1, b"abc")[:-12] + frame.marshal(body.ContentBody(b"too long!"), 3),
        delivery_frames(1, b"abc")[:-1] + b"\x00",  # no frame end
    ],
    ids=["stray-body", "body-longer-than-header", "no-frame-end"],
)
def test_a_malformed_delivery_ends_the_connection_and_tells_the_feed(bad: bytes) -> None:
    async def scenario() -> None:
        wire, transport, feed, got = consuming()
        wire.data_received(bad)
        await asyncio.sleep(0)
        assert not got and transport.closed
        assert isinstance(wire.closed, WireClosed) and "unreadable frame" in str(wire.closed)
        assert len(feed.lost) == 1 and feed.lost[0] is wire.closed

    asyncio.run(scenario())


def test_acks_go_out_in_order_and_never_on_a_closed_channel() -> None:
    async def scenario() -> None:
        wire, transport, feed, got = consuming()
        wire.data_received(delivery_frames(1, b"a") + delivery_frames(2, b"b"))
        await asyncio.sleep(0)
        (first, _), (second, _) = got
        await first.nack(requeue=True)
        await second.ack(multiple=True)
        await asyncio.sleep(0)  # written at the end of the loop turn, in one write
        # one delivery goes back with a reject: RabbitMQ 4.3 counts that toward a delivery
        # limit, a nack not
        assert transport.written == reject_frame(3, 1, True) + ack_frame(3, 2, True)
        wire.data_received(
            frame.marshal(commands.Basic.Cancel("ctag"), 3)
            + frame.marshal(commands.Channel.Close(406, "PRECONDITION_FAILED", 60, 80), 3)
        )
        assert feed.cancelled == ["ctag"] and "406" in str(feed.lost[0])
        assert isinstance(frame.unmarshal(transport.written[-12:])[2], commands.Channel.CloseOk)
        with pytest.raises(Exception, match="406"):
            await first.ack()  # its channel is gone: the broker requeued it already

    asyncio.run(scenario())


def test_a_full_transport_holds_writers_until_it_drains_or_the_connection_goes() -> None:
    async def scenario() -> None:
        wire, _, _, _ = consuming()
        await wire.drained()  # not paused: at once
        assert wire.writable
        wire.pause_writing()
        assert not wire.writable
        woken: list[str] = []
        wire.when_writable(lambda: woken.append("callback"))
        waiter = asyncio.ensure_future(wire.drained())
        await asyncio.sleep(0)
        assert not waiter.done() and not woken
        wire.resume_writing()
        await asyncio.wait_for(waiter, 5)
        assert woken == ["callback"]

        wire.pause_writing()
        waiter = asyncio.ensure_future(wire.drained())
        await asyncio.sleep(0)
        wire.connection_lost(None)
        with pytest.raises(WireClosed):
            await waiter

    asyncio.run(scenario())


def test_decimal_and_timestamp_headers_keep_pamqps_types() -> None:
    table = {"d": decimal.Decimal("1.25"), "t": datetime.datetime(2030, 1, 2, tzinfo=datetime.UTC)}
    raw = encode.field_table(table)
    got, _ = field_table(raw, 0)
    assert got == decode.field_table(raw)[1]
    assert isinstance(got["d"], decimal.Decimal) and isinstance(got["t"], datetime.datetime)


@pytest.mark.parametrize(
    "seconds",
    [0, 1, 1_764_244_800, 0xFFFFFFFF, 0xFFFFFFFF + 1, 1_764_244_800_123, 253_402_300_799_000],
)
def test_a_timestamp_reads_as_pamqp_reads_it_seconds_or_milliseconds(seconds: int) -> None:
    """Read without pamqp (every x-death entry has one): past 2**32 pamqp takes the
    value for milliseconds, and so does the frame feed."""
    raw = struct.pack(">I", 11) + b"\x01tT" + struct.pack(">Q", seconds)
    got, end = field_table(raw, 0)
    assert (got, end) == (decode.field_table(raw)[1], len(raw))
    assert got["t"].tzinfo is not None


@pytest.mark.parametrize("seconds", [2**64 - 1, 253_402_300_800_000_000])
def test_a_timestamp_past_what_a_datetime_holds_is_a_value_error(seconds: int) -> None:
    raw = struct.pack(">I", 11) + b"\x01tT" + struct.pack(">Q", seconds)
    with pytest.raises(ValueError):
        field_table(raw, 0)


def test_a_truncated_timestamp_is_a_value_error() -> None:
    raw = struct.pack(">I", 7) + b"\x01tT" + b"\x00\x00\x00\x01"
    with pytest.raises(ValueError):
        field_table(raw, 0)


def _x_death(queue: str = "app.tier.30s") -> dict[str, Any]:
    """A dead-lettered delivery's headers as RabbitMQ writes them (its x-death array)."""
    entry = {
        "count": 1,
        "reason": "expired",
        "queue": queue,
        "time": datetime.datetime(2026, 11, 28, 3, 0, 1, tzinfo=datetime.UTC),
        "exchange": "app.tiers",
        "routing-keys": [queue],
    }
    return {"delayq-attempt": 1, "x-death": [entry], "x-first-death-queue": queue}


def test_an_array_seen_before_is_handed_out_as_a_new_copy_each_time() -> None:
    """Arrays are decoded once per distinct bytes (the x-death of a tier's messages repeats):
    what a handler changes in one delivery's headers is not in the next one's."""
    raw = encode.field_table(_x_death())
    expected = decode.field_table(raw)[1]
    first, _ = field_table(raw, 0)
    first["x-death"][0]["count"] = 99
    first["x-death"][0]["routing-keys"].append("changed")
    first["x-death"].append({"added": True})
    second, end = field_table(raw, 0)
    assert (second, end) == (expected, len(raw))
    assert second["x-death"] is not first["x-death"]
    third, _ = field_table(raw, 0)
    assert third["x-death"] is not second["x-death"]
    assert third["x-death"][0] is not second["x-death"][0]
    assert third["x-death"][0]["routing-keys"] is not second["x-death"][0]["routing-keys"]


def test_a_byte_array_in_an_array_is_copied_too() -> None:
    content = b"x" + struct.pack(">I", 3) + b"abc"  # one byte array item
    array = b"A" + struct.pack(">I", len(content)) + content
    raw = struct.pack(">I", 2 + len(array)) + b"\x01a" + array
    first, _ = field_table(raw, 0)
    first["a"][0][0] = ord("z")
    second, _ = field_table(raw, 0)
    assert second == decode.field_table(raw)[1] == {"a": [bytearray(b"abc")]}


def test_arrays_kept_are_bounded_and_any_of_them_reads_as_pamqp() -> None:
    from delayq.message import decoding

    raws = [encode.field_table(_x_death(f"app.tier.{n}s")) for n in range(300)]
    for raw in raws + raws[::-1]:
        assert field_table(raw, 0) == (decode.field_table(raw)[1], len(raw))
        assert len(decoding._ARRAYS) <= decoding.KEPT_ARRAYS


@pytest.mark.parametrize("times", [1, 2])
def test_a_truncated_array_is_a_value_error_whether_or_not_seen_before(times: int) -> None:
    whole = encode.field_table(_x_death("app.tier.cut"))
    field_table(whole, 0)  # seen once, whole
    cut = whole[:-5]
    for _ in range(times):
        with pytest.raises(ValueError):
            field_table(cut, 0)


# Keys that start a table's "x-" tail (read once per distinct bytes) among others.
_tail_keys = st.one_of(
    st.text(max_size=12).map(lambda text: "x-" + text),
    st.sampled_from(
        [
            *("x-death", "x-death", "x-first-death-reason", "x-last-death-reason"),
            *("x-request-id", "x", "x-", "X-death", "delayq-attempt", "zz", ""),
        ]
    ),
    st.text(max_size=8),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_tail_keys, _values, max_size=8), st.integers(1, 3))
def test_a_table_with_an_x_tail_reads_as_pamqp_however_often_it_is_seen(
    table: dict[str, Any], times: int
) -> None:
    raw = b"pad" + encode.field_table(table) + b"tail"
    consumed, expected = decode.field_table(raw[3:])
    for _ in range(times):
        got, end = field_table(raw, 3)
        assert got == expected
        assert list(got) == list(expected)  # the keys in the broker's order
        assert end == 3 + consumed


def _pairs(*pairs: tuple[str, bytes]) -> bytes:
    """A field table's bytes from its ``(key, typed value)`` pairs, duplicates kept."""
    content = b"".join(bytes([len(k)]) + k.encode() + v for k, v in pairs)
    return struct.pack(">I", len(content)) + content


def test_a_key_met_in_the_head_and_again_in_the_tail_keeps_its_place_and_the_later_value() -> None:
    array = b"A" + struct.pack(">I", 2) + b"b\x07"
    raw = _pairs(("x-q", b"b\x01"), ("a", b"b\x02"), ("x-q", b"b\x03"), ("x-death", array))
    expected = decode.field_table(raw)[1]
    for _ in range(2):
        got, _ = field_table(raw, 0)
        assert got == expected == {"x-q": 3, "a": 2, "x-death": [7]}
        assert list(got) == list(expected)
    head_first = _pairs(("x-q", b"b\x01"), ("x-death", array), ("a", b"b\x02"), ("x-q", b"b\x05"))
    assert field_table(head_first, 0)[0] == decode.field_table(head_first)[1]


def test_a_tail_seen_before_is_handed_out_as_a_new_copy_each_time() -> None:
    """The x- tail (x-death and the x-*-death-* strings) is decoded once per distinct
    bytes: what a handler changes in one delivery's headers is not in the next one's."""
    headers = _x_death("app.tier.copy") | {"x-last-death-reason": "expired"}
    raw = encode.field_table(headers)
    expected = decode.field_table(raw)[1]
    first, _ = field_table(raw, 0)
    first["x-first-death-queue"] = "changed"
    first["x-death"][0]["routing-keys"].append("changed")
    del first["x-last-death-reason"]
    second, _ = field_table(raw, 0)
    assert second == expected
    second["x-death"].clear()
    assert field_table(raw, 0)[0] == expected


def test_tails_kept_are_bounded_and_any_of_them_reads_as_pamqp() -> None:
    from delayq.message import decoding

    raws = [encode.field_table(_x_death(f"app.tier.{n}t")) for n in range(300)]
    for raw in raws + raws[::-1]:
        assert field_table(raw, 0) == (decode.field_table(raw)[1], len(raw))
        assert len(decoding._TAILS) <= decoding.KEPT_ARRAYS


@pytest.mark.parametrize("times", [1, 2])
def test_a_tail_cut_short_or_running_past_its_table_is_a_value_error(times: int) -> None:
    whole = encode.field_table(_x_death("app.tier.tailcut"))
    field_table(whole, 0)  # seen once, whole
    # the table's length says 3 bytes fewer than its pairs take: the last value runs past it
    short = struct.pack(">I", len(whole) - 7) + whole[4:]
    for _ in range(times):
        with pytest.raises(ValueError):
            field_table(whole[:-3], 0)
        with pytest.raises(ValueError):
            field_table(short, 0)
    # a key that starts "x-" and then runs past the table's end
    with pytest.raises(ValueError):
        field_table(struct.pack(">I", 3) + b"\x09x-", 0)


def test_what_the_broker_added_is_remembered_apart_from_an_applications_later_headers() -> None:
    """An application's own ``x-request-id`` sorts after RabbitMQ's ``x-*-death-*`` and
    differs per message: the broker's part is still decoded once, the rest every time."""
    from delayq.message import decoding

    decoding._TAILS.clear()
    base = _x_death("app.tier.req") | {"x-last-death-reason": "expired"}
    for n in range(200):
        raw = encode.field_table(base | {"x-request-id": f"req-{n}", "zz": n})
        expected = decode.field_table(raw)[1]
        got, end = field_table(raw, 0)
        assert (got, end) == (expected, len(raw))
        assert list(got) == list(expected)
    assert len(decoding._TAILS) == 1


@pytest.mark.parametrize(
    "inside",
    [
        "\x07x-death",
        "\x13x-last-death-reason",
        "\x14x-first-death-reasonS\x00\x00\x00\x01",
        "\x13x-last-death-reasonS\x7f\x7f\x7f\x7f",  # a size past the table
    ],
)
def test_the_keys_bytes_inside_a_value_read_as_pamqp(inside: str) -> None:
    """Where the bytes searched for are inside a string or a nested table, the table is
    read on as it is, seen once or again."""
    tables = [
        {"a": f"pre{inside}post"} | _x_death("app.tier.in"),
        {"x-death": [{"count": 1}], "x-last-death-queue": {"q": inside}, "x-z": 1},
        {"x-death": [{"count": 1}], "x-first-death-queue": inside, "x-z": 2},
        {"x-death": [inside], "x-z": 3},
    ]
    for table in tables:
        raw = encode.field_table(table)
        for _ in range(2):
            assert field_table(raw, 0) == (decode.field_table(raw)[1], len(raw))
