"""The frame link's pure parts and its wire fed frames by hand (no network).

Its real-broker counterpart is tests/integration/test_frame_link.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from typing import Any

import pytest
from pamqp import body, commands, frame, header

from delayq import Message, Topology
from delayq.aio._confirms import Confirms
from delayq.aio._framelink import endpoint_of
from delayq.aio._link import aio_message
from delayq.aio._wire import ChannelClosed, Wire, WireClosed
from delayq.errors import InvalidInput
from delayq.message.factory import MessageFactory
from delayq.message.frames import publish_frames
from delayq.urls import parse_url
from tests.unit.wire_fakes import Transport

TOPO = Topology(namespace="frames", ladder=["1s", "1h"], external_bindings=["job.#"])
FACTORY = MessageFactory(TOPO)


def pamqp_frames(msg: Any, frame_max: int) -> bytes:
    """What aio-pika's link writes for ``msg`` (pamqp's own encoding)."""
    am = aio_message(msg)
    method = commands.Basic.Publish(
        exchange=msg.exchange, routing_key=msg.routing_key, mandatory=True
    )
    out = frame.marshal(method, 1)
    out += frame.marshal(header.ContentHeader(0, len(msg.body), am.properties), 1)
    for start in range(0, len(msg.body), frame_max - 8):
        out += frame.marshal(body.ContentBody(msg.body[start : start + frame_max - 8]), 1)
    return out


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {"tenant": "t1", "n": 7, "neg": -70_000, "big": 2**40, "u16": 40_000, "u32": 3_000_000_000},
        {"ok": True, "none": None, "raw": b"\x00\x01", "list": [1, "a", b"b"], "map": {"k": 1}},
        {"ünï": "cödé", "empty": ""},
    ],
    ids=["delayq", "integers", "others", "unicode"],
)
@pytest.mark.parametrize("size", [0, 256, 131_072 - 8, 131_072 - 7, 300_001])
def test_frames_are_the_bytes_aio_pikas_link_sends(headers: Any, size: int) -> None:
    msg = FACTORY.build(os.urandom(size), "job.a", "1s", headers=headers)
    assert publish_frames(msg, 1, 131_072) == pamqp_frames(msg, 131_072)


def test_a_small_frame_max_splits_the_body_into_more_frames() -> None:
    msg = FACTORY.build(os.urandom(10_000), "job.a", "1s")
    assert publish_frames(msg, 1, 4_096) == pamqp_frames(msg, 4_096)


CARRIED = {
    "content_type": "application/json", "content_encoding": "gzip", "priority": 7,
    "correlation_id": "c-1", "reply_to": "answers", "type": "orders.created",
    "app_id": "shop", "user_id": "guest", "timestamp": 1_700_000_000,
}  # fmt: skip


@pytest.mark.parametrize("carried", [{"priority": 0}, {"correlation_id": "only"}, CARRIED])
def test_further_properties_are_carried_as_pamqp_and_aio_pika_send_them(carried: Any) -> None:
    built = FACTORY.build(b'{"a": 1}', "job.a", "1s", headers={"n": 1})
    msg = dataclasses.replace(built, properties=carried)
    frames = publish_frames(msg, 1, 131_072)
    assert frames == pamqp_frames(msg, 131_072)
    _used, _channel, method = frame.unmarshal(frames)
    _used2, _channel, content = frame.unmarshal(frames[_used:])
    assert isinstance(method, commands.Basic.Publish)
    sent = content.properties
    names = {"type": "message_type"}
    for key, value in carried.items():
        got = getattr(sent, names.get(key, key))
        assert (int(got.timestamp()) if key == "timestamp" else got) == value
    assert sent.headers["n"] == 1 and sent.delivery_mode == 2
    assert sent.message_id == msg.message_id


@pytest.mark.parametrize(
    "carried",
    [{"expiration": "1000"}, {"x-delay": 5}, {"priority": "high"}, {"priority": 300}],
    ids=["expiration", "unknown", "priority-text", "priority-range"],
)
def test_a_property_that_cannot_be_carried_is_refused_before_any_io(carried: Any) -> None:
    msg = dataclasses.replace(FACTORY.build(b"x", "job.a", "1s"), properties=carried)
    with pytest.raises(InvalidInput):
        publish_frames(msg, 1, 131_072)


class Sink:
    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def settled(self, token: int, acked: bool, returned: bool) -> None:
        self.seen.append((token, acked, returned))

    def failed(self, token: int, exc: Exception) -> None:
        self.seen.append((token, type(exc).__name__))


def test_confirms_multiple_single_out_of_order_and_nacks() -> None:
    sink, book = Sink(), Confirms()
    tags = [book.add(sink, n, ("x", "k", f"m{n}")) for n in range(6)]
    assert tags == [1, 2, 3, 4, 5, 6]
    book.confirm(3, multiple=False, acked=True)
    book.confirm(2, multiple=True, acked=True)
    book.confirm(5, multiple=False, acked=False)
    book.confirm(6, multiple=True, acked=True)
    book.confirm(6, multiple=True, acked=True)  # again: nothing is settled twice
    assert sink.seen == [
        (2, True, False),
        (0, True, False),
        (1, True, False),
        (4, False, False),
        (3, True, False),
        (5, True, False),
    ]
    assert not book.pending


def test_a_return_names_the_first_matching_message_after_the_last_returned() -> None:
    sink, book = Sink(), Confirms()
    # The same id on two exchanges, twice: only the "gone" exchange's are returned.
    routes = [("kept", "k", "a"), ("gone", "k", "a"), ("kept", "k", "a"), ("gone", "k", "a")]
    for n, route in enumerate(routes):
        book.add(sink, n, route)
    book.returned(("gone", "k", "a"))
    book.returned(("gone", "k", "a"))
    book.returned(("nowhere", "k", "z"))  # names nothing in flight: ignored
    book.confirm(4, multiple=True, acked=True)
    assert sink.seen == [(0, True, False), (1, True, True), (2, True, False), (3, True, True)]


def test_a_closed_channel_fails_everything_unconfirmed_once() -> None:
    sink, book = Sink(), Confirms()
    for n in range(3):
        book.add(sink, n, ("x", "k", f"m{n}"))
    book.confirm(1, multiple=False, acked=True)
    book.fail_all(WireClosed(0, "lost"))
    book.confirm(3, multiple=True, acked=True)  # a late ack after the loss: ignored
    assert sink.seen == [(0, True, False), (1, "WireClosed"), (2, "WireClosed")]


def opened() -> tuple[Wire, Transport]:
    wire = Wire()
    transport = Transport()
    wire.transport = transport  # type: ignore[assignment]
    return wire, transport


def feed(wire: Wire, *frames: tuple[int, Any], split: int = 0) -> None:
    data = b"".join(frame.marshal(value, channel) for channel, value in frames)
    if split:  # bytes arriving in pieces
        for start in range(0, len(data), split):
            wire.data_received(data[start : start + split])
    else:
        wire.data_received(data)


def written(transport: Transport) -> list[Any]:
    values, data = [], transport.written
    while data:
        size, _, value = frame.unmarshal(data)
        values.append(value)
        data = data[size:]
    return values


def test_the_wire_settles_acks_returns_and_follows_blocked() -> None:
    async def scenario() -> None:
        wire, _ = opened()
        sink = Sink()
        msgs = [FACTORY.build(b"x" * 10, "job.a", "1s") for _ in range(4)]
        for n, msg in enumerate(msgs):
            frames = publish_frames(msg, 1, wire.frame_max)
            wire.publish(frames, sink, n, (msg.exchange, msg.routing_key, msg.message_id))
        returned = msgs[2]
        props = commands.Basic.Properties(message_id=returned.message_id)
        feed(
            wire,
            (0, commands.Connection.Blocked(reason="low on memory")),
            (1, commands.Basic.Return(312, "NO_ROUTE", returned.exchange, returned.routing_key)),
            (1, header.ContentHeader(0, 10, props)),
            (1, body.ContentBody(b"x" * 10)),
            (1, commands.Basic.Ack(3, multiple=True)),
            split=7,
        )
        assert wire.blocked
        feed(wire, (0, commands.Connection.Unblocked()), (1, commands.Basic.Nack(4)))
        assert not wire.blocked
        assert sink.seen == [(0, True, False), (1, True, False), (2, True, True), (3, False, False)]

    asyncio.run(scenario())


def test_a_channel_closed_by_the_broker_fails_its_messages_and_answers_close_ok() -> None:
    async def scenario() -> None:
        wire, transport = opened()
        sink = Sink()
        wire.publish(b"", sink, 0, ("x", "k", "m"))
        feed(wire, (1, commands.Channel.Close(404, "NOT_FOUND - no exchange 'x'", 60, 40)))
        assert sink.seen == [(0, "ChannelClosed")]
        assert isinstance(written(transport)[-1], commands.Channel.CloseOk)
        assert not wire.usable
        with pytest.raises(ChannelClosed, match="404"):
            wire.publish(b"", sink, 1, ("x", "k", "m"))

    asyncio.run(scenario())


def test_a_connection_closed_by_the_broker_or_unreadable_frames_end_the_wire() -> None:
    async def scenario() -> None:
        wire, transport = opened()
        sink = Sink()
        wire.publish(b"", sink, 0, ("x", "k", "m"))
        feed(wire, (0, commands.Connection.Close(320, "CONNECTION_FORCED", 0, 0)))
        assert sink.seen == [(0, "WireClosed")] and transport.closed
        assert isinstance(wire.closed, WireClosed) and wire.closed.reply_code == 320
        with pytest.raises(WireClosed):
            wire.publish(b"", sink, 1, ("x", "k", "m"))

        garbled, transport = opened()
        garbled.publish(b"", sink, 2, ("x", "k", "m"))
        garbled.data_received(b"\x09\x00\x01\x00\x00\x00\x01\x00\xce")  # no such frame type
        assert sink.seen[-1] == (2, "WireClosed") and transport.closed

    asyncio.run(scenario())


def test_endpoints_take_the_urls_defaults() -> None:
    plain = endpoint_of(parse_url("amqp://h"), "n")
    assert (plain.host, plain.port, plain.user, plain.password, plain.vhost) == (
        "h",
        5672,
        "guest",
        "guest",
        "/",
    )
    full = endpoint_of(parse_url("amqp://u%40x:p%2Fw@h:1234/%2Fv?heartbeat=5"), "n")
    assert (full.port, full.user, full.password, full.vhost, full.heartbeat_s) == (
        1234,
        "u@x",
        "p/w",
        "/v",
        5,
    )
    assert "p/w" not in repr(full)
    tls = endpoint_of(parse_url("amqps://h/?verify=false"), "n")
    assert tls.port == 5671 and tls.ssl_context is not None


class FakeWire:
    """A wire that acks each publish at the next loop turn, until ``lose_after`` publishes:
    then the connection is lost (the ones in flight fail), as a broker closing it would."""

    def __init__(self, lose_after: int | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.frame_max = 131_072
        self.blocked = False
        self.blocked_at: float | None = None
        self.confirms = Confirms()
        self.closed: Exception | None = None
        self.lose_after = lose_after
        self.sent = 0
        self.writable = True  # the socket always takes writes

    @property
    def usable(self) -> bool:
        return self.closed is None

    def publish(self, frames: bytes, sink: Any, token: int, route: Any) -> None:
        if self.closed is not None:
            raise self.closed
        tag = self.confirms.add(sink, token, route)
        self.sent += 1
        if self.lose_after is not None and self.sent > self.lose_after:
            self.loop.call_soon(self.abort)
        else:
            self.loop.call_soon(self.ack, tag)

    def ack(self, tag: int) -> None:
        if self.closed is None:
            self.confirms.confirm(tag, multiple=False, acked=True)

    def abort(self) -> None:
        if self.closed is None:
            self.closed = WireClosed(0, "lost")
            self.confirms.fail_all(self.closed)


def fake_link(plan: list[FakeWire | None], **options: Any) -> Any:
    from delayq.aio._framelink import FrameLink
    from delayq.errors import ConnectionFailed
    from delayq.links import LinkOptions, gate_for

    class Link(FrameLink):
        async def wire(self) -> Any:
            current = self._wire
            if current is not None and current.usable:
                return current
            step = plan.pop(0) if plan else None
            if step is None:
                raise ConnectionFailed("cannot connect (fake)")
            self._wire = step  # type: ignore[assignment]
            return step

        async def check_exchanges(self, wire: Any, names: set[str]) -> None:
            pass

    url = "amqp://guest:guest@127.0.0.1:1/"
    return Link(url, gate_for(TOPO, url), LinkOptions(retry_backoff_s=0, **options))


def test_a_batch_cut_with_no_reconnect_names_exactly_the_unconfirmed() -> None:
    from delayq import PublishBatchError, PublishUnconfirmed

    built = FACTORY.build_many([Message(b"x", "job.a", "1s") for _ in range(300)])

    async def scenario() -> PublishBatchError:
        link = fake_link([FakeWire(lose_after=120)])  # then no connection can be opened
        with pytest.raises(PublishBatchError) as caught:
            await link.send_batch(built, 40)
        return caught.value

    error = asyncio.run(scenario())
    confirmed = [r for r in error.receipts if r is not None]
    assert len(confirmed) == 120  # the first 120 were acked, nothing after
    assert set(error.failures) == set(range(120, 300))
    assert all(isinstance(e, PublishUnconfirmed) for e in error.failures.values())


def test_a_batch_cut_and_reconnected_is_all_confirmed() -> None:
    built = FACTORY.build_many([Message(b"x", "job.a", "1s") for _ in range(300)])

    async def scenario() -> None:
        link = fake_link([FakeWire(lose_after=70), FakeWire(lose_after=None)])
        await link.send_batch(built, 40)

    asyncio.run(scenario())  # no PublishBatchError: what was lost was sent again


def test_a_connection_that_never_confirms_costs_every_attempt_then_fails() -> None:
    from delayq import PublishBatchError

    built = FACTORY.build_many([Message(b"x", "job.a", "1s") for _ in range(10)])
    plan: list[FakeWire | None] = []

    async def scenario() -> PublishBatchError:
        plan.extend(FakeWire(lose_after=0) for _ in range(5))
        link = fake_link(plan, publish_attempts=3)
        with pytest.raises(PublishBatchError) as caught:
            await link.send_batch(built, 4)
        return caught.value

    error = asyncio.run(scenario())
    assert set(error.failures) == set(range(10)) and len(plan) == 2  # 3 rounds, then gave up


class SlowSocketWire(FakeWire):
    """A wire whose socket falls behind after every ``every`` publishes: the transport's
    buffer is past its high-water mark until the test lets it drain."""

    def __init__(self, every: int) -> None:
        super().__init__(lose_after=None)
        self.every = every
        self.writable = True
        self.waiting: list[Any] = []
        self.most_unwritten = 0
        self._since = 0

    def publish(self, frames: bytes, sink: Any, token: int, route: Any) -> None:
        assert self.writable, "a publish while the socket is behind"
        super().publish(frames, sink, token, route)
        self._since += 1
        self.most_unwritten = max(self.most_unwritten, self._since)
        if self._since >= self.every:
            self.writable = False
            self.loop.call_later(0.001, self.drain)

    def when_writable(self, callback: Any) -> None:
        self.waiting.append(callback)

    def drain(self) -> None:
        self.writable, self._since = True, 0
        waiting, self.waiting = self.waiting, []
        for callback in waiting:
            callback()


def test_a_batch_waits_for_the_socket_instead_of_buffering_past_it() -> None:
    built = FACTORY.build_many([Message(b"x", "job.a", "1s") for _ in range(200)])
    wire: list[SlowSocketWire] = []

    async def scenario() -> None:
        wire.append(SlowSocketWire(every=7))
        link = fake_link([wire[0]])
        await link.send_batch(built, 50)  # a window far larger than what the socket takes

    asyncio.run(scenario())  # all confirmed, none written while the socket was behind
    assert wire[0].sent == 200 and wire[0].most_unwritten == 7


class _Recording(Wire):
    def __init__(self) -> None:
        super().__init__()
        self.confirms_read: list[tuple[int, bool, bool]] = []

    def _confirmed(self, tag: int, multiple: bool, acked: bool) -> None:
        self.confirms_read.append((tag, multiple, acked))


def test_confirms_read_by_hand_are_what_pamqp_reads() -> None:
    """The wire reads ``Basic.Ack`` and ``Basic.Nack`` without pamqp (a publisher's
    hottest frames): every tag, flag and split gives what pamqp's decoder gives."""

    async def scenario() -> None:
        rng = random.Random(7)
        tags = [1, 2, 255, 256, 2**31, 2**32 + 5, 2**63 - 1] + [
            rng.randrange(1, 2**63) for _ in range(50)
        ]
        methods: list[Any] = []
        for tag in tags:
            methods.append(commands.Basic.Ack(tag, multiple=rng.random() < 0.5))
            methods.append(
                commands.Basic.Nack(tag, multiple=rng.random() < 0.5, requeue=rng.random() < 0.5)
            )
        expected = [
            (m.delivery_tag, m.multiple, isinstance(m, commands.Basic.Ack)) for m in methods
        ]
        for split in (0, 1, 5, 21, 64):
            wire = _Recording()
            wire.transport = Transport()  # type: ignore[assignment]
            feed(wire, *((1, m) for m in methods), split=split)
            assert wire.confirms_read == expected, split
            assert wire.closed is None

        garbled = _Recording()
        garbled.transport = Transport()  # type: ignore[assignment]
        data = bytearray(frame.marshal(commands.Basic.Ack(9), 1))
        data[-1] = 0x00  # no frame end: not a confirm, and pamqp refuses it
        garbled.data_received(bytes(data))
        assert garbled.confirms_read == [] and garbled.closed is not None

    asyncio.run(scenario())
