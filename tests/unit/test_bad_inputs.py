"""One table of bad inputs, each with the exact delayq exception it must raise.

Publish-time inputs go through ``MessageFactory(topology).build``: it validates
everything before any I/O, so these need no broker.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from delayq import (
    BodyTooLarge,
    DelayTooLong,
    HeadersTooLarge,
    InvalidBody,
    InvalidDelay,
    InvalidHeaders,
    InvalidInput,
    InvalidMessageId,
    InvalidRoutingKey,
    InvalidTopology,
    InvalidURL,
    Topology,
    load_topology,
)
from delayq.message.envelope import DEFAULT_MAX_BODY_BYTES, MAX_HEADERS, MAX_HEADERS_BYTES
from delayq.message.factory import MessageFactory
from delayq.urls import validate_url

TOPOLOGY = Topology()  # the default ladder: 30s .. 24h


def publish(
    body: object = b"ok", routing_key: object = "orders.remind", delay: object = "1m", **kwargs: Any
) -> Callable[[Path], object]:
    """A call of MessageFactory.build; every argument is valid unless overridden."""

    def call(_tmp: Path) -> object:
        return MessageFactory(TOPOLOGY).build(body, routing_key, delay, **kwargs)  # type: ignore[arg-type]

    return call


def topology_file(text: str | None) -> Callable[[Path], object]:
    """load_topology of a file with this text (``None``: the file does not exist)."""

    def call(tmp: Path) -> object:
        path = tmp / "delayq.yaml"
        if text is not None:
            path.write_text(text, encoding="utf-8")
        return load_topology(path)

    return call


def url(value: object) -> Callable[[Path], object]:
    return lambda _tmp: validate_url(value)


CASES = [
    # delays
    pytest.param(publish(delay=5), InvalidDelay, id="delay-int"),
    pytest.param(publish(delay=1.5), InvalidDelay, id="delay-float"),
    pytest.param(publish(delay=math.nan), InvalidDelay, id="delay-nan"),
    pytest.param(publish(delay=True), InvalidDelay, id="delay-bool"),
    pytest.param(publish(delay="-1s"), InvalidDelay, id="delay-negative-string"),
    pytest.param(publish(delay=""), InvalidDelay, id="delay-empty"),
    pytest.param(publish(delay="abc"), InvalidDelay, id="delay-garbage"),
    pytest.param(publish(delay="1.5s"), InvalidDelay, id="delay-fraction"),
    pytest.param(publish(delay=None), InvalidDelay, id="delay-none"),
    pytest.param(publish(delay=timedelta(-1)), InvalidDelay, id="delay-negative-timedelta"),
    pytest.param(publish(delay="25h"), DelayTooLong, id="delay-longer-than-ladder"),
    # bodies
    pytest.param(publish(body={1, 2}), InvalidBody, id="body-set"),
    pytest.param(publish(body=object()), InvalidBody, id="body-object"),
    pytest.param(publish(body={"x": math.nan}), InvalidBody, id="body-nan-in-dict"),
    pytest.param(
        publish(body=b"\0" * (DEFAULT_MAX_BODY_BYTES + 1)), BodyTooLarge, id="body-too-large"
    ),
    # routing keys
    pytest.param(publish(routing_key=""), InvalidRoutingKey, id="routing-key-empty"),
    pytest.param(publish(routing_key=None), InvalidRoutingKey, id="routing-key-none"),
    pytest.param(publish(routing_key="k" * 300), InvalidRoutingKey, id="routing-key-300-bytes"),
    pytest.param(publish(routing_key="a.*"), InvalidRoutingKey, id="routing-key-star"),
    pytest.param(publish(routing_key="a.#"), InvalidRoutingKey, id="routing-key-hash"),
    # headers
    pytest.param(publish(headers={"delayq-attempt": 2}), InvalidHeaders, id="header-delayq-prefix"),
    pytest.param(publish(headers={"x-death": []}), InvalidHeaders, id="header-x-prefix"),
    pytest.param(publish(headers={"price": 9.99}), InvalidHeaders, id="header-float-value"),
    pytest.param(publish(headers={1: "one"}), InvalidHeaders, id="header-non-str-key"),
    pytest.param(publish(headers=[("k", "v")]), InvalidHeaders, id="headers-not-a-mapping"),
    pytest.param(
        publish(headers={f"h{i}": i for i in range(MAX_HEADERS + 1)}),
        HeadersTooLarge,
        id="headers-too-many",
    ),
    pytest.param(
        publish(headers={"blob": "x" * MAX_HEADERS_BYTES}), HeadersTooLarge, id="headers-too-large"
    ),
    pytest.param(publish(headers={"": "v"}), InvalidHeaders, id="header-empty-name"),
    pytest.param(
        publish(headers={"h": {"n" * 256: 1}}), InvalidHeaders, id="header-nested-long-name"
    ),
    # message ids
    pytest.param(publish(message_id=""), InvalidMessageId, id="message-id-empty"),
    pytest.param(publish(message_id="m" * 300), InvalidMessageId, id="message-id-300-bytes"),
    pytest.param(publish(message_id=42), InvalidMessageId, id="message-id-int"),
    # topology files
    pytest.param(topology_file(None), InvalidTopology, id="topology-missing-file"),
    pytest.param(topology_file("ladder: [30s\n"), InvalidTopology, id="topology-bad-yaml"),
    pytest.param(
        topology_file("namespace: shop\ncolour: blue\n"), InvalidTopology, id="topology-unknown-key"
    ),
    pytest.param(
        topology_file("ladder: [30s, soon]\n"), InvalidTopology, id="topology-bad-ladder-entry"
    ),
    # broker URLs
    pytest.param(url("http://x"), InvalidURL, id="url-http"),
    pytest.param(url(""), InvalidURL, id="url-empty"),
    pytest.param(url("amqp://"), InvalidURL, id="url-no-host"),
    pytest.param(url("amqp://h:99999/"), InvalidURL, id="url-port-out-of-range"),
    pytest.param(url(None), InvalidURL, id="url-none"),
    pytest.param(url("amqp://h/?colour=blue"), InvalidURL, id="url-unknown-option"),
    pytest.param(url("amqp://h/?heartbeat=1&heartbeat=2"), InvalidURL, id="url-repeated-option"),
    pytest.param(url("amqp://h/?heartbeat=-1"), InvalidURL, id="url-bad-heartbeat"),
    pytest.param(url("amqp://h/?cafile=/etc/hosts"), InvalidURL, id="url-tls-option-on-amqp"),
    pytest.param(url("amqps://h/?cafile=/no/such/ca.pem"), InvalidURL, id="url-missing-cafile"),
    pytest.param(url("amqps://h/?verify=maybe"), InvalidURL, id="url-bad-verify"),
    pytest.param(url("amqps://h/?keyfile=/etc/hosts"), InvalidURL, id="url-keyfile-alone"),
]


@pytest.mark.parametrize(("call", "expected"), CASES)
def test_bad_input_raises_exactly(
    call: Callable[[Path], object], expected: type[InvalidInput], tmp_path: Path
) -> None:
    assert issubclass(expected, InvalidInput)
    with pytest.raises(InvalidInput) as info:
        call(tmp_path)
    assert type(info.value) is expected


def test_the_table_covers_every_invalid_input_class() -> None:
    expected = {case.values[1] for case in CASES}
    assert expected == {
        InvalidDelay,
        DelayTooLong,
        InvalidBody,
        BodyTooLarge,
        InvalidRoutingKey,
        InvalidHeaders,
        HeadersTooLarge,
        InvalidMessageId,
        InvalidTopology,
        InvalidURL,
    }


def test_invalid_input_is_a_value_error() -> None:
    assert issubclass(InvalidInput, ValueError)


# --- URL errors never show the password ----------------------------------------------------------

SECRET_URLS = [
    "amqp://user:s3cret@host:99999/",
    "http://user:s3cret@host/",
    "amqp://user:s3cret@/",
    "amqp://user:s3cret@host:0/",
    "ftp://user:s3cret@host:notaport/",
    "amqp://user:s3cret@[::1/",
    "amqp://user:s3cret#x@host/",
    "amqp://user:s3cret/x@host/",
    "amqp://user:s3cret?x@host/",
]


@pytest.mark.parametrize("secret_url", SECRET_URLS)
def test_url_errors_never_contain_the_password(secret_url: str) -> None:
    with pytest.raises(InvalidURL) as info:
        validate_url(secret_url)
    assert "s3cret" not in str(info.value)


def test_a_topology_given_where_the_url_goes_says_which_order_is_right() -> None:
    from delayq import Publisher, Topology
    from delayq.errors import InvalidURL
    from delayq.sync import apply_topology

    with pytest.raises(InvalidURL, match=r"not a Topology \(check the order"):
        apply_topology("amqp://localhost/", Topology())  # type: ignore[arg-type]
    with pytest.raises(InvalidURL, match="not a Topology"):
        Publisher(Topology(), "amqp://localhost/")  # type: ignore[arg-type]
    with pytest.raises(InvalidURL, match="not an int"):
        Publisher(5, Topology())  # type: ignore[arg-type]
