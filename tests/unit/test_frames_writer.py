"""``delayq.sync._connection.frames_writer``: delayq's own publish frames on a pika
channel, refused as pika's ``basic_publish`` refuses them, in order with pika's frames."""

from __future__ import annotations

from typing import Any

import pika.exceptions
import pytest

from delayq.sync._connection import frames_writer


class FakeConnection:
    def __init__(self) -> None:
        self.is_closed = False
        self.sent: list[bytes] = []

    def _output_marshaled_frames(self, frames: Any) -> None:
        self.sent.extend(frames)


class FakeChannel:
    channel_number = 3

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.is_open = True

    def _raise_if_not_open(self) -> None:
        raise pika.exceptions.ChannelWrongStateError("Channel is closed.")


def test_frames_go_to_the_connection_in_order() -> None:
    connection = FakeConnection()
    write = frames_writer(FakeChannel(connection))
    assert write is not None
    write(b"one")
    write(b"two")
    assert connection.sent == [b"one", b"two"]


def test_a_closed_channel_refuses_as_basic_publish_does_and_sends_nothing() -> None:
    connection = FakeConnection()
    channel = FakeChannel(connection)
    write = frames_writer(channel)
    assert write is not None
    channel.is_open = False
    with pytest.raises(pika.exceptions.ChannelWrongStateError):
        write(b"frames")
    assert connection.sent == []


def test_a_closed_connection_refuses_and_sends_nothing() -> None:
    connection = FakeConnection()
    write = frames_writer(FakeChannel(connection))
    assert write is not None
    connection.is_closed = True
    with pytest.raises(pika.exceptions.ConnectionWrongStateError):
        write(b"frames")
    assert connection.sent == []


def test_a_pika_without_the_internals_gets_no_writer() -> None:
    class Bare:
        channel_number = 1
        connection = object()

    assert frames_writer(Bare()) is None


def test_pikas_own_channel_and_connection_have_what_the_writer_uses() -> None:
    # pika's classes, not fakes: a pika release that renames them leaves delayq on
    # basic_publish (frames_writer returns None), and this test says so.
    import pika.channel
    import pika.connection

    assert callable(getattr(pika.connection.Connection, "_output_marshaled_frames", None))
    assert callable(getattr(pika.channel.Channel, "_raise_if_not_open", None))
