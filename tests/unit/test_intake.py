"""The intake's pure parts: ``x-delay`` read as the plugin read it, each message's fate,
and the topology checks of an intake."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq import Topology, build_declarations
from delayq.errors import InvalidTopology
from delayq.intake import FANOUT_KEY, BadDelay, Forward, Incoming, Park, Relay, read_delay

TOPO = Topology(
    namespace="shop",
    ladder=["1s", "5s", "1m"],
    destinations=[{"queue": "emails", "bindings": ["email.welcome", "email.bye"]}],
    intakes=[{"exchange": "delayed", "type": "direct"}],
)


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (5000, 5000),
        (0, 0),
        (-300, 0),
        ("1500", 1500),
        (b"1500", 1500),
        ("-20", 0),
        ("+7", 7),
        (Decimal("999.7"), 999),
        (2.9, 2),
        (2**40, 2**40),  # the plugin's 32-bit wrap is not reproduced: too long, parked
    ],
)
def test_x_delay_is_read_as_the_plugin_read_it(value: Any, ms: int) -> None:
    assert read_delay({"x-delay": value}) == ms


def test_no_x_delay_means_now() -> None:
    assert read_delay(None) == 0 and read_delay({}) == 0 and read_delay({"other": 1}) == 0


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("soon", "'soon' is not a number of milliseconds"),
        ("15s", "'15s' is not a number of milliseconds"),
        (" 15", "' 15' is not a number"),
        ("1_000", "'1_000' is not a number"),
        (True, "is a boolean"),
        ({"ms": 5}, "of type dict"),
        ([5], "of type list"),
        (float("nan"), "not a finite number"),
        (b"\xff\xfe", "is not UTF-8 text"),
    ],
)
def test_an_x_delay_the_plugin_could_not_read_is_a_bad_delay(value: Any, said: str) -> None:
    got = read_delay({"x-delay": value})
    assert isinstance(got, BadDelay) and said in got.reason


def _incoming(headers: dict[str, Any], key: str = "email.welcome", **props: Any) -> Incoming:
    return Incoming(key, b'{"n": 1}', {"headers": headers, **props})


def test_a_message_is_forwarded_to_its_tier_with_its_properties() -> None:
    relay = Relay(TOPO, TOPO.intakes[0], clock_ms=lambda: 1_000_000)
    plan = relay.plan(
        _incoming(
            {"x-delay": 3000, "tenant": "acme", "delayq-attempt": 9},
            message_id="m-1",
            content_type="application/json",
            correlation_id="c-1",
            expiration="100",
            user_id="bob",
            timestamp=123,
        )
    )
    assert isinstance(plan, Forward)
    msg = plan.message
    assert (msg.exchange, msg.routing_key) == ("shop.tier.5s", "email.welcome")
    assert msg.message_id == "m-1"
    assert msg.headers["tenant"] == "acme" and msg.headers["x-delay"] == -3000
    assert msg.headers["delayq-attempt"] == 1  # delayq's envelope written anew
    assert msg.properties == {"content_type": "application/json", "correlation_id": "c-1",
                              "timestamp": 123}  # fmt: skip
    assert msg.receipt.delay_ms == 3000 and msg.receipt.tier == "5s"


def test_a_message_without_an_id_gets_one_from_its_content() -> None:
    relay = Relay(TOPO, TOPO.intakes[0])
    one = relay.plan(_incoming({"x-delay": 10}))
    again = relay.plan(_incoming({"x-delay": 10}))
    other = relay.plan(_incoming({"x-delay": 11}))
    assert isinstance(one, Forward) and isinstance(again, Forward) and isinstance(other, Forward)
    assert one.message.message_id == again.message.message_id != other.message.message_id
    assert one.message.message_id.startswith("intake-")


@pytest.mark.parametrize(
    ("headers", "key", "reason", "said"),
    [
        ({"x-delay": "soon"}, "email.welcome", "bad-x-delay", "is not a number"),
        ({"x-delay": 3_600_000}, "email.welcome", "unschedulable", "1m"),
        ({"x-delay": 10}, "email.unknown", "unschedulable", "email.unknown"),
    ],
)
def test_what_cannot_be_scheduled_is_parked_as_it_came_with_the_reason(
    headers: dict[str, Any], key: str, reason: str, said: str
) -> None:
    relay = Relay(TOPO, TOPO.intakes[0], clock_ms=lambda: 5_000)
    plan = relay.plan(_incoming({**headers, "tenant": "acme"}, key, message_id="m-9"))
    assert isinstance(plan, Park)
    msg = plan.message
    assert (msg.exchange, msg.routing_key) == ("shop.direct", "shop.intake.delayed.dlq")
    assert msg.headers["delayq-dead-letter-reason"] == reason
    assert said in msg.headers["delayq-error-message"] and plan.reason.startswith(reason)
    assert msg.headers["tenant"] == "acme" and msg.headers["delayq-queue"] == "shop.intake.delayed"
    assert msg.body == b'{"n": 1}' and msg.message_id == "m-9"


FANOUT = Topology(
    namespace="shop",
    ladder=["1s", "5s", "1m"],
    exact={"unit": "250ms", "levels": 5},
    destinations=[{"queue": "audit", "bindings": ["#"]}, {"queue": "mail", "bindings": ["#"]}],
    intakes=[{"exchange": "events", "type": "fanout"},
             {"exchange": "events.exact", "type": "fanout", "strategy": "exact"}],
)  # fmt: skip


def test_a_fanout_intake_schedules_the_empty_key_under_the_fanout_key() -> None:
    """Fanout publishers leave the key empty: scheduled under ``fanout`` (which every
    destination's ``#`` matches), in the tiers and in the cascade; a key given is kept."""
    tiered = Relay(FANOUT, FANOUT.intakes[0])
    plan = tiered.plan(_incoming({"x-delay": 3000}, "", message_id="f-1"))
    assert isinstance(plan, Forward)
    assert (plan.message.exchange, plan.message.routing_key) == ("shop.tier.5s", FANOUT_KEY)
    assert plan.message.headers["delayq-routing-key"] == FANOUT_KEY == "fanout"
    assert plan.message.receipt.routing_key == FANOUT_KEY
    now = tiered.plan(_incoming({}, "", message_id="f-2"))
    assert isinstance(now, Forward)
    assert (now.message.exchange, now.message.routing_key) == ("shop.ready", FANOUT_KEY)
    kept = tiered.plan(_incoming({"x-delay": 3000}, "order.created", message_id="f-3"))
    assert isinstance(kept, Forward) and kept.message.routing_key == "order.created"

    exact = Relay(FANOUT, FANOUT.intakes[1]).plan(_incoming({"x-delay": 2500}, ""))
    assert isinstance(exact, Forward)
    msg = exact.message  # 10 units of 250 ms on 5 levels, then the key:
    assert (msg.exchange, msg.routing_key) == ("shop.level.3", "0.1.0.1.0.r.fanout")
    assert msg.headers["delayq-routing-key"] == FANOUT_KEY


def test_a_fanout_message_parked_with_the_empty_key_is_replayed_under_the_fanout_key() -> None:
    plan = Relay(FANOUT, FANOUT.intakes[0]).plan(_incoming({"x-delay": "15s"}, ""))
    assert isinstance(plan, Park) and plan.reason.startswith("bad-x-delay")
    assert plan.message.headers["delayq-routing-key"] == FANOUT_KEY


@pytest.mark.parametrize("kind", ["direct", "topic"])
def test_a_direct_or_topic_intake_parks_the_empty_key_saying_why(kind: str) -> None:
    """The plugin routed the empty key as any other: a direct exchange to no binding
    delayq can declare, a topic one to ``#`` bindings only. Parked, never dropped."""
    topology = Topology(
        namespace="shop",
        destinations=[{"queue": "q", "bindings": ["#" if kind == "topic" else "a.b"]}],
        intakes=[{"exchange": "d", "type": kind}],
    )
    plan = Relay(topology, topology.intakes[0]).plan(_incoming({"x-delay": 10}, ""))
    assert isinstance(plan, Park)
    said = plan.message.headers["delayq-error-message"]
    assert plan.reason.startswith("unschedulable: routing key is empty")
    assert f"a {kind} intake routes by the key" in said and "type: fanout" in said
    assert plan.message.headers["delayq-error-type"] == "delayq.errors.InvalidRoutingKey"
    assert plan.message.headers["delayq-routing-key"] == ""


def test_a_topic_intake_schedules_by_pattern_and_parks_a_key_nothing_binds() -> None:
    topology = Topology(
        namespace="shop",
        destinations=[{"queue": "a", "bindings": ["order.*"]},
                      {"queue": "b", "bindings": ["*.created"]}],
        intakes=[{"exchange": "d", "type": "topic"}],
    )  # fmt: skip
    relay = Relay(topology, topology.intakes[0])
    for key in ("order.created", "order.paid", "invoice.created"):
        plan = relay.plan(_incoming({"x-delay": 10}, key))
        assert isinstance(plan, Forward) and plan.message.routing_key == key
    plan = relay.plan(_incoming({"x-delay": 10}, "invoice.paid"))
    assert isinstance(plan, Park) and "'invoice.paid' matches no binding" in plan.reason


def test_an_intake_declares_its_exchange_queue_and_dlq_outside_the_apply_marker() -> None:
    names = [d.name for d in build_declarations(TOPO)]
    assert "delayed" in names and "shop.intake.delayed" in names
    assert "shop.intake.delayed.dlq" in names
    plain = TOPO.model_copy(update={"intakes": ()})
    assert build_declarations(TOPO)[-1].name == build_declarations(plain)[-1].name


@pytest.mark.parametrize(
    ("intakes", "bindings", "said"),
    [
        ([{"exchange": "d", "type": "headers"}], ["a"], "'q' binds routing keys in a namespace"),
        ([{"exchange": "d", "type": "x-delayed-message"}], ["a"], "one of direct, topic"),
        ([{"exchange": "d"}], ["a.*"], "binding key 'a.*' is a pattern"),
        ([{"exchange": "d", "type": "fanout"}], ["a"], "does not bind '#'"),
        ([{"exchange": "shop.tier.1h"}], ["a"], "shop.tier.*: its tiers"),
        ([{"exchange": "amq.direct"}], ["a"], "reserves"),
        ([{"exchange": "d"}, {"exchange": "d"}], ["a"], "listed twice"),
        ([{"exchange": "d" * 240}], ["a"], "RabbitMQ takes names of up to 255"),
        ([{"exchange": "d", "delivery_limit": 0}], ["a"], "delivery_limit"),
    ],
)
def test_an_intake_that_cannot_route_as_the_plugin_did_is_refused(
    intakes: list[dict[str, Any]], bindings: list[str], said: str
) -> None:
    with pytest.raises(InvalidTopology, match=re.escape(said)):
        Topology(
            namespace="shop",
            destinations=[{"queue": "q", "bindings": bindings}],
            intakes=intakes,
        )


RESERVED = [
    "shop", "shop.ready", "shop.unrouted", "shop.headers", "shop.direct", "shop.delivery",
    "shop.tier.30s", "shop.retry.30s.direct", "shop.level.0", "shop.intake.x",
    "shop.applied.0123456789ab", "shop.verify.01234567",
]  # fmt: skip


@pytest.mark.parametrize("name", RESERVED)
def test_an_intake_named_as_an_entity_delayq_declares_is_refused_naming_it(name: str) -> None:
    said = f"intake exchange '{name}' is a name delayq declares in namespace 'shop'"
    with pytest.raises(InvalidTopology, match=re.escape(said)):
        Topology(namespace="shop", destinations=[{"queue": "q", "bindings": ["a"]}],
                 intakes=[{"exchange": name}])  # fmt: skip


@pytest.mark.parametrize(
    "name", ["shop.delayed", "shop.delayed.intake", "shop.readyish", "shop.tier", "shopx.ready"]
)
def test_an_intake_under_the_namespace_but_no_name_of_delayqs_is_taken(name: str) -> None:
    """The plugin guide's own example: namespace ``orders``, intake
    ``orders.delayed.intake``, was refused for starting with the namespace."""
    topology = Topology(namespace="shop", destinations=[{"queue": "q", "bindings": ["a"]}],
                        intakes=[{"exchange": name}])  # fmt: skip
    assert topology.intakes[0].exchange == name


def test_topic_and_fanout_intakes_route_by_their_bindings() -> None:
    Topology(namespace="shop", destinations=[{"queue": "q", "bindings": ["a.*"]}],
             intakes=[{"exchange": "d", "type": "topic"}])  # fmt: skip
    Topology(namespace="shop", destinations=[{"queue": "q", "bindings": ["#"]}],
             intakes=[{"exchange": "d", "type": "fanout"}])  # fmt: skip


def test_an_existing_destination_is_only_bound_and_no_delayq_consumer_takes_it() -> None:
    from delayq.errors import InvalidInput
    from delayq.sync import Consumer
    from delayq.topology.declarations import BindingDecl, QueueDecl

    topology = Topology(
        namespace="shop",
        destinations=[{"queue": "theirs", "bindings": ["a.b"], "existing": True},
                      {"queue": "ours", "bindings": ["c.d"]}],
    )  # fmt: skip
    decls = build_declarations(topology)
    queues = {d.name for d in decls if isinstance(d, QueueDecl)}
    assert "ours" in queues and "ours.dlq" in queues
    assert "theirs" not in queues and "theirs.dlq" not in queues
    bound = [(d.source, d.routing_key) for d in decls
             if isinstance(d, BindingDecl) and d.destination == "theirs"]  # fmt: skip
    assert bound == [("shop.ready", "a.b")]  # no direct or retry binding: delayq sends none
    with pytest.raises(InvalidInput, match="existing queue the topology only binds"):
        Consumer("amqp://guest:guest@127.0.0.1:1/", topology, "theirs", lambda body: None)


def test_the_id_of_a_message_without_one_is_the_same_when_the_broker_delivers_it_again() -> None:
    """A redelivery (``x-delivery-count``), a dead-lettering (``x-death`` and the rest) and a
    replay (delayq's envelope headers) add headers; the derived id leaves them out."""
    relay = Relay(TOPO, TOPO.intakes[0])
    first = relay.plan(_incoming({"x-delay": 10, "tenant": "acme"}))
    again = relay.plan(
        _incoming(
            {
                "x-delay": 10,
                "tenant": "acme",
                "x-delivery-count": 3,
                "x-acquired-count": 5,  # RabbitMQ 4.3 counts every return, nacks included
                "x-death": [{"count": 1, "reason": "delivery_limit", "queue": "q"}],
                "x-first-death-reason": "delivery_limit",
                "x-last-death-queue": "q",
                "delayq-replayed-at": 1_700_000_000_000,
            }
        )
    )
    own = relay.plan(_incoming({"x-delay": 10, "tenant": "acme", "x-request-id": "r-1"}))
    assert isinstance(first, Forward) and isinstance(again, Forward) and isinstance(own, Forward)
    assert first.message.message_id == again.message.message_id
    assert own.message.message_id != first.message.message_id  # a publisher's own x- header


@pytest.mark.parametrize(
    "value",
    [2**63 - 1, 86_400_000_000_000_000, "99999999999999999999", Decimal("1E+30"), 10**40,
     "9" * 5000],
)
def test_a_delay_past_anything_a_duration_holds_is_parked_as_unschedulable(value: Any) -> None:
    plan = Relay(TOPO, TOPO.intakes[0]).plan(_incoming({"x-delay": value}))
    assert isinstance(plan, Park), plan
    assert plan.reason.startswith("unschedulable: ")
    assert "longer than" in plan.reason


_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.decimals(allow_nan=True)
    | st.text()
    | st.binary()
    | st.datetimes(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@given(
    delay=_VALUES,
    other=_VALUES,
    key=st.text(max_size=20),
    message_id=st.none() | st.text(max_size=300),
    timestamp=st.none() | st.integers(),
)
def test_the_relay_plans_every_header_value_and_never_raises(
    delay: Any, other: Any, key: str, message_id: Any, timestamp: Any
) -> None:
    relay = Relay(TOPO, TOPO.intakes[0])
    properties = {
        "headers": {"x-delay": delay, "other": other, b"\xff": 1},
        "message_id": message_id,
        "timestamp": timestamp,
    }
    plan = relay.plan(Incoming(key, b"body", properties))
    assert isinstance(plan, (Forward, Park))
    if isinstance(plan, Park):
        assert plan.message.routing_key == relay.dlq and plan.message.body == b"body"


def test_two_messages_that_differ_only_in_a_property_get_two_ids() -> None:
    """A correlation id (two RPC requests with the same body), a priority, a content type:
    what the publisher set is part of the derived id."""
    relay = Relay(TOPO, TOPO.intakes[0])
    ids = {
        plan.message.message_id
        for props in (
            {"correlation_id": "a"}, {"correlation_id": "b"}, {"priority": 5},
            {"content_type": "text/plain"}, {"app_id": "x"}, {"timestamp": 1},
        )
        if isinstance(plan := relay.plan(_incoming({"x-delay": 10}, **props)), Forward)
    }
    assert len(ids) == 6


def test_a_string_of_thousands_of_digits_is_read_without_pythons_digit_limit() -> None:
    assert read_delay({"x-delay": "0" * 5000 + "5"}) == 5
    assert read_delay({"x-delay": "-" + "9" * 5000}) == 0
    assert read_delay({"x-delay": "9" * 5000}) > 86_400_000_000_000_000


@pytest.mark.parametrize("prefetch", [0, 70_000, True, "10"])
def test_a_bridge_refuses_a_prefetch_amqp_cannot_carry_before_it_connects(prefetch: Any) -> None:
    from delayq.errors import InvalidInput
    from delayq.sync.bridge import Bridge

    with pytest.raises(InvalidInput, match="prefetch"):
        Bridge("amqp://guest:guest@127.0.0.1:1/", TOPO, prefetch=prefetch)


def test_a_forward_does_not_carry_the_intakes_delivery_counts() -> None:
    """A forward is a new message: the intake's ``x-delivery-count`` (a bridge that crashed
    before) must not read, at the destination, as deliveries of its own."""
    relay = Relay(TOPO, TOPO.intakes[0])
    forward = relay.plan(
        _incoming({"x-delay": 10, "x-delivery-count": 2, "x-acquired-count": 4, "t": "a"})
    )
    assert isinstance(forward, Forward)
    assert "x-delivery-count" not in forward.message.headers
    assert "x-acquired-count" not in forward.message.headers
    assert forward.message.headers["t"] == "a"


NOW = 1_700_000_000_000


@pytest.mark.parametrize(
    ("headers", "tier", "delay_ms"),
    [
        ({"x-opt-delivery-delay": 3000}, "5s", 3000),
        ({"x-opt-delivery-delay": b"40000"}, "1m", 40000),
        ({"x-opt-delivery-time": NOW + 800}, "1s", 800),
        ({"x-opt-delivery-time": str(NOW + 4000)}, "5s", 4000),
        # an AMQP timestamp: whole seconds
        ({"x-opt-delivery-time": datetime.fromtimestamp(NOW / 1000 + 30, UTC)}, "1m", 30000),
        # x-delay is read first, as the plugin's publishers send it
        ({"x-delay": 500, "x-opt-delivery-delay": 50000}, "1s", 500),
    ],
)
def test_rabbitmq_4_4_delivery_annotations_schedule_like_x_delay(
    headers: dict[str, Any], tier: str, delay_ms: int
) -> None:
    """A publisher written for RabbitMQ 4.4's delayed messages publishes to an intake
    unchanged; the forward carries no annotation a broker could delay it by again."""
    relay = Relay(TOPO, TOPO.intakes[0], clock_ms=lambda: NOW)
    plan = relay.plan(_incoming({**headers, "tenant": "acme"}))
    assert isinstance(plan, Forward), plan
    assert plan.message.exchange == f"shop.tier.{tier}"
    assert plan.message.receipt.delay_ms == delay_ms
    assert not {"x-opt-delivery-delay", "x-opt-delivery-time"} & set(plan.message.headers)
    assert plan.message.headers["tenant"] == "acme"


def test_a_delivery_time_past_is_now_and_an_unreadable_one_is_parked_by_its_name() -> None:
    relay = Relay(TOPO, TOPO.intakes[0], clock_ms=lambda: NOW)
    past = relay.plan(_incoming({"x-opt-delivery-time": NOW - 60_000}))
    assert isinstance(past, Forward) and past.message.receipt.delay_ms == 0
    bad = relay.plan(_incoming({"x-opt-delivery-time": "tomorrow"}))
    assert isinstance(bad, Park) and bad.reason.startswith("bad-x-delay: x-opt-delivery-time")
    far = relay.plan(_incoming({"x-opt-delivery-delay": 10**20}))
    assert isinstance(far, Park) and "x-opt-delivery-delay 100000000000000000000 ms" in str(
        far.message.headers
    )
