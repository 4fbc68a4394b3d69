"""pika connections for the sync adapter (what their errors mean: :mod:`delayq.sync._errors`)."""

from __future__ import annotations

import datetime
import functools
import random
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pika
from pika import frame as pika_frame

from delayq.errors import ConnectionFailed
from delayq.message.decoding import PROPERTY_NAMES, basic_properties
from delayq.retrying import CONNECT_BACKOFF_S, Tries
from delayq.sync._errors import CONNECTION_ERRORS, connect_error
from delayq.sync._headers import pika_table
from delayq.urls import BrokerURL, hosts_in_turn, parse_url, redact, tried_hosts

__all__ = [
    "close_quietly",
    "coalesce_writes",
    "connect",
    "frames_writer",
    "host_parameters",
    "parameters",
    "read_content_headers",
]

BLOCKED_CONNECTION_TIMEOUT_S = 30
"""How long a publish waits while the broker blocks publishers (memory or disk alarm)."""


def parameters(
    url: str, *, name: str, blocked_timeout_s: float = BLOCKED_CONNECTION_TIMEOUT_S
) -> pika.URLParameters:
    """pika parameters for ``url`` (TLS options applied), with delayq's defaults."""
    return _parameters(parse_url(url), url, name, blocked_timeout_s)


def _parameters(
    broker: BrokerURL,
    url: str,
    name: str,
    blocked_timeout_s: float = BLOCKED_CONNECTION_TIMEOUT_S,
) -> pika.URLParameters:
    try:
        params = pika.URLParameters(broker.client_url)
    except Exception as exc:  # pika raises ValueError, TypeError, KeyError on bad URLs
        raise ConnectionFailed(
            f"cannot use broker URL {redact(url)}: {type(exc).__name__}"
        ) from None
    if broker.tls is not None:
        params.ssl_options = pika.SSLOptions(
            broker.tls.context(), server_hostname=broker.tls.server_hostname or broker.host
        )
    params.blocked_connection_timeout = blocked_timeout_s
    params.client_properties = {"connection_name": name, "product": "delayq"}
    return params


def host_parameters(
    url: str,
    *,
    name: str,
    blocked_timeout_s: float = BLOCKED_CONNECTION_TIMEOUT_S,
    rng: random.Random | None = None,
) -> list[pika.URLParameters]:
    """pika parameters for each host of ``url``, from a random start."""
    parse_url(url)
    return [
        parameters(one, name=name, blocked_timeout_s=blocked_timeout_s)
        for one in hosts_in_turn(url, rng)
    ]


def connect(
    url: str,
    *,
    name: str = "delayq",
    attempts: int = 3,
    backoff_s: float = CONNECT_BACKOFF_S,
    within_s: float | None = None,
    blocked_timeout_s: float = BLOCKED_CONNECTION_TIMEOUT_S,
    rng: random.Random | None = None,
) -> pika.BlockingConnection:
    """Open a blocking connection, retrying ``attempts`` times with doubling back-off
    (or, given ``within_s``, for that many seconds: :class:`delayq.retrying.Tries`).

    A TLS failure (an untrusted certificate, a client certificate the broker
    wants) is not retried: it raises :class:`ConnectionFailed` saying what failed.
    Each round tries every host of ``url`` once, from a random start
    (:func:`delayq.urls.connection_plan`).
    """
    broker = parse_url(url)
    last: BaseException | None = None
    tries = Tries(url, attempts=attempts, backoff_s=backoff_s, within_s=within_s, rng=rng)
    for pause_s, one in tries:
        if pause_s:
            time.sleep(pause_s)
        broker = parse_url(one)
        try:
            connection = pika.BlockingConnection(_parameters(broker, one, name, blocked_timeout_s))
        except CONNECTION_ERRORS as exc:
            failure = connect_error(exc, url, broker)
            if failure is not None:
                raise failure from exc
            last = exc
        else:
            coalesce_writes(connection)
            return connection
    raise ConnectionFailed(
        f"cannot connect to the broker at {redact(url)} {tries.spent()}"
        f"{tried_hosts(url)} ({type(last).__name__}); {broker.unreachable_hint(last)}"
    ) from last


COALESCE_MAX_BYTES = 256 * 1024
"""The most one send joins of the frames a connection has queued."""


def coalesce_writes(connection: Any) -> None:
    """Have ``connection`` (pika's blocking or select connection) send the frames it has
    queued together, a ``send`` for each :data:`COALESCE_MAX_BYTES` or so, not one each.

    pika queues each frame as a chunk of its own and sends them chunk by chunk: a
    published message is three system calls (method, header, body), an ack one. Joining the chunks
    queued when the socket turns writable keeps their order and bytes (a partial send
    leaves the rest at the head, as pika does). ``bench/bridge.py`` measured it
    (3.10.8, 20,000 messages): a raw pika relay went from 34 to 24 µs of CPU per
    message and from 20,703 to 26,968 msg/s with the same change applied to it.

    Applied to plain TCP connections only: a TLS write that must be repeated has to be
    repeated with the same bytes, which a join could change. A pika whose transport
    lacks these internals is left as it is."""
    transport = getattr(getattr(connection, "_impl", connection), "_transport", None)
    buffers = getattr(transport, "_tx_buffers", None)
    produce = getattr(transport, "_produce", None)
    if (
        transport is None
        or type(transport).__name__ != "_AsyncPlaintextTransport"
        or not isinstance(buffers, deque)
        or produce is None
    ):
        return

    def produce_joined() -> None:
        if len(buffers) > 1:
            joined: list[bytes] = []
            parts: list[bytes] = []
            size = 0
            for chunk in buffers:
                parts.append(chunk)
                size += len(chunk)
                if size >= COALESCE_MAX_BYTES:
                    joined.append(b"".join(parts))
                    parts, size = [], 0
            if parts:
                joined.append(b"".join(parts))
            buffers.clear()
            buffers.extend(joined)
        produce()

    transport._produce = produce_joined


def frames_writer(channel: Any) -> Callable[[bytes], None] | None:
    """A function that sends frames delayq encoded itself (:mod:`delayq.message.frames`)
    on ``channel`` (a channel of pika's select connection), as ``basic_publish`` sends
    the frames pika encodes: refused (pika's own error) unless the channel is open, queued
    on the connection in order with everything else sent on it. ``None`` for a pika
    without these internals (its ``basic_publish`` is used then).

    pika's ``basic_publish`` costs about 12 µs a message (its property and table
    encoders, a frame object each); delayq's encoder about 3."""
    connection: Any = getattr(channel, "connection", None)
    output = getattr(connection, "_output_marshaled_frames", None)
    refuse = getattr(channel, "_raise_if_not_open", None)
    if output is None or refuse is None or not isinstance(channel.channel_number, int):
        return None

    def write(frames: bytes) -> None:
        if not channel.is_open:
            refuse()
        if connection.is_closed:
            raise pika.exceptions.ConnectionWrongStateError(
                "Attempted to send a frame on closed connection."
            )
        output((frames,))

    return write


_HEADER_FRAME = 2
_FRAME_END = 0xCE
_FRAME = struct.Struct(">HI").unpack_from  # after the type: channel, payload size
_CONTENT = struct.Struct(">HHQ").unpack_from  # class, weight, body size


def read_content_headers(connection: Any) -> bool:
    """Have ``connection`` (pika's blocking connection) read each Basic content header
    with delayq's decoder (:func:`delayq.message.decoding.basic_properties`, the headers
    by :func:`delayq.sync._headers.pika_table`) into the ``pika.BasicProperties`` its
    consumers get, with the values and types pika's own decoding gives; every other
    frame, and any header that decoder leaves to pika (a float, a decimal, a string or
    key that is not UTF-8, a frame cut short), is read by pika as before. ``False`` for a
    pika without these internals (left as it is).

    pika's header decoding costs about 7 µs a delivery of delayq's headers, 18 for one a
    tier dead-lettered; delayq's about 4 and 8 (``bench/consume_path.py``)."""
    impl = getattr(connection, "_impl", None)
    if impl is None or not isinstance(getattr(impl, "_frame_buffer", None), bytes):
        return False
    if not callable(getattr(impl, "_read_frame", None)) or not reads_as_pika():
        return False

    def read_frame() -> tuple[int, Any]:
        data: bytes = impl._frame_buffer
        if data and data[0] == _HEADER_FRAME:
            read = _content_header(data)
            if read is not None:
                return read
        decoded: tuple[int, Any] = pika_frame.decode_frame(data)
        return decoded

    impl._read_frame = read_frame
    return True


@functools.cache
def reads_as_pika() -> bool:
    """Whether delayq's reader gives what this pika's own decoding gives, value and type,
    for a header of every type it reads (pika 1.3 read timestamps as naive datetimes,
    1.4 as aware ones): checked once, on a sample."""
    when = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    headers = {
        "s": "text ü", "small": -5, "int": 70_000, "wide": 2**40, "flag": True,
        "none": None, "when": when, "raw": b"\x00\xff", "list": [1, "a", {"b": [2**33]}],
        "x-death": [{"count": 1, "reason": "expired", "time": when, "routing-keys": ["k"]}],
    }  # fmt: skip
    properties = pika.BasicProperties(
        content_type="application/json", headers=headers, delivery_mode=2, priority=0,
        message_id="m", timestamp=1_900_000_000, app_id="app",
    )  # fmt: skip
    try:
        data = pika_frame.Header(1, 5, properties).marshal()
        ours, theirs = _content_header(data), pika_frame.decode_frame(data)
    except Exception:  # a pika that cannot marshal this: keep its own reading
        return False
    if ours is None or ours[0] != theirs[0]:
        return False
    return all(
        _same(getattr(ours[1].properties, name), getattr(theirs[1].properties, name))
        for name in PROPERTY_NAMES
    )


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _content_header(data: bytes) -> tuple[int, pika_frame.Header] | None:
    """The Basic content header frame at the head of ``data`` and its length, or ``None``
    for pika to read (or refuse) it: incomplete, another class, or what delayq's decoder
    refuses."""
    if len(data) < 7:
        return None
    channel, size = _FRAME(data, 1)
    end = 7 + size
    if len(data) <= end or data[end] != _FRAME_END or size < 14:
        return None
    class_id, _, body_size = _CONTENT(data, 7)
    if class_id != 60:
        return None
    try:
        found = basic_properties(data, 19, end, pika_table)
    except ValueError:
        return None
    return end + 1, pika_frame.Header(channel, body_size, pika.BasicProperties(**found))


def close_quietly(thing: Any) -> None:
    """Close a channel or connection, ignoring that it may be closed already."""
    try:
        if thing is not None and thing.is_open:
            thing.close()
    except Exception:
        pass
