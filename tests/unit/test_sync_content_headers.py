"""The sync consumer's connection reads Basic content headers with delayq's decoder
(``delayq.sync._connection.read_content_headers``): the ``pika.BasicProperties`` its
consumers get must be what pika's own decoding gives, every property and header, values
and their types alike; what delayq's decoder leaves to pika, pika reads (or refuses) as
before."""

from __future__ import annotations

import datetime
import decimal
import inspect
import struct
from typing import Any

import pika
import pika.connection
import pika.data
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import encode
from pika import frame, spec
from pika.compat import long

from delayq.message.decoding import PROPERTY_NAMES
from delayq.sync import _connection
from delayq.sync._connection import read_content_headers

_scalars = st.one_of(
    st.text(max_size=20),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
    st.none(),
    st.datetimes(
        min_value=datetime.datetime(2000, 1, 1), max_value=datetime.datetime(2100, 1, 1)
    ).map(lambda d: d.replace(microsecond=0, tzinfo=datetime.UTC)),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
_short = st.text(max_size=40)
_properties = st.fixed_dictionaries(
    {},
    optional={
        "content_type": _short,
        "content_encoding": _short,
        "headers": st.dictionaries(st.text(max_size=20), _values, max_size=8),
        "delivery_mode": st.sampled_from([1, 2]),
        "priority": st.integers(min_value=0, max_value=255),
        "correlation_id": _short,
        "reply_to": _short,
        "expiration": st.integers(min_value=0, max_value=10**9).map(str),
        "message_id": _short,
        "timestamp": st.integers(min_value=0, max_value=2**40),
        "type": _short,
        "user_id": _short,
        "app_id": _short,
        "cluster_id": _short,
    },
)


def _header_frame(props: pika.BasicProperties, body_size: int = 300, channel: int = 1) -> bytes:
    return frame.Header(channel, body_size, props).marshal()


def _read(data: bytes) -> tuple[int, Any]:
    impl = _Impl(data)
    assert read_content_headers(_Connection(impl))
    return impl._read_frame()


class _Impl:
    """What the reader uses of pika's connection: the frame buffer and ``_read_frame``."""

    def __init__(self, data: bytes) -> None:
        self._frame_buffer = data

    def _read_frame(self) -> tuple[int, Any]:
        return frame.decode_frame(self._frame_buffer)  # pika's, replaced by the reader


class _Connection:
    def __init__(self, impl: Any) -> None:
        self._impl = impl


def _as_pika_reads(data: bytes) -> tuple[int, Any]:
    return frame.decode_frame(data)


@settings(max_examples=300, deadline=None)
@given(_properties, st.integers(min_value=0, max_value=2**40), st.integers(1, 65535))
def test_a_content_header_reads_as_pika_reads_it(
    given_props: dict[str, Any], body_size: int, channel: int
) -> None:
    data = _header_frame(pika.BasicProperties(**given_props), body_size, channel) + b"next"
    (ours, got), (theirs, expected) = _read(data), _as_pika_reads(data)
    assert ours == theirs == len(data) - 4
    assert isinstance(got, frame.Header)
    assert (got.channel_number, got.body_size) == (expected.channel_number, expected.body_size)
    for name in PROPERTY_NAMES:
        assert _same(getattr(got.properties, name), getattr(expected.properties, name)), name


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (pika's ``long`` is not an ``int``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


_any_values = st.recursive(
    st.one_of(
        _scalars,
        st.floats(width=32, allow_nan=False, allow_infinity=False),
        st.decimals(places=2, min_value=-1000, max_value=1000, allow_nan=False),
        st.binary(max_size=8).map(bytearray),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=20), _any_values, max_size=8))
def test_any_table_pamqp_encodes_reads_as_pika_reads_it(table: dict[str, Any]) -> None:
    """Every type on the wire (aio-pika's publishers send floats, decimals, byte arrays):
    what delayq reads is pika's, or pika reads it."""
    data = _with_table(encode.field_table(table)[4:])
    (ours, got), (theirs, expected) = _read(data), _as_pika_reads(data)
    assert ours == theirs == len(data)
    assert _same(got.properties.headers, expected.properties.headers)


def test_delayqs_decoder_read_it_not_pikas(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above cannot tell who read the header: this one can."""
    calls: list[int] = []
    real = _connection.basic_properties

    def counted(data: bytes, offset: int, end: int, table: Any = None) -> dict[str, Any]:
        calls.append(offset)
        return real(data, offset, end, table)

    monkeypatch.setattr(_connection, "basic_properties", counted)
    props = pika.BasicProperties(message_id="m-1", headers={"x-death": [{"count": 1}]})
    _, got = _read(_header_frame(props))
    assert calls and got.properties.message_id == "m-1"
    assert got.properties.headers == {"x-death": [{"count": 1}]}


def test_values_keep_pikas_types_and_what_pika_reads_differently_is_left_to_it() -> None:
    """pika's ``long`` for 64-bit integers (its encoder keeps them 64 bits wide when a
    retry carries a header on), ``bytes`` for a byte array; a float (pika 1.4 truncates
    it to an integer) or a decimal: the whole header read by pika."""
    data = _with_table(encode.field_table({"wide": 2**40, "one": 1, "raw": bytearray(b"x")})[4:])
    read = _connection._content_header(data)
    assert read is not None
    headers = read[1].properties.headers
    assert type(headers["wide"]) is long and type(headers["one"]) is int
    assert type(headers["raw"]) is bytes
    for odd in ({"ratio": 0.5}, {"price": decimal.Decimal("1.25")}):
        data = _with_table(encode.field_table({"wide": 2**40, **odd})[4:])
        assert _connection._content_header(data) is None
        assert _same(_read(data)[1].properties.headers, _as_pika_reads(data)[1].properties.headers)


def _with_table(table: bytes, message_id: bytes = b"m") -> bytes:
    """A header frame with the raw field ``table`` and message id (flags: headers, id)."""
    payload = (
        struct.pack(">HHQH", 60, 0, 5, (1 << 13) | (1 << 7))
        + struct.pack(">I", len(table))
        + table
        + bytes((len(message_id),))
        + message_id
    )
    return struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"


@pytest.mark.parametrize(
    "data",
    [
        _with_table(b"\x01aS\x00\x00\x00\x01x", message_id=b"\xff\xfe"),  # id not UTF-8
        _with_table(b"\x02\xff\xfeS\x00\x00\x00\x01x"),  # a key not UTF-8
        _with_table(b"\x01aU\x00\x07"),  # a type pika reads and pamqp does not know
    ],
    ids=["message id not UTF-8", "key not UTF-8", "type U"],
)
def test_what_delayqs_decoder_refuses_pika_reads_as_before(data: bytes) -> None:
    assert _connection._content_header(data) is None
    (ours, got), (theirs, expected) = _read(data), _as_pika_reads(data)
    assert ours == theirs == len(data)
    assert got.properties.message_id == expected.properties.message_id
    assert got.properties.headers == expected.properties.headers


def test_incomplete_and_malformed_frames_are_pikas_to_judge() -> None:
    whole = _header_frame(pika.BasicProperties(message_id="m", headers={"a": 1}))
    for cut in (1, 6, 7, len(whole) - 1):
        assert _read(whole[:cut]) == (0, None)  # pika waits for the rest
    bad_end = whole[:-1] + b"\x00"
    with pytest.raises(pika.exceptions.InvalidFrameError):
        _read(bad_end)
    too_long = bytearray(whole)
    struct.pack_into(">I", too_long, 19 + 2, 10_000)  # the header table's length
    assert _connection._content_header(bytes(too_long)) is None


def test_other_frames_are_read_by_pika() -> None:
    method = frame.Method(1, spec.Basic.Deliver("ctag", 7, False, "ex", "key")).marshal()
    body = frame.Body(1, b"body").marshal()
    for data in (method, body, b"AMQP\x00\x00\x09\x01"):
        assert _read(data)[0] == _as_pika_reads(data)[0]
    assert _read(method)[1].method.delivery_tag == 7


def test_a_connection_without_pikas_internals_is_left_as_it_is() -> None:
    assert read_content_headers(object()) is False
    assert read_content_headers(_Connection(object())) is False

    class Buffered:
        _frame_buffer = bytearray()

    assert read_content_headers(_Connection(Buffered())) is False


def test_pika_still_reads_frames_through_read_frame() -> None:
    """What the reader replaces is what pika's connection calls for every frame."""
    source = inspect.getsource(pika.connection.Connection._on_data_available)
    assert "self._read_frame()" in source
    assert isinstance(pika.connection.Connection.__dict__["_read_frame"], type(lambda: 0))


def test_the_reader_is_installed_only_where_it_reads_as_this_pika_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Checked once against pika itself: with this pika, it agrees; a pika that reads a
    type otherwise (1.3 gave naive datetimes) keeps its own reading."""
    _connection.reads_as_pika.cache_clear()
    assert _connection.reads_as_pika() is True
    real = pika.data.decode_value

    def naive_timestamps(encoded: bytes, offset: int) -> tuple[Any, int]:
        value, end = real(encoded, offset)
        if isinstance(value, datetime.datetime):
            value = value.replace(tzinfo=None)
        return value, end

    monkeypatch.setattr(pika.data, "decode_value", naive_timestamps)
    _connection.reads_as_pika.cache_clear()
    try:
        assert _connection.reads_as_pika() is False
        assert read_content_headers(_Connection(_Impl(b""))) is False
    finally:
        _connection.reads_as_pika.cache_clear()


_tail_keys = st.one_of(
    st.text(max_size=10).map(lambda text: "x-" + text),
    st.sampled_from(
        [
            *("x-death", "x-death", "x-first-death-reason", "x-last-death-reason"),
            *("x-request-id", "x", "x-", "delayq-attempt", "zz"),
        ]
    ),
    st.text(max_size=8),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_tail_keys, _any_values, max_size=8), st.integers(1, 3))
def test_a_table_with_an_x_tail_reads_as_pika_however_often_it_is_seen(
    table: dict[str, Any], times: int
) -> None:
    """A table's pairs from its first ``x-`` key on are read once per distinct bytes
    (RabbitMQ's dead-lettering headers): the second reading is pika's too, and what
    delayq refuses in a tail (a float, a decimal) pika reads every time."""
    data = _with_table(encode.field_table(table)[4:])
    theirs, expected = _as_pika_reads(data)
    for _ in range(times):
        ours, got = _read(data)
        assert ours == theirs == len(data)
        assert _same(got.properties.headers, expected.properties.headers)
        assert list(got.properties.headers or {}) == list(expected.properties.headers or {})


def test_a_tail_read_before_is_a_new_copy_each_time() -> None:
    died = datetime.datetime(2026, 12, 3, 7, 50, 7, tzinfo=datetime.UTC)
    death = {"count": 1, "reason": "expired", "queue": "t", "time": died, "routing-keys": ["t"]}
    headers = {"delayq-attempt": 1, "x-death": [death], "x-first-death-queue": "t"}
    data = _header_frame(pika.BasicProperties(headers=headers))
    first = _read(data)[1].properties.headers
    first["x-death"][0]["routing-keys"].append("changed")
    first["x-first-death-queue"] = "changed"
    second = _read(data)[1].properties.headers
    assert _same(second, _as_pika_reads(data)[1].properties.headers)
    assert second["x-first-death-queue"] == "t"
    assert second["x-death"][0]["routing-keys"] == ["t"]
