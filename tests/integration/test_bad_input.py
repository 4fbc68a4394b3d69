"""Bad input raises the documented delayq error through both publishers, and sends nothing."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

import delayq
from delayq import (
    BodyTooLarge,
    DelayTooLong,
    InvalidBody,
    InvalidDelay,
    InvalidHeaders,
    InvalidInput,
    InvalidMessageId,
    InvalidRoutingKey,
    Message,
)

OK = {"body": {"ok": True}, "routing_key": "job.bad", "delay": "1s"}

# (id, keyword overrides for publish, expected error)
BAD_PUBLISHES = [
    ("delay-bare-int", {"delay": 5}, InvalidDelay),
    ("delay-bare-float", {"delay": 1.5}, InvalidDelay),
    ("delay-nan", {"delay": math.nan}, InvalidDelay),
    ("delay-negative-str", {"delay": "-1s"}, InvalidDelay),
    ("delay-negative-timedelta", {"delay": timedelta(seconds=-1)}, InvalidDelay),
    ("delay-empty", {"delay": ""}, InvalidDelay),
    ("delay-garbage", {"delay": "soon"}, InvalidDelay),
    ("delay-none", {"delay": None}, InvalidDelay),
    ("delay-above-ladder", {"delay": "9s"}, DelayTooLong),
    ("body-set", {"body": {1, 2}}, InvalidBody),
    ("body-object", {"body": object()}, InvalidBody),
    ("body-nan", {"body": {"x": math.nan}}, InvalidBody),
    ("body-too-large", {"body": b"x" * (1024 * 1024 + 1)}, BodyTooLarge),
    ("rk-empty", {"routing_key": ""}, InvalidRoutingKey),
    ("rk-none", {"routing_key": None}, InvalidRoutingKey),
    ("rk-too-long", {"routing_key": "k" * 256}, InvalidRoutingKey),
    ("rk-wildcard", {"routing_key": "job.*"}, InvalidRoutingKey),
    ("header-reserved-delayq", {"headers": {"delayq-attempt": 9}}, InvalidHeaders),
    ("header-reserved-x", {"headers": {"x-death": []}}, InvalidHeaders),
    ("header-float", {"headers": {"price": 9.99}}, InvalidHeaders),
    ("header-not-mapping", {"headers": ["a", "b"]}, InvalidHeaders),
    ("header-object", {"headers": {"who": object()}}, InvalidHeaders),
    ("message-id-empty", {"message_id": ""}, InvalidMessageId),
    ("message-id-int", {"message_id": 42}, InvalidMessageId),
]


@pytest.fixture
def topo_and_inbox(driver, make_topology, collect):
    topo = make_topology(["1s", "2s"])
    driver.apply(topo)
    return topo, collect(f"{topo.namespace}.work")


def _publisher_kwargs(overrides: dict) -> tuple[tuple, dict]:
    call = {**OK, "message_id": None, "headers": None, **overrides}
    return (call["body"], call["routing_key"], call["delay"]), {
        "message_id": call["message_id"],
        "headers": call["headers"],
    }


@pytest.mark.parametrize(
    ("case", "overrides", "error"), BAD_PUBLISHES, ids=[c[0] for c in BAD_PUBLISHES]
)
def test_bad_publish_raises_and_sends_nothing(driver, topo_and_inbox, case, overrides, error):
    topo, inbox = topo_and_inbox
    assert issubclass(error, InvalidInput)
    args, kwargs = _publisher_kwargs(overrides)
    publisher_cls = delayq.Publisher if driver.kind == "sync" else delayq.AsyncPublisher
    pub = publisher_cls(driver.url, topo, max_body_bytes=1024 * 1024)
    driver._publishers[topo.namespace] = pub  # closed by the driver
    with pytest.raises(error):
        driver.publish(topo, *args, **kwargs)
    # The marker is the only message that arrives: the bad one was never sent.
    marker = driver.publish(topo, b"marker", "job.bad", "0s")
    arrivals = inbox.wait(1, timeout_s=5)
    assert [a.message_id for a in inbox.settle(1.2)] == [marker.message_id]
    assert arrivals


def test_one_bad_message_in_a_batch_sends_none_of_it(driver, topo_and_inbox):
    topo, inbox = topo_and_inbox
    batch = [Message(b"ok", "job.bad", "0s") for _ in range(50)]
    batch.insert(25, Message(b"bad", "job.bad", "forever"))
    with pytest.raises(InvalidDelay, match="message 25"):
        driver.publish_many(topo, batch)
    marker = driver.publish(topo, b"marker", "job.bad", "0s")
    inbox.wait(1, timeout_s=5)
    assert [a.message_id for a in inbox.settle(0.5)] == [marker.message_id]


@pytest.mark.parametrize(
    "url",
    ["http://localhost:5672/", "", "amqp://", "amqp://host:99999/", "amqp://u:s3cret@:5672/"],
)
def test_bad_urls_raise_invalid_url_without_the_password(driver_kind, url):
    cls = delayq.Publisher if driver_kind == "sync" else delayq.AsyncPublisher
    with pytest.raises(delayq.InvalidURL) as caught:
        cls(url)
    assert "s3cret" not in str(caught.value)


def test_an_unreachable_broker_is_a_clear_connection_error(driver_for, make_topology):
    driver = driver_for("amqp://guest:s3cret@127.0.0.1:1/")
    topo = make_topology(["1s"])
    with pytest.raises(delayq.ConnectionFailed) as caught:
        driver.publish(topo, b"x", "job.a", "1s")
    assert "127.0.0.1:1" in str(caught.value) and "s3cret" not in str(caught.value)
    with pytest.raises(delayq.ConnectionFailed) as caught:
        driver.publish_many(topo, [Message(b"x", "job.a", "1s")] * 3)
    assert "127.0.0.1:1" in str(caught.value) and "s3cret" not in str(caught.value)
