"""No single message stops the bridge: every header type and value a publisher can put
on the wire, in ``x-delay`` and in a header of its own, sent between good messages.

Each poison message ends in the intake's DLQ (parked with a reason, or, when pika cannot
read or write its headers, rejected there by the broker as it came); every good message
reaches its queue once and never early; the bridge never stops or reconnects. The values
are written as raw AMQP field-table bytes, so the test reaches what pika itself refuses
to send (a NaN from Java, a timestamp past 9999, a key that is not UTF-8).
"""

from __future__ import annotations

import struct
import time
from collections import Counter
from typing import Any

import pika
import pytest

from delayq.sync import apply_topology
from delayq.sync._unreadable import tolerate_unreadable_headers, unreadable
from delayq.sync.bridge import Bridge
from tests.amqp import depth
from tests.integration.intake_support import Running, settled_except
from tests.waiting import wait_for


def _short(text: bytes) -> bytes:
    return bytes((len(text),)) + text


def _long(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


VALUES: dict[str, bytes] = {
    # Integers of every width, the edges included (Java's Long.MAX_VALUE, 8.64e16 ms).
    "long-max": b"l" + struct.pack(">q", 2**63 - 1),
    "long-min": b"l" + struct.pack(">q", -(2**63)),
    "timedelta-edge": b"l" + struct.pack(">q", 86_400_000_000_000_000),
    "u32-max": b"i" + struct.pack(">I", 2**32 - 1),
    "i16": b"s" + struct.pack(">h", -300),
    "u8": b"B" + struct.pack(">B", 255),
    # Strings: 20 digits, not digits, not UTF-8, empty.
    "digits-20": b"S" + _long(b"99999999999999999999"),
    "text": b"S" + _long(b"15s"),
    "not-utf8": b"S" + _long(b"\xff\xfe"),
    "empty": b"S" + _long(b""),
    # Floats: NaN and infinity (a Java or Node publisher sends them; pika 1.4 cannot read
    # them), a plain double, a single.
    "nan": b"d" + struct.pack(">d", float("nan")),
    "inf": b"d" + struct.pack(">d", float("inf")),
    "float-nan": b"f" + struct.pack(">f", float("nan")),
    "double": b"d" + struct.pack(">d", 1500.5),
    # Decimals at the edges of their scale.
    "decimal-255": b"D" + struct.pack(">Bi", 255, 2**31 - 1),
    "decimal-0": b"D" + struct.pack(">Bi", 0, -(2**31)),
    # Timestamps: the epoch, past the year 9999, the largest.
    "ts-0": b"T" + struct.pack(">Q", 0),
    "ts-far": b"T" + struct.pack(">Q", 2**40),
    "ts-max": b"T" + struct.pack(">Q", 2**64 - 1),
    # Booleans, void, byte arrays, tables, arrays.
    "true": b"t\x01",
    "void": b"V",
    "bytes": b"x" + _long(b"\x00\xff"),
    "table": b"F" + _long(_short(b"ms") + b"I" + struct.pack(">i", 5)),
    "array": b"A" + _long(b"t\x01" + b"d" + struct.pack(">d", float("nan"))),
    # A table inside a header whose key is not UTF-8 (pika reads it as bytes).
    "table-bad-key": b"F" + _long(_short(b"\xff\xfe\xfd") + b"V"),
}


class RawHeaders(pika.BasicProperties):  # type: ignore[misc]
    """pika's properties with the header table written as given bytes."""

    def __init__(self, table: bytes, **kwargs: Any) -> None:
        super().__init__(headers={"placeholder": "p"}, **kwargs)
        self._table = table

    def encode(self) -> list[bytes]:
        stand_in: list[bytes] = []
        pika.data.encode_table(stand_in, {"placeholder": "p"})
        encoded = b"".join(super().encode())
        stand = b"".join(stand_in)
        assert encoded.count(stand) == 1
        return [encoded.replace(stand, _long(self._table))]


def _pair(key: bytes, value: bytes) -> bytes:
    return _short(key) + value


def _poison() -> list[tuple[str, bytes]]:
    """(name, raw table): each value as ``x-delay``, and as another header beside a good
    ``x-delay``; a key that is not UTF-8 too."""
    found = [(f"x-delay={name}", _pair(b"x-delay", raw)) for name, raw in VALUES.items()]
    found += [
        (f"other={name}", _pair(b"x-delay", b"I" + struct.pack(">i", 1000)) + _pair(b"o", raw))
        for name, raw in VALUES.items()
    ]
    found.append(("key-not-utf8", _pair(b"\xff", b"t\x01")))
    return found


def _dlq_bodies(url: str, queue: str) -> list[bytes]:
    """The bodies in ``queue``, read by a connection that tolerates any header."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    tolerate_unreadable_headers(connection)
    bodies = []
    try:
        channel = connection.channel()
        while True:
            method, props, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return bodies
            bodies.append(body)
            assert props is not None and (unreadable(props) or props.headers is not None)
    finally:
        connection.close()


@pytest.mark.slow
def test_no_header_value_stops_the_bridge_and_the_good_messages_around_it_arrive_once(
    rabbitmq_url: str, make_topology: Any, collect: Any
) -> None:
    probe = make_topology()
    ns = probe.namespace
    topology = make_topology(
        ladder=["1s", "2s"],
        destinations=[{"queue": f"{ns}x.work", "bindings": ["job.a"]}],
        intakes=[{"exchange": f"plugin-{ns}", "type": "direct", "delivery_limit": 2}],
    )
    apply_topology(topology, rabbitmq_url)
    intake = topology.intakes[0]
    arrived = collect(topology.destinations[0].queue)
    running = Running(Bridge(rabbitmq_url, topology, prefetch=100))
    poison = _poison()
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    sent_ms: dict[str, float] = {}
    refused: list[str] = []
    try:
        channel = connection.channel()
        channel.confirm_delivery()

        def good(n: int) -> None:
            sent_ms[f"g-{n}"] = time.time() * 1000
            channel.basic_publish(
                intake.exchange, "job.a", b"good",
                pika.BasicProperties(message_id=f"g-{n}", headers={"x-delay": (n % 3) * 500}),
            )  # fmt: skip

        for n in range(500):
            good(n)
        for name, table in poison:
            try:
                channel.basic_publish(
                    intake.exchange, "job.a", f"poison {name}".encode(), RawHeaders(table)
                )
            except pika.exceptions.AMQPError:  # the broker refused it: never entered
                refused.append(name)
                connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
                channel = connection.channel()
                channel.confirm_delivery()
        for n in range(500, 1000):
            good(n)
    finally:
        if connection.is_open:
            connection.close()
    expected = {f"poison {name}".encode() for name, _t in poison if name not in refused}
    dlq = intake.dlq_name(topology.namespace)

    def others() -> int:  # poison that reached the queue or the DLQ
        return sum(a.body != b"good" for a in arrived.arrivals) + depth(rabbitmq_url, dlq)

    try:
        wait_for(
            lambda: sum(a.body == b"good" for a in arrived.arrivals) >= 1000
            and others() >= len(expected),
            120,
            lambda: f"{len(arrived.arrivals)} arrivals, {others()} of {len(expected)} poison",
        )
        got = settled_except(arrived, rabbitmq_url, topology, dlq)
        goods = [a for a in got if a.body == b"good"]
        counts = Counter(a.message_id for a in goods)
        assert set(counts) == set(sent_ms) and set(counts.values()) == {1}
        for a in goods:
            assert a.at_ms >= sent_ms[a.message_id] + int(a.headers["delayq-delay-ms"])
        assert running.thread.is_alive() and not running.error
        assert running.bridge.stats.reconnects == 0
    finally:
        running.stop()
    # Those the bridge scheduled went on (a readable, in-range x-delay beside a header
    # it could write again); every other one is in the DLQ, once.
    forwarded = {a.body for a in got if a.body != b"good"}
    parked = _dlq_bodies(rabbitmq_url, dlq)
    assert Counter(parked + list(forwarded)) == Counter(expected), (refused, forwarded)
    # What a Long.MAX_VALUE or 20 digits ask for is parked, not forwarded.
    for name in ("long-max", "digits-20", "timedelta-edge", "nan", "text"):
        if f"x-delay={name}" not in refused:  # RabbitMQ 3.10.8 refuses a NaN (541)
            assert f"poison x-delay={name}".encode() in parked
