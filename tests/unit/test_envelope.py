"""MessageFactory: the message on the wire, built before any I/O."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from delayq.errors import (
    BodyTooLarge,
    DelayTooLong,
    InvalidBody,
    InvalidDelay,
    InvalidHeaders,
    InvalidInput,
    InvalidMessageId,
    InvalidRoutingKey,
)
from delayq.message.envelope import (
    CONTENT_BYTES,
    CONTENT_JSON,
    CONTENT_TEXT,
    ENVELOPE_VERSION,
    Message,
    Receipt,
    encode_body,
    new_message_id,
)
from delayq.message.factory import MessageFactory
from delayq.topology.model import Topology

NOW_MS = 1_700_000_000_123
# The default ladder, 30s .. 24h; every key is bound (the routing check: test_routing.py).
TOPOLOGY = Topology(namespace="shop", external_bindings=["#"])
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def factory(**kwargs: Any) -> MessageFactory:
    return MessageFactory(TOPOLOGY, clock_ms=lambda: NOW_MS, new_id=lambda: "id-1", **kwargs)


def build(
    body: object = b"x", routing_key: str = "orders.remind", delay: object = "15m", **kwargs: Any
) -> Any:
    return factory().build(body, routing_key, delay, **kwargs)


# --- exchange and routing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "exchange"),
    [
        ("15m", "shop.tier.30m"),
        ("30s", "shop.tier.30s"),
        ("1ms", "shop.tier.30s"),
        (timedelta(hours=2), "shop.tier.3h"),
        ("24h", "shop.tier.24h"),
        ("0s", "shop.ready"),
        (timedelta(0), "shop.ready"),
    ],
)
def test_exchange_is_the_tier_exchange_or_ready(delay: object, exchange: str) -> None:
    out = build(delay=delay)
    assert out.exchange == exchange
    assert out.receipt.exchange == exchange


def test_routing_key_is_kept() -> None:
    out = build(routing_key="orders.remind")
    assert out.routing_key == "orders.remind"
    assert out.receipt.routing_key == "orders.remind"


def test_delay_longer_than_the_ladder() -> None:
    with pytest.raises(DelayTooLong):
        build(delay="25h")


# --- ids and clock -------------------------------------------------------------------------------


def test_message_id_comes_from_new_id() -> None:
    out = build()
    assert out.message_id == "id-1"
    assert out.receipt.message_id == "id-1"


def test_explicit_message_id_wins() -> None:
    assert build(message_id="order-42").message_id == "order-42"


def test_default_message_ids_are_unique_hex() -> None:
    f = MessageFactory(TOPOLOGY)
    ids = {f.build(b"", "k", "0s").message_id for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_default_message_ids_are_random_uuids_as_uuid4_writes_them() -> None:
    # The ids were uuid.uuid4().hex; consumers and other languages may parse them as UUIDs.
    ids = [new_message_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert parsed.hex == text  # lower case, 32 digits, leading zeros kept
    # Every other bit is random: each of the 122 is seen both set and clear.
    ones = 0
    zeros = 0
    for text in ids:
        value = int(text, 16)
        ones |= value
        zeros |= ~value
    fixed = (0xF000 << 64) | (0xC000 << 48)
    assert ones | fixed == (1 << 128) - 1 and (zeros & ((1 << 128) - 1)) | fixed == (1 << 128) - 1


def test_timestamp_is_whole_seconds_of_the_clock() -> None:
    assert build().timestamp_s == NOW_MS // 1000


# --- receipt -------------------------------------------------------------------------------------


def test_receipt_for_a_delayed_message() -> None:
    receipt = build(delay="15m").receipt
    assert receipt.tier == "30m"
    assert receipt.delay_ms == 900_000
    assert receipt.tier_ms == 1_800_000
    assert receipt.published_at_ms == NOW_MS
    assert receipt.delay == timedelta(minutes=15)
    assert receipt.lateness == timedelta(minutes=15)


def test_receipt_times() -> None:
    receipt = build(delay="15m").receipt
    assert receipt.published_at == EPOCH + timedelta(milliseconds=NOW_MS)
    assert receipt.due_at == receipt.published_at + timedelta(minutes=30)
    assert receipt.published_at.tzinfo is not None


def test_receipt_for_an_immediate_message() -> None:
    receipt = build(delay="0s").receipt
    assert receipt.tier is None
    assert receipt.delay_ms == 0
    assert receipt.tier_ms == 0
    assert receipt.lateness == timedelta(0)
    assert receipt.due_at == receipt.published_at


@given(st.integers(min_value=0, max_value=86_400_000))
def test_lateness_is_tier_minus_delay(delay_ms: int) -> None:
    receipt = build(delay=timedelta(milliseconds=delay_ms)).receipt
    assert receipt.lateness == timedelta(milliseconds=receipt.tier_ms - delay_ms)
    assert receipt.lateness >= timedelta(0)


@given(st.integers(min_value=0, max_value=4_102_444_800_000))
def test_due_at_is_published_at_plus_tier(now_ms: int) -> None:
    receipt = Receipt("m", "k", "e", "1m", 45_000, 60_000, now_ms)
    assert receipt.published_at == EPOCH + timedelta(milliseconds=now_ms)
    assert receipt.due_at == EPOCH + timedelta(milliseconds=now_ms + 60_000)


# --- headers -------------------------------------------------------------------------------------


def test_delayq_headers() -> None:
    headers = build(delay="15m").headers
    assert {k: v for k, v in headers.items() if k.startswith("delayq-")} == {
        "delayq-version": ENVELOPE_VERSION,
        "delayq-delay-ms": 900_000,
        "delayq-tier": "30m",
        "delayq-tier-ms": 1_800_000,
        "delayq-published-at": NOW_MS,
        "delayq-due-at": NOW_MS + 1_800_000,
        "delayq-attempt": 1,
        "delayq-routing-key": "orders.remind",
    }


def test_numeric_delayq_headers_are_ints() -> None:
    headers = build().headers
    for key in (
        "delayq-version",
        "delayq-delay-ms",
        "delayq-tier-ms",
        "delayq-published-at",
        "delayq-due-at",
        "delayq-attempt",
    ):
        assert type(headers[key]) is int, key


def test_immediate_message_tier_header() -> None:
    headers = build(delay="0s").headers
    assert headers["delayq-tier"] == "immediate"
    assert headers["delayq-due-at"] == NOW_MS


def test_attempt_header_follows_the_argument() -> None:
    assert build(attempt=3).headers["delayq-attempt"] == 3


def test_user_headers_are_kept() -> None:
    user = {
        "tenant": "acme",
        "count": 3,
        "flag": True,
        "none": None,
        "raw": b"\x00",
        "nested": {"a": [1, "b"]},
    }
    headers = build(headers=user).headers
    assert {k: headers[k] for k in user} == user


def test_user_headers_mapping_is_not_mutated() -> None:
    user = {"tenant": "acme"}
    build(headers=user)
    assert user == {"tenant": "acme"}


# --- body encoding -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "data", "content_type"),
    [
        (b"\x00\xff", b"\x00\xff", CONTENT_BYTES),
        (bytearray(b"ab"), b"ab", CONTENT_BYTES),
        (memoryview(b"ab"), b"ab", CONTENT_BYTES),
        ("h\u00e9llo", "h\u00e9llo".encode(), CONTENT_TEXT),
        ({"order": 42}, b'{"order":42}', CONTENT_JSON),
        ([1, "a"], b'[1,"a"]', CONTENT_JSON),
        (7, b"7", CONTENT_JSON),
        (None, b"null", CONTENT_JSON),
        (True, b"true", CONTENT_JSON),
        ({"caf\u00e9": "\u2603"}, '{"caf\u00e9":"\u2603"}'.encode(), CONTENT_JSON),
    ],
    ids=["bytes", "bytearray", "memoryview", "str", "dict", "list", "int", "none", "bool", "utf8"],
)
def test_body_encoding(body: object, data: bytes, content_type: str) -> None:
    out = build(body=body)
    assert out.body == data
    assert type(out.body) is bytes
    assert out.content_type == content_type


def test_text_content_type_names_utf8() -> None:
    assert CONTENT_TEXT == "text/plain; charset=utf-8"


class Order(BaseModel):
    order_id: int
    note: str


def test_pydantic_model_body_is_json() -> None:
    out = build(body=Order(order_id=42, note="hi"))
    assert out.content_type == CONTENT_JSON
    assert json.loads(out.body) == {"order_id": 42, "note": "hi"}


class Opaque(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    thing: object


class Reading(BaseModel):
    value: float


def test_pydantic_model_that_cannot_be_serialized_is_invalid_body() -> None:
    with pytest.raises(InvalidBody):
        build(body=Opaque(thing=object()))


def test_pydantic_model_with_nan_is_invalid_body_like_a_dict_with_nan() -> None:
    # A dict with NaN is refused; the same value in a model must not turn into null.
    with pytest.raises(InvalidBody):
        build(body=Reading(value=float("nan")))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), json_values, max_size=6))
def test_json_dict_body_round_trips(body: dict[str, Any]) -> None:
    out = build(body=body)
    assert out.content_type == CONTENT_JSON
    assert json.loads(out.body) == body


@pytest.mark.parametrize(
    "body",
    [{1, 2}, object(), {"x": float("nan")}, [float("inf")], {(1, 2): "tuple key"}],
    ids=["set", "object", "nan", "inf", "tuple-key"],
)
def test_unencodable_bodies(body: object) -> None:
    with pytest.raises(InvalidBody):
        build(body=body)


def test_circular_body_is_invalid_body() -> None:
    body: list[Any] = []
    body.append(body)
    with pytest.raises(InvalidBody):
        encode_body(body)


def test_too_deeply_nested_body_is_invalid_body() -> None:
    body: list[Any] = []
    for _ in range(100_000):
        body = [body]
    with pytest.raises(InvalidBody):
        encode_body(body)


def test_str_body_that_is_not_encodable_as_utf8_is_invalid_body() -> None:
    with pytest.raises(InvalidBody):
        build(body="lone surrogate \ud800")


def test_json_body_with_a_lone_surrogate_is_invalid_body() -> None:
    with pytest.raises(InvalidBody):
        build(body={"name": "\udcff"})


def test_body_at_the_limit_is_accepted() -> None:
    assert len(factory(max_body_bytes=10).build(b"x" * 10, "k", "1s").body) == 10


def test_body_over_the_limit_is_too_large() -> None:
    with pytest.raises(BodyTooLarge, match="11 bytes"):
        factory(max_body_bytes=10).build(b"x" * 11, "k", "1s")


def test_body_limit_counts_encoded_bytes() -> None:
    with pytest.raises(BodyTooLarge):
        factory(max_body_bytes=10).build("\u00e9" * 6, "k", "1s")  # 12 bytes in UTF-8


# --- validation happens before anything else -----------------------------------------------------


def test_clock_and_id_are_not_used_when_input_is_bad() -> None:
    calls: list[str] = []

    def clock() -> int:
        calls.append("clock")
        return NOW_MS

    f = MessageFactory(TOPOLOGY, clock_ms=clock, new_id=lambda: "id")
    with pytest.raises(InvalidBody):
        f.build(object(), "k", "1s")
    assert calls == []


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"routing_key": "lone \ud800"}, InvalidRoutingKey),
        ({"message_id": "lone \ud800"}, InvalidMessageId),
        ({"headers": {"lone \ud800": 1}}, InvalidHeaders),
        ({"headers": {"k": "lone \ud800"}}, InvalidHeaders),
    ],
    ids=["routing-key", "message-id", "header-name", "header-value"],
)
def test_strings_not_encodable_as_utf8_are_rejected(
    kwargs: dict[str, Any], error: type[InvalidInput]
) -> None:
    with pytest.raises(error):
        build(**kwargs)


# --- build_many ----------------------------------------------------------------------------------


def test_build_many_builds_in_order() -> None:
    out = factory().build_many(
        [Message(b"a", "k.a", "1s"), Message("b", "k.b", "0s", message_id="m-b", headers={"h": 1})]
    )
    assert [o.routing_key for o in out] == ["k.a", "k.b"]
    assert [o.exchange for o in out] == ["shop.tier.30s", "shop.ready"]
    assert out[1].message_id == "m-b"
    assert out[1].headers["h"] == 1


def test_build_many_of_nothing() -> None:
    assert factory().build_many([]) == []


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (Message(b"x", "k", 5), InvalidDelay),
        (Message(b"x", "k", "25h"), DelayTooLong),
        (Message(object(), "k", "1s"), InvalidBody),
        (Message(b"x", "", "1s"), InvalidRoutingKey),
        (Message(b"x", "k", "1s", message_id=""), InvalidMessageId),
        (Message(b"x", "k", "1s", headers={"x-death": 1}), InvalidHeaders),
    ],
    ids=["delay", "too-long", "body", "routing-key", "message-id", "headers"],
)
def test_build_many_names_the_index_of_the_bad_message(
    bad: Message, error: type[InvalidInput]
) -> None:
    good = Message(b"ok", "k", "1s")
    with pytest.raises(error, match=r"^message 2: ") as info:
        factory().build_many([good, good, bad, good])
    assert type(info.value) is error


def test_build_many_rejects_items_that_are_not_messages() -> None:
    with pytest.raises(InvalidBody, match="item 1"):
        factory().build_many([Message(b"a", "k", "1s"), (b"b", "k", "1s")])  # type: ignore[list-item]


def test_build_many_keeps_the_original_error_as_cause() -> None:
    with pytest.raises(InvalidDelay) as info:
        factory().build_many([Message(b"a", "k", "abc")])
    assert isinstance(info.value.__cause__, InvalidDelay)


@pytest.mark.parametrize(
    ("body", "where", "key"),
    [
        ({1: "a"}, "body", "1 (int)"),
        ({"a": [{"b": {2.5: 0}}]}, "body['a'][0]['b']", "2.5 (float)"),
        ({True: 1}, "body", "True (bool)"),
        ({None: 1}, "body", "None (NoneType)"),
        ([{"ok": 1}, ({(1, 2): 3},)], "body[1][0]", "(1, 2) (tuple)"),
    ],
)
def test_dict_keys_that_json_would_turn_into_strings_are_refused(
    body: Any, where: str, key: str
) -> None:
    """JSON has only str keys: ``{1: "a"}`` would arrive as ``{"1": "a"}`` (issue 48)."""
    with pytest.raises(InvalidBody, match="dict keys must be str") as caught:
        encode_body(body)
    assert f"{where} has the key {key}" in str(caught.value)
    with pytest.raises(InvalidBody, match="dict keys must be str"):
        build(body=body)


def test_str_keys_at_any_depth_and_models_with_int_keys_are_fine() -> None:
    class Counts(BaseModel):
        by_day: dict[int, int]

    body = {"a": [{"b": {"c": 1}}, ({"d": None},)]}
    assert json.loads(encode_body(body)[0]) == {"a": [{"b": {"c": 1}}, [{"d": None}]]}
    # A model's own schema turns the keys back into ints when the consumer validates it.
    data, _ = encode_body(Counts(by_day={1: 2}))
    assert Counts.model_validate_json(data).by_day == {1: 2}


def test_the_factorys_messages_equal_those_their_dataclasses_build() -> None:
    """``MessageFactory.build`` sets the frozen dataclasses' slots straight (cheaper than
    their ``__init__``): every field is set, in the order the dataclasses declare, and a
    field added later fails here, not as a missing attribute on some publish."""
    import dataclasses

    from delayq import Topology
    from delayq.message.envelope import OutgoingMessage, Receipt
    from delayq.message.factory import MessageFactory

    for cls in (Receipt, OutgoingMessage):
        assert cls.__slots__ == tuple(f.name for f in dataclasses.fields(cls))
    topology = Topology(namespace="shop", ladder=["1m"], external_bindings=("orders.#",))
    built = MessageFactory(topology).build({"a": 1}, "orders.x", "30s", headers={"t": "x"})
    receipt = built.receipt
    assert receipt == Receipt(
        **{f.name: getattr(receipt, f.name) for f in dataclasses.fields(Receipt)}
    )
    fields = {f.name: getattr(built, f.name) for f in dataclasses.fields(OutgoingMessage)}
    assert built == OutgoingMessage(**fields)
    assert (built.properties, receipt.tier, built.headers["t"]) == ({}, "1m", "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.body = b""  # type: ignore[misc]


@pytest.mark.parametrize(
    "body",
    [
        {"order": 1},
        [1, "é", None, True, 2.5],
        {"a": {"b": [{}, []]}, "z": '\u2028\n"x"'},
        7,
        -0.0,
        {"big": 10**30},
        [],
        {},
    ],
)
def test_a_json_body_is_what_json_dumps_makes_of_it(body: Any) -> None:
    """Bodies are encoded by one C encoder built once (not one a call): the same bytes."""
    expected = json.dumps(body, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    assert encode_body(body) == (expected.encode(), "application/json")


def test_a_body_that_holds_itself_is_said_to() -> None:
    body: dict[str, Any] = {}
    body["me"] = body
    with pytest.raises(InvalidBody, match=r"nested too deeply .* or holds itself"):
        encode_body(body)
    with pytest.raises(InvalidBody, match=r"cannot be encoded .*float"):
        encode_body([float("nan")])
    with pytest.raises(InvalidBody, match="Object of type set is not JSON serializable"):
        encode_body({"s": {1}})
