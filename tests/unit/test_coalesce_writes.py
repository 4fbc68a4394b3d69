"""pika's transport sends each queued frame with a ``send`` of its own (three per
published message); :func:`delayq.sync._connection.coalesce_writes` has delayq's
connections join what is queued into one, up to ``COALESCE_MAX_BYTES``, in order,
on plain TCP only. A stand-in transport records what each send got."""

from __future__ import annotations

from collections import deque
from typing import Any

from delayq.sync import _connection
from delayq.sync._connection import COALESCE_MAX_BYTES, coalesce_writes


class _AsyncPlaintextTransport:
    """Named as pika's plain-TCP transport; sends at most ``per_send`` bytes a call."""

    def __init__(self, per_send: int = 1 << 30) -> None:
        self._tx_buffers: deque[bytes] = deque()
        self.sent: list[bytes] = []
        self.per_send = per_send

    def _produce(self) -> None:  # pika's loop: chunk by chunk, a partial send requeued
        while self._tx_buffers:
            chunk = self._tx_buffers.popleft()
            n = min(len(chunk), self.per_send)
            self.sent.append(chunk[:n])
            if n < len(chunk):
                self._tx_buffers.appendleft(chunk[n:])
                return


class _AsyncSSLTransport(_AsyncPlaintextTransport):
    pass


class Connection:
    def __init__(self, transport: Any) -> None:
        self._impl = type("Impl", (), {"_transport": transport})()


def test_the_queued_frames_go_out_in_one_send_in_their_order() -> None:
    transport = _AsyncPlaintextTransport()
    coalesce_writes(Connection(transport))
    transport._tx_buffers.extend([b"method", b"header", b"body"])
    transport._produce()
    assert transport.sent == [b"methodheaderbody"]


def test_a_join_stops_at_its_bound_and_the_rest_follows_in_order() -> None:
    transport = _AsyncPlaintextTransport()
    coalesce_writes(Connection(transport))
    big = b"x" * (COALESCE_MAX_BYTES // 2)
    transport._tx_buffers.extend([big, big, b"tail", b"end"])
    transport._produce()
    assert [len(s) for s in transport.sent] == [COALESCE_MAX_BYTES, 7]  # two sends, not four
    assert b"".join(transport.sent) == big + big + b"tailend"


def test_a_partial_send_leaves_the_rest_at_the_head_for_the_next_one() -> None:
    transport = _AsyncPlaintextTransport(per_send=5)
    coalesce_writes(Connection(transport))
    transport._tx_buffers.extend([b"abc", b"defg"])
    transport._produce()
    transport._tx_buffers.append(b"hi")
    transport._produce()
    assert transport.sent == [b"abcde", b"fghi"]


def test_tls_and_unknown_transports_are_left_as_pika_made_them() -> None:
    tls = _AsyncSSLTransport()
    coalesce_writes(Connection(tls))
    tls._tx_buffers.extend([b"a", b"b"])
    tls._produce()
    assert tls.sent == [b"a", b"b"]  # a repeated TLS write needs the same bytes
    coalesce_writes(Connection(None))
    coalesce_writes(object())  # no _impl, no transport: nothing to do


def test_a_blocking_connection_of_delayq_is_coalesced(monkeypatch: Any) -> None:
    """``connect`` applies it to the connection it opens (pika faked: no broker here)."""
    transport = _AsyncPlaintextTransport()
    monkeypatch.setattr(
        _connection.pika, "BlockingConnection", lambda params: Connection(transport)
    )
    _connection.connect("amqp://guest:guest@127.0.0.1:5672/", attempts=1)
    transport._tx_buffers.extend([b"a", b"b"])
    transport._produce()
    assert transport.sent == [b"ab"]
